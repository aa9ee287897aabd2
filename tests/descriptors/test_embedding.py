"""Embedding descriptors: the real model's geometry and long texts, the cache, the fit schedule, resume,
CVT cells.

Only the tests marked slow load all-MiniLM-L6-v2; the rest use a fake encoder (a
seeded unit vector per text) so they check this module's logic, not the model.
"""

import asyncio
import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from descriptors.base import Item, is_fitted_kind
from descriptors.embedding import (
    _OVERLAP,
    CACHE_KIND,
    DIM,
    EmbeddingCache,
    EmbeddingDescriptor,
    Encoder,
    _model,
    _windows,
    model_path,
)
from qd.store import Store

PAIRS = [  # (anchor, paraphrase)
    (
        "def sort_numbers(values):\n    return sorted(values)",
        "def order_list(xs):\n    result = list(xs)\n    result.sort()\n    return result",
    ),
    (
        "with open('data.txt') as f:\n    lines = f.read().splitlines()",
        "f = open('data.txt')\nlines = [line.rstrip('\\n') for line in f]\nf.close()",
    ),
    ("The cat is sleeping on the warm windowsill.", "A cat naps on the sunny window ledge."),
]
UNRELATED = [
    "The stock market fell sharply after the central bank raised interest rates.",
    "import socket\ns = socket.socket()\ns.connect(('example.com', 80))\n"
    "s.send(b'GET / HTTP/1.0\\r\\n\\r\\n')",
    "Photosynthesis converts sunlight, water and carbon dioxide into glucose.",
    "class Matrix:\n    def __init__(self, rows):\n        self.rows = rows\n    def transpose(self):\n"
    "        return Matrix(list(zip(*self.rows)))",
    "The orchestra rehearsed the symphony for the premiere next week.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
]
MORE = [  # extra corpus so a PCA has more than a handful of points to find axes in
    "def mean(xs):\n    return sum(xs) / len(xs)",
    "import json\nconfig = json.load(open('config.json'))",
    "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
    "x = [i * i for i in range(100) if i % 3 == 0]",
    "import numpy as np\na = np.zeros((3, 3))\nprint(a.shape)",
    "def reverse(s):\n    return s[::-1]",
    "The mountain trail was closed because of heavy snow.",
    "She ordered a coffee and a croissant at the small cafe.",
    "The committee approved the new budget for public schools.",
    "Volcanoes release ash and gases into the atmosphere.",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = 0",
    "async def fetch(session, url):\n    async with session.get(url) as r:\n        return await r.text()",
]


class FakeEncoder(Encoder):
    """A seeded unit vector per text, and a log of every encode call's texts."""

    def __init__(self):
        super().__init__()
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        rows = [
            np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).standard_normal(DIM)
            for t in texts
        ]
        out = np.array(rows, np.float32).reshape(len(texts), DIM)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def items(n, prefix="program"):
    return [Item(text=f"{prefix} {i}") for i in range(n)]


def run(coro):
    return asyncio.run(coro)


def cosine_distance(a, b):
    return 1.0 - float(a @ b) / float(np.linalg.norm(a) * np.linalg.norm(b))


@pytest.mark.slow
def test_real_model_places_paraphrases_closer_than_unrelated_texts():
    assert (model_path() / "model.safetensors").is_file()
    encoder = Encoder(batch_size=8)
    anchors, paraphrases = zip(*PAIRS)
    emb = encoder.encode([*anchors, *paraphrases, *UNRELATED])
    assert emb.shape == (len(PAIRS) * 2 + len(UNRELATED), DIM) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    a, p, u = emb[: len(PAIRS)], emb[len(PAIRS) : 2 * len(PAIRS)], emb[2 * len(PAIRS) :]
    for i in range(len(PAIRS)):
        others = [cosine_distance(a[i], x) for x in (*u, *np.delete(p, i, axis=0))]
        assert cosine_distance(a[i], p[i]) < min(others), (PAIRS[i], others)

    corpus = [*anchors, *paraphrases, *UNRELATED, *MORE]
    desc = EmbeddingDescriptor(projection="pca", dims=4, refit_at=(len(corpus),), encoder=encoder)
    run(desc.fit([Item(text=t) for t in corpus], np.random.default_rng(0)))
    out = run(desc.describe([Item(text=t) for t in corpus]))
    assert out.valid.all() and np.all((out.values >= 0) & (out.values <= 1))
    z = out.values
    za, zp, zu = z[: len(PAIRS)], z[len(PAIRS) : 2 * len(PAIRS)], z[2 * len(PAIRS) :]
    for i in range(len(PAIRS)):
        unrelated = [np.linalg.norm(za[i] - x) for x in zu]
        assert np.linalg.norm(za[i] - zp[i]) < np.median(unrelated), (PAIRS[i], unrelated)


# A function_fit-style program of 353 word pieces; EDITED changes one constant in its last line.
LONG = (
    'import math\n\n\ndef f(x):\n    """A piecewise fit: one polynomial per interval of x."""\n'
    + "".join(
        f"    if x < {-3.0 + 0.25 * i:.2f}:\n"
        f"        return {0.1 * i:.1f} * x * x + {0.5 - 0.05 * i:.2f} * x + {2.0 + 0.01 * i:.2f}\n"
        for i in range(1, 13)
    )
    + "    return x * x + 0.5 * x + 2.0\n"
)
EDITED = LONG.replace("+ 2.0\n", "+ 2.5\n")


@pytest.mark.slow
def test_real_model_sees_an_edit_past_the_truncation_and_short_texts_are_unchanged():
    model = _model("cpu")
    assert len(model.tokenizer(LONG, add_special_tokens=False, verbose=False)["input_ids"]) > 300
    assert EDITED != LONG and EDITED[:-12] == LONG[:-12]
    truncated = model.encode([LONG, EDITED], convert_to_numpy=True, normalize_embeddings=True)
    assert float(truncated[0] @ truncated[1]) > 1 - 1e-6  # the model alone cannot tell them apart

    short = [*PAIRS[0], UNRELATED[0]]
    emb = Encoder(batch_size=8).encode([LONG, *short, EDITED])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert float(emb[0] @ emb[-1]) < 1 - 1e-5  # below the novelty gate's float tolerance
    assert float(emb[0] @ emb[-1]) > 0.999  # still the nearest of neighbours
    plain = model.encode(short, batch_size=8, convert_to_numpy=True, normalize_embeddings=True)
    np.testing.assert_allclose(emb[1:-1], plain, atol=1e-6)


def _labelled(word_sizes):
    """A text of words made of labelled pieces ("p0|p1 p2"), with its offsets and word ids."""
    parts, offsets, word_ids, at, k = [], [], [], 0, 0
    for w, n in enumerate(word_sizes):
        for j in range(n):
            piece = f"{'|' if j else ' ' if parts else ''}p{k}"
            parts.append(piece)
            offsets.append((at + len(piece) - len(f"p{k}"), at + len(piece)))
            word_ids.append(w)
            at += len(piece)
            k += 1
    return "".join(parts), offsets, word_ids


@settings(max_examples=60, deadline=None)
@given(word_sizes=st.lists(st.integers(1, 12), min_size=1, max_size=120), size=st.integers(40, 100))
def test_windows_cover_the_text_at_word_starts_with_bounded_overlap(word_sizes, size):
    text, offsets, word_ids = _labelled(word_sizes)
    windows = _windows(text, offsets, word_ids, size)
    pieces = [[int(p[1:]) for p in w.replace("|", " ").split()] for w, _ in windows]
    n = len(offsets)
    if n <= size:
        assert windows == [(text, n)]
        return
    assert pieces[0][0] == 0 and pieces[-1][-1] == n - 1
    word_starts = {k for k in range(n) if k == 0 or word_ids[k] != word_ids[k - 1]} | {n}
    for (w, count), ks in zip(windows, pieces):
        assert (
            ks == list(range(ks[0], ks[-1] + 1)) and count == len(ks) <= size
        )  # contiguous, within the limit
        assert ks[0] in word_starts and ks[-1] + 1 in word_starts  # whole words only
    for a, b in zip(pieces, pieces[1:]):
        assert a[0] < b[0] <= a[-1] + 1 and a[-1] + 1 - b[0] <= _OVERLAP  # no gap, overlap at most _OVERLAP


def test_a_word_longer_than_a_window_is_cut_inside_it():
    text, offsets, word_ids = _labelled([3, 130, 2])
    windows = _windows(text, offsets, word_ids, 50)
    pieces = [[int(p[1:]) for p in w.replace("|", " ").split()] for w, _ in windows]
    assert all(count == len(ks) <= 50 for (_, count), ks in zip(windows, pieces))
    assert sorted({k for ks in pieces for k in ks}) == list(range(135))


def test_cache_encodes_each_text_once_and_survives_reopening_the_store(tmp_path):
    encoder = FakeEncoder()
    store = Store(tmp_path / "s.sqlite")
    cache = EmbeddingCache(encoder, store.cache)
    texts = ["b", "a", "b", "c", "a"]
    first = run(cache.embed(texts))
    assert encoder.calls == [["b", "a", "c"]]  # misses only, deduplicated
    np.testing.assert_array_equal(first[0], first[2])
    assert set(store.cache.get(CACHE_KIND, [hashlib.sha256(t.encode()).hexdigest() for t in "abc"])) == {
        hashlib.sha256(t.encode()).hexdigest() for t in "abc"
    }

    lookups = []
    store_get = store.cache.get
    store.cache.get = lambda kind, keys: lookups.append(keys) or store_get(kind, keys)
    np.testing.assert_array_equal(run(cache.embed(texts)), first)
    assert len(encoder.calls) == 1 and lookups == []  # in memory: no encoder call, no SQLite round trip
    store.close()

    fresh = FakeEncoder()
    with Store(tmp_path / "s.sqlite") as reopened:
        desc = EmbeddingDescriptor(projection="none", refit_at=(), encoder=fresh)
        desc.attach(reopened.ports())
        out = run(desc.describe([Item(text=t) for t in texts]))
    assert fresh.calls == []
    np.testing.assert_array_equal(out.values, first)


def test_descriptor_encodes_nothing_on_a_second_describe():
    encoder = FakeEncoder()
    desc = EmbeddingDescriptor(refit_at=(8,), encoder=encoder)
    batch = items(10)
    run(desc.fit(batch, np.random.default_rng(0)))
    first = run(desc.describe(batch))
    second = run(desc.describe(batch))
    assert len(encoder.calls) == 1
    np.testing.assert_array_equal(first.values, second.values)


def test_schedule_pending_fit_frozen_refit():
    desc = EmbeddingDescriptor(refit_at=(64, 8), encoder=FakeEncoder())
    assert is_fitted_kind(desc) and desc.dim == 2 and desc.lower == (0, 0) and desc.upper == (1, 1)
    out = run(desc.describe(items(3)))
    assert out.valid.all() and np.isnan(out.values).all() and out.values.shape == (3, 2)
    assert not desc.needs_fit(7) and desc.needs_fit(8)

    run(desc.fit(items(8), np.random.default_rng(0)))
    assert not desc.needs_fit(8) and not desc.needs_fit(63) and desc.needs_fit(64)
    frozen = run(desc.describe(items(8)))
    assert np.all((frozen.values >= 0) & (frozen.values <= 1))
    assert np.all(frozen.values.min(axis=0) > 0) and np.all(frozen.values.max(axis=0) < 1)  # margin
    run(desc.describe(items(40, "other")))  # describing more changes nothing until the refit
    np.testing.assert_array_equal(run(desc.describe(items(8))).values, frozen.values)

    run(desc.fit(items(64), np.random.default_rng(0)))
    assert not desc.needs_fit(10_000)
    assert not np.array_equal(run(desc.describe(items(8))).values, frozen.values)


def test_a_late_fit_consumes_every_passed_refit_point():
    desc = EmbeddingDescriptor(refit_at=(8, 64, 256), encoder=FakeEncoder())
    run(desc.fit(items(100), np.random.default_rng(0)))
    assert not desc.needs_fit(100) and desc.needs_fit(256)


def test_empty_text_is_invalid_with_a_reason():
    desc = EmbeddingDescriptor(projection="none", refit_at=(), encoder=FakeEncoder())
    out = run(desc.describe([Item(text="x = 1"), Item(text=""), Item(text="  \n"), Item(text=None)]))
    assert out.valid.tolist() == [True, False, False, False]
    assert out.error[0] is None and all("no text" in e for e in out.error[1:])
    assert np.isfinite(out.values[0]).all() and np.isnan(out.values[1:]).all()


@pytest.mark.parametrize("projection", ["pca", "random", "none"])
def test_state_dict_resume_gives_bitwise_equal_descriptors(projection, tmp_path):
    store = Store(tmp_path / "s.sqlite")
    desc = EmbeddingDescriptor(projection=projection, dims=3, refit_at=(8,), cells=16, encoder=FakeEncoder())
    desc.attach(store.ports())
    run(desc.fit(items(12), np.random.default_rng(1)))
    probe = items(12) + items(5, "new")
    before = run(desc.describe(probe))
    state = desc.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values()) and int(state["fits"]) == 1

    resumed = EmbeddingDescriptor(
        projection=projection, dims=3, refit_at=(8,), cells=16, encoder=FakeEncoder()
    )
    resumed.attach(store.ports())
    resumed.load_state_dict({k: v.copy() for k, v in state.items()})
    after = run(resumed.describe(probe))
    assert after.values.tobytes() == before.values.tobytes()
    assert not resumed.needs_fit(100)

    refit = EmbeddingDescriptor(projection=projection, dims=3, refit_at=(8,), cells=16, encoder=FakeEncoder())
    run(refit.fit(items(12)[::-1], np.random.default_rng(99)))  # other rng, other order: same fit
    for k, v in refit.state_dict().items():
        np.testing.assert_allclose(v, state[k], atol=1e-12)


def test_default_descriptor_loads_a_default_state():
    desc = EmbeddingDescriptor(encoder=FakeEncoder())
    run(desc.fit(items(8), np.random.default_rng(0)))
    fresh = EmbeddingDescriptor(encoder=FakeEncoder())
    fresh.load_state_dict(desc.state_dict())
    assert run(fresh.describe(items(8))).values.tobytes() == run(desc.describe(items(8))).values.tobytes()
    with pytest.raises(ValueError, match="embedding.state"):
        EmbeddingDescriptor(dims=3, encoder=FakeEncoder()).load_state_dict(desc.state_dict())


def test_random_projection_is_fixed_orthonormal_and_only_bounds_depend_on_data():
    a = EmbeddingDescriptor(projection="random", dims=4, seed=7, encoder=FakeEncoder())
    b = EmbeddingDescriptor(projection="random", dims=4, seed=7, encoder=FakeEncoder())
    run(a.fit(items(8), np.random.default_rng(0)))
    run(b.fit(items(20, "other"), np.random.default_rng(0)))
    m = a.state_dict()["matrix"]
    np.testing.assert_array_equal(m, b.state_dict()["matrix"])
    np.testing.assert_allclose(m @ m.T, np.eye(4), atol=1e-12)
    assert not np.array_equal(a.state_dict()["low"], b.state_dict()["low"])


@pytest.mark.parametrize("num_items", [5, 40])
def test_none_mode_fits_unit_centroids_and_every_embedding_has_a_cell(num_items):
    cells = 16
    desc = EmbeddingDescriptor(projection="none", refit_at=(4,), cells=cells, encoder=FakeEncoder())
    assert desc.dim == DIM and desc.lower == (-1.0,) * DIM and desc.upper == (1.0,) * DIM
    assert desc.cell_spec() is None
    batch = items(num_items)
    run(desc.fit(batch, np.random.default_rng(0)))
    spec = desc.cell_spec()
    centroids = np.asarray(spec.centroids)
    assert centroids.shape == (cells, DIM) and spec.num_cells == cells
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-5)
    assert len(np.unique(centroids, axis=0)) == cells

    out = run(desc.describe(batch + items(30, "unseen")))
    assert out.valid.all() and np.isfinite(out.values).all()
    np.testing.assert_allclose(np.linalg.norm(out.values, axis=1), 1.0, atol=1e-5)
    # Brute-force nearest centroid (what spec.index computes): its XLA compile at D=384 takes minutes.
    dist = np.linalg.norm(out.values[:, None].astype(np.float64) - centroids[None], axis=2)
    cell = np.argmin(dist, axis=1)
    assert cell.shape == (num_items + 30,) and np.all((cell >= 0) & (cell < cells))
    # The cells cover the data: with fewer points than cells each point is a centroid itself.
    assert len(np.unique(cell[:num_items])) == min(num_items, cells)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="projection"):
        EmbeddingDescriptor(projection="umap", encoder=FakeEncoder())
    with pytest.raises(ValueError, match="refit_at"):
        EmbeddingDescriptor(projection="pca", refit_at=(), encoder=FakeEncoder())


def test_reference_corpus_fits_once_and_freezes(tmp_path):
    from descriptors.embedding import load_reference

    corpus = tmp_path / "corpus.jsonl"
    reference = [f"reference text {i}" for i in range(12)]
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in reference))
    assert load_reference(corpus) == reference
    desc = EmbeddingDescriptor(encoder=FakeEncoder(), reference=reference)
    assert desc.needs_fit(0)  # fitted before any candidate is placed
    run(desc.fit(items(3, "cand"), np.random.default_rng(0)))
    assert not desc.needs_fit(10_000)  # frozen: no refits
    again = EmbeddingDescriptor(encoder=FakeEncoder(), reference=reference)
    run(again.fit(items(5, "other"), np.random.default_rng(1)))
    probe = items(4, "probe")
    np.testing.assert_array_equal(run(desc.describe(probe)).values, run(again.describe(probe)).values)
    with pytest.raises(ValueError, match="reference"):
        load_reference(tmp_path / "missing.jsonl")
