"""Before evaluation: exact duplicates reuse a stored evaluation; near duplicates are rejected.

Two checks, cheapest first, both keyed on the child's text:

1. ``DuplicateIndex``: a text evaluated before (sha256 in the store's cache table,
   kind ``evaluated``) is never evaluated again; the child copies that evaluation
   (``reuse``). Within one batch the first occurrence is evaluated and later ones
   copy it (``Duplicates.earlier``).
2. ``NoveltyGate`` (ShinkaEvolve-style): a child whose embedding is too close to
   one of its island's elites or its own parents is rejected unevaluated; the
   loop stores it as an invalid candidate (``rejected``) and may ask the
   operator again ``resample`` times. With ``measure="bleu"`` closeness is the
   child's sentence BLEU against the other text instead (Rainbow Teaming's
   filter for prompts: word overlap, no model).

Choosing the threshold (all-MiniLM-L6-v2, cosine of an edit to the original):

====================================================  ===============
``def f(x): return 2*x*x + 3*x + 1`` (20 word pieces)
whitespace, blank lines, letter case, indentation      1.0000
comment added                                          0.71 - 0.91
variable renamed / temporary variable                  0.80 - 0.95
one constant changed                                   0.85 - 0.97
``x*x`` -> ``x*x*x`` / Horner form                     0.997 / 0.981
circle_packing seed (102 word pieces)
comment added / variable renamed                       0.998 / 0.884
one constant changed (20 edits)                        0.994 - 0.9998
197 word pieces: one constant or operator changed      0.9967 - 0.99991
353 word pieces: one constant in the last line         0.99996 (windowed encoding)
====================================================  ===============

The model scores an edit by how many word pieces it changes, not by what it
means: renames and comments fall below real edits, and real edits of a
200-token program come within 1e-4 of 1. So no threshold below 1 separates
trivial edits from real ones, and the default is 1.0: reject only what the
embedder cannot tell apart from an elite or parent (whitespace- or case-only
rewrites). Its one blind spot is rejected with it: a pure re-indentation (the
tokenizer drops whitespace). Texts longer than the model's 256-word-piece window
are embedded window by window (``descriptors.embedding.Encoder``), so an edit at
the end of a long program still counts. Lower thresholds suit an embedder that
measures meaning; with this one they reject genuine variations.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import numpy as np

from qd.contract import Cache, Candidate, ConfigError

CACHE_KIND = "evaluated"
REUSED = "reused"  # artifacts key: the store id whose evaluation a candidate copied
SIMILARITY = "gate_similarity"  # metrics key: the cosine that got a candidate rejected
TRIAL = "trial"  # artifacts key: an agent's trial, run on the first evaluation stage only (never placed)
AGAINST = ("elites", "parents")
_WORDS = re.compile(r"\w+|[^\w\s]")  # BLEU's tokens: words and punctuation marks
# float32 unit vectors of identical inputs can differ by ~1e-7 in their dot product.
_TOLERANCE = 1e-6


def text_key(text: str) -> str:
    """sha256 hex digest of ``text`` (UTF-8; lone surrogates kept)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Duplicates:
    """Which positions of a batch need no evaluation (``j in dup``).

    Attributes:
        stored: position -> store id of the evaluated candidate with the same text.
        earlier: position -> the first position in this batch with the same text
            (only for texts not in the store; that first position is evaluated).
    """

    stored: dict[int, int]
    earlier: dict[int, int]

    def __contains__(self, position: object) -> bool:
        return position in self.stored or position in self.earlier


class DuplicateIndex:
    """Text -> the first evaluated candidate with that text, kept in the run's cache (the
    store's cache table: survives resumes)."""

    def __init__(self, cache: Cache):
        self.cache = cache

    def lookup(self, texts: Sequence[str | None]) -> Duplicates:
        """The positions of ``texts`` already evaluated, in the store or earlier in the batch
        (None: skipped)."""
        keys = {j: text_key(t) for j, t in enumerate(texts) if t is not None}
        found = self.cache.get(CACHE_KIND, list(keys.values()))
        stored, earlier, first = {}, {}, {}
        for j, key in keys.items():
            if key in found:
                stored[j] = int(found[key])
            elif key in first:
                earlier[j] = first[key]
            else:
                first[key] = j
        return Duplicates(stored, earlier)

    def remember(self, candidates: Iterable[Candidate]) -> None:
        """Indexes committed candidates that were evaluated (not reused, not gate-rejected).

        Idempotent, and the first id of a text is kept, so calling it again on the
        rows replayed at a resume is safe.
        """
        new: dict[str, bytes] = {}
        for c in candidates:
            if c.text is None or not evaluated(c):
                continue
            if c.id is None:
                raise ValueError("gate: remember takes committed candidates (id set by store.add)")
            new.setdefault(text_key(c.text), str(int(c.id)).encode())
        known = self.cache.get(CACHE_KIND, list(new))
        if new.keys() - known.keys():
            self.cache.put(CACHE_KIND, {k: v for k, v in new.items() if k not in known})


def evaluated(candidate: Candidate) -> bool:
    """Whether ``candidate``'s evaluation is its own and whole: not copied (``reuse``), not
    gate-rejected, not a trial (one stage)."""
    artifacts = candidate.artifacts or {}
    return REUSED not in artifacts and TRIAL not in artifacts and SIMILARITY not in (candidate.metrics or {})


def reuse(source: Candidate) -> dict[str, Any]:
    """``Candidate`` fields copying ``source``'s evaluation, with ``artifacts[REUSED] = source.id``.

    ``source`` is a stored candidate (``Duplicates.stored``) or an earlier child
    of the same batch (``Duplicates.earlier``); the latter is not committed yet,
    so its id is None: the original is then the nearest lower id with that text.
    """
    return dict(
        fitness=source.fitness,
        descriptor=None if source.descriptor is None else np.array(source.descriptor, np.float32),
        valid=source.valid,
        metrics=None if source.metrics is None else dict(source.metrics),
        error=source.error,
        artifacts={**(source.artifacts or {}), REUSED: source.id},
    )


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """One child's verdict.

    Attributes:
        rejected: the similarity reached the gate's threshold.
        similarity: to the nearest compared text (``measure``: cosine in [-1, 1], or BLEU in
            [0, 1]); NaN if none was compared.
        nearest: ``"parent"`` or ``"elite"`` (a tie goes to the parent); None if none was compared.
        nearest_index: its index in the child's parents or in the elites; -1 if none.
    """

    rejected: bool
    similarity: float
    nearest: str | None
    nearest_index: int
    measure: str = "cosine"


def _ngrams(words: list[str], n: int) -> collections.Counter:
    return collections.Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def bleu(hypothesis: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU of ``hypothesis`` against one ``reference``, in [0, 1].

    Words and punctuation marks are the tokens (lowercased); clipped n-gram
    precisions for n = 1..max_n (n-grams longer than the hypothesis are left
    out), add-one smoothed for n > 1 so one missing 4-gram does not zero a near
    copy (Lin and Och, 2004), geometric mean, times the brevity penalty.
    Rainbow Teaming rejects a mutated prompt at BLEU >= 0.6 to its parent.
    """
    hyp, ref = _WORDS.findall(hypothesis.lower()), _WORDS.findall(reference.lower())
    if not hyp or not ref:
        return 0.0
    logs = []
    for n in range(1, min(max_n, len(hyp)) + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        matched, total = sum(min(c, r[g]) for g, c in h.items()), sum(h.values())
        if n == 1 and matched == 0:
            return 0.0
        logs.append(math.log((matched + (n > 1)) / (total + (n > 1))))
    brevity = min(0.0, 1.0 - len(ref) / len(hyp))
    return float(math.exp(brevity + sum(logs) / len(logs)))


MEASURES = ("embedding", "bleu")


class NoveltyGate:
    """Rejects children too similar to an elite or a parent: by embedding cosine, or by BLEU.

    Args:
        embed: async texts -> f32[N, D] (e.g. ``EmbeddingCache.embed``); rows need
            not be unit length (the gate normalises; a zero row is similar to nothing).
            Unused (may be None) with ``measure="bleu"``.
        threshold: in (0, 1]; rejected iff the similarity >= threshold - 1e-6 (inclusive,
            with a tolerance for float32 rounding, so 1.0 means "the embedder cannot
            tell them apart"). See the module docstring for the default.
        measure: ``"embedding"`` (cosine of the embeddings) or ``"bleu"`` (the child's
            sentence BLEU against the other text: word overlap, for prose such as prompts).
        against: what children are compared with: ``"elites"`` (the island's) and/or
            ``"parents"`` (the child's own).
        resample: how many times the loop may ask the operator again for a rejected
            child (carried here, used by the loop).
    """

    def __init__(
        self,
        embed: Callable[[Sequence[str]], Awaitable[np.ndarray]] | None,
        threshold: float = 1.0,
        against: Sequence[str] = AGAINST,
        resample: int = 0,
        measure: str = "embedding",
    ):
        settings = self.check_settings(threshold, against, resample, measure)
        self.embed = embed
        self.threshold = settings["threshold"]
        self.against = settings["against"]
        self.resample = settings["resample"]
        self.measure = settings["measure"]

    @staticmethod
    def check_settings(
        threshold: float = 1.0,
        against: Sequence[str] = AGAINST,
        resample: int = 0,
        measure: str = "embedding",
    ) -> dict[str, Any]:
        """The gate's settings checked (no embedder needed): the keywords of the constructor.

        Raises:
            ConfigError: naming the field (``threshold``, ``against``, ``resample``, ``measure``);
                the config plan puts it under ``gate``.
        """
        if measure not in MEASURES:
            raise ConfigError(
                "measure", f"{measure!r} is not a similarity measure", f"use one of {list(MEASURES)}"
            )
        if isinstance(threshold, bool) or not (
            isinstance(threshold, (int, float)) and 0.0 < threshold <= 1.0
        ):
            raise ConfigError("threshold", f"{threshold!r} is not in (0, 1]")
        if isinstance(resample, bool) or not isinstance(resample, int) or resample < 0:
            raise ConfigError("resample", f"{resample!r} is not an integer >= 0")
        against = tuple(against)
        if not against or any(a not in AGAINST for a in against):
            raise ConfigError("against", f"{list(against)} must be a non-empty subset of {list(AGAINST)}")
        return {"threshold": float(threshold), "against": against, "resample": resample, "measure": measure}

    async def check(
        self, children: Sequence[str], parents: Sequence[Sequence[str]], elites: Sequence[str]
    ) -> list[GateVerdict]:
        """A verdict per child; ``parents[j]`` are child j's parents' texts, ``elites`` its island's.

        One ``embed`` call for every distinct text involved (none if nothing is compared).
        """
        if len(parents) != len(children):
            raise ValueError(f"gate: {len(children)} children but {len(parents)} parent lists")
        use_parents, use_elites = "parents" in self.against, "elites" in self.against
        texts = list(
            dict.fromkeys(
                [
                    *children,
                    *(t for ps in parents for t in ps if use_parents),
                    *(elites if use_elites else ()),
                ]
            )
        )
        row = {t: i for i, t in enumerate(texts)}
        # Per child: the rows it is compared with, parents first (so a tie names the parent).
        compared = [
            ([row[t] for t in ps] if use_parents else []) + ([row[t] for t in elites] if use_elites else [])
            for ps in parents
        ]
        if not any(compared):
            return [GateVerdict(False, math.nan, None, -1) for _ in children]
        sims = await self._similarities(texts, [row[c] for c in children], compared)  # f64[N, U]
        label = "cosine" if self.measure == "embedding" else "BLEU"
        out = []
        for j, cols in enumerate(compared):
            if not cols:
                out.append(GateVerdict(False, math.nan, None, -1, label))
                continue
            s = np.clip(sims[j, cols], -1.0, 1.0)
            k = int(np.argmax(s))
            n_parents = len(parents[j]) if use_parents else 0
            nearest, index = ("parent", k) if k < n_parents else ("elite", k - n_parents)
            out.append(
                GateVerdict(bool(s[k] >= self.threshold - _TOLERANCE), float(s[k]), nearest, index, label)
            )
        return out

    async def _similarities(
        self, texts: list[str], children: list[int], compared: list[list[int]]
    ) -> np.ndarray:
        """f64[N, U]: child j (row ``children[j]`` of ``texts``) against each text it is compared with."""
        if self.measure == "bleu":
            sims = np.full((len(children), len(texts)), -1.0)
            for j, cols in enumerate(compared):
                sims[j, cols] = [bleu(texts[children[j]], texts[u]) for u in cols]
            return sims
        vectors = np.asarray(await self.embed(texts), np.float64).reshape(len(texts), -1)
        norm = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit = vectors / np.where(norm > 0, norm, 1.0)  # a zero row stays zero: similar to nothing
        return unit[children] @ unit.T


def rejected(verdict: GateVerdict, parent_ids: Sequence[int], elite_ids: Sequence[int]) -> dict[str, Any]:
    """``Candidate`` fields of a gate-rejected child: invalid, unevaluated, with the reason.

    ``parent_ids``/``elite_ids`` are the store ids of the texts ``check`` was given,
    in the same order; ``error`` reads e.g. ``novelty gate: cosine 0.973 to parent #12``
    (or ``BLEU 0.712``).
    """
    ids = parent_ids if verdict.nearest == "parent" else elite_ids
    return dict(
        fitness=math.nan,
        descriptor=None,
        valid=False,
        error=(
            f"novelty gate: {verdict.measure} {verdict.similarity:.3f} to {verdict.nearest} "
            f"#{int(ids[verdict.nearest_index])}"
        ),
        metrics={SIMILARITY: verdict.similarity},
    )
