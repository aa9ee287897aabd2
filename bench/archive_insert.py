#!/usr/bin/env python
"""Archive insert throughput: qd vs pyribs vs QDax, side by side in one process.

For each tessellation (grid 100x100 and 1000x1000 in 2-D; CVT with 10k centroids
in 2-D and 16-D), each batch size (64, 1024, 16384) and 1 or 16 islands, it times
one insert call per system on the same pre-generated candidates (fresh uniform
descriptors inside the bounds and uniform fitness for every call; generating them
is not timed) into an archive pre-filled to a realistic occupancy, and prints a
markdown table of candidates/s (median over repeated calls after warm-up) with the
ratios qd/pyribs and qd/QDax.

* qd: ``qd.archive.cells``; the state is donated and replaced by the returned one;
  the clock stops after ``jax.block_until_ready`` on the new state and the result.
* pyribs: ``GridArchive`` / ``CVTArchive(centroids=...)`` (default scipy k-d tree),
  float32 storage, ``solution_dim=1``.
* QDax: ``MapElitesRepertoire.init_default`` / ``.add`` under ``jax.jit`` with the
  repertoire donated, genotype an f32[1] per candidate; grids use the cell
  centres as centroids (QDax has no grid lookup: its add is brute force over them).
* 16 islands: qd inserts the whole batch in one call with ``island = i % 16``;
  pyribs and QDax need 16 separate archives, so the batch is split by ``i % 16`` and
  each archive gets one add of B/16 candidates; throughput counts all B candidates.

Calls of the systems are interleaved (one call each, round robin) so that the noise
of a shared machine hits them alike. The first call of each configuration is timed
separately ("first call": it includes jit compilation for qd and QDax; QDax
recompiles for every new batch size).

Usage::

    python bench/archive_insert.py            # full run (~10-15 min on 2 cores)
    python bench/archive_insert.py --quick    # smoke check (~1-2 min)
    python bench/archive_insert.py --results bench/RESULTS.md   # also write section
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import importlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _results import write_section  # noqa: E402  (bench/ is on sys.path)

import qd.archive as qa  # noqa: E402

SECTION_TITLE = "## Archive insert throughput (bench/archive_insert.py)"
ISLANDS_MANY = 16
BATCHES = (64, 1024, 16384)


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    kind: str  # "grid" | "cvt"
    dim: int
    lower: np.ndarray
    upper: np.ndarray
    bins: tuple[int, ...] | None = None
    centroids: np.ndarray | None = None  # f32[C, D] for CVT (and QDax on grids)
    prefill: int = 0  # candidates inserted per island before timing
    qdax_batches: tuple[int, ...] = BATCHES  # QDax brute force: skip the hopeless
    qdax_many_islands: bool = True
    short: str = ""

    @property
    def num_cells(self) -> int:
        if self.kind == "grid":
            return math.prod(self.bins)
        return len(self.centroids)


def grid_centres(bins, lower, upper) -> np.ndarray:
    """Cell centres in qd's flat C order (QDax's centroids for a grid)."""
    coords = np.indices(bins).reshape(len(bins), -1).T.astype(np.float64)
    width = (np.asarray(upper) - np.asarray(lower)) / np.asarray(bins)
    return (np.asarray(lower) + (coords + 0.5) * width).astype(np.float32)


def nearest_cells(case: Case, descriptors: np.ndarray) -> np.ndarray:
    """Exact cell of each descriptor (used only to pre-fill QDax, untimed)."""
    if case.kind == "grid":
        bins = np.asarray(case.bins)
        scaled = (bins * (descriptors - case.lower) + 1e-6) / (case.upper - case.lower)
        coords = np.clip(scaled, 0, bins - 1).astype(np.int64)
        return np.ravel_multi_index(coords.T, case.bins)
    from scipy.spatial import cKDTree

    return cKDTree(case.centroids.astype(np.float64)).query(descriptors)[1]


def best_per_cell(cells, descriptors, fitness, ids, num_cells):
    """The MAP-Elites elites of a set of candidates: f32[C], f32[C,D], i32[C]."""
    order = np.lexsort((-fitness, cells))  # by cell, best fitness first
    cells_sorted = cells[order]
    first = np.ones(len(order), bool)
    first[1:] = cells_sorted[1:] != cells_sorted[:-1]
    pick = order[first]
    fit = np.full(num_cells, -np.inf, np.float32)
    desc = np.zeros((num_cells, descriptors.shape[1]), np.float32)
    gid = np.full(num_cells, -1, np.int32)
    fit[cells[pick]] = fitness[pick]
    desc[cells[pick]] = descriptors[pick]
    gid[cells[pick]] = ids[pick]
    return fit, desc, gid


# ------------------------------------------------------------------------- batches


class Batches:
    """Pre-generated candidates shared by all systems: call k of every system gets
    batch k. Generated on first use, outside the timed region."""

    def __init__(self, case: Case, size: int, islands: int, seed: int):
        self.case, self.size, self.islands = case, size, islands
        self.rng = np.random.default_rng(seed)
        self.items: list[dict[str, Any]] = []
        self.next_id = 10_000_000
        self.island = (np.arange(size) % islands).astype(np.int32)

    def get(self, k: int) -> dict[str, Any]:
        while len(self.items) <= k:
            n, d = self.size, self.case.dim
            lo, hi = self.case.lower, self.case.upper
            desc = (lo + (hi - lo) * self.rng.random((n, d))).astype(np.float32)
            fit = self.rng.random(n, dtype=np.float32)
            gid = np.arange(self.next_id, self.next_id + n, dtype=np.int32)
            self.next_id += n
            item = {"desc": desc, "fit": fit, "gid": gid}
            if self.islands > 1:
                item["split"] = [
                    (
                        np.ascontiguousarray(desc[i :: self.islands]),
                        np.ascontiguousarray(fit[i :: self.islands]),
                        np.ascontiguousarray(gid[i :: self.islands]),
                    )
                    for i in range(self.islands)
                ]
            self.items.append(item)
        return self.items[k]


# ------------------------------------------------------------------------- runners


class QdRunner:
    name = "qd"

    def __init__(self, spec, prefilled: "qa.ArchiveState", islands: int, batch: Batches, name: str = "qd"):
        self.name = name
        self.spec = spec
        if islands == 1:
            self.state = jax.tree.map(jnp.copy, prefilled)
            self.island: Any = 0
        else:
            self.state = jax.tree.map(
                lambda x: jnp.repeat(x, islands, axis=0) if x.ndim else jnp.copy(x),
                prefilled,
            )
            self.island = batch.island
        jax.block_until_ready(self.state)

    def add(self, b) -> None:
        self.state, result = qa.insert(self.spec, self.state, self.island, b["desc"], b["fit"], b["gid"])
        jax.block_until_ready((self.state, result))

    def close(self) -> None:
        del self.state


class RibsRunner:
    name = "pyribs"

    def __init__(self, prefilled, islands: int, name: str = "pyribs"):
        self.name = name
        self.archives = [copy.deepcopy(prefilled) for _ in range(islands)]

    def add(self, b) -> None:
        if len(self.archives) == 1:
            self.archives[0].add(b["gid"][:, None].astype(np.float32), b["fit"], b["desc"])
        else:
            for archive, (d, f, g) in zip(self.archives, b["split"]):
                archive.add(g[:, None].astype(np.float32), f, d)

    def close(self) -> None:
        self.archives.clear()


def make_qdax_add() -> Callable:
    """A fresh jitted QDax add (fresh jit cache, so its first call is a compile)."""

    def add(repertoire, genotypes, descriptors, fitnesses):
        return repertoire.add(genotypes, descriptors, fitnesses)

    return jax.jit(add, donate_argnums=(0,))


class QdaxRunner:
    name = "QDax"

    def __init__(self, prefilled, islands: int):
        self.repertoires = [jax.tree.map(jnp.copy, prefilled) for _ in range(islands)]
        jax.block_until_ready(self.repertoires)
        self.fn = make_qdax_add()

    def add(self, b) -> None:
        if len(self.repertoires) == 1:
            parts = [(b["desc"], b["fit"], b["gid"])]
        else:
            parts = b["split"]
        for i, (d, f, g) in enumerate(parts):
            self.repertoires[i] = self.fn(self.repertoires[i], g[:, None].astype(np.float32), d, f)
        jax.block_until_ready(self.repertoires)

    def close(self) -> None:
        self.repertoires.clear()


# ----------------------------------------------------------------------- prefill


def qd_spec(case: Case):
    if case.kind == "grid":
        return qa.GridSpec.create(case.bins, case.lower.tolist(), case.upper.tolist())
    return qa.CVTSpec(case.centroids)


def prefill_candidates(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    n = case.prefill
    desc = (case.lower + (case.upper - case.lower) * rng.random((n, case.dim))).astype(np.float32)
    fit = rng.random(n, dtype=np.float32)
    gid = np.arange(n, dtype=np.int32)
    return desc, fit, gid


def prefill_qd(case: Case, spec, cands):
    desc, fit, gid = cands
    state = qa.init(spec, 1)
    state, _ = qa.insert(spec, state, 0, desc, fit, gid)
    return jax.block_until_ready(state)


def prefill_ribs(case: Case, cands):
    from ribs.archives import CVTArchive, GridArchive

    ranges = list(zip(case.lower.tolist(), case.upper.tolist()))
    if case.kind == "grid":
        archive = GridArchive(solution_dim=1, dims=case.bins, ranges=ranges, dtype=np.float32)
    else:
        archive = CVTArchive(solution_dim=1, centroids=case.centroids, ranges=ranges, dtype=np.float32)
    desc, fit, gid = cands
    for s in range(0, len(fit), 65536):
        archive.add(gid[s : s + 65536, None].astype(np.float32), fit[s : s + 65536], desc[s : s + 65536])
    return archive


def prefill_qdax(case: Case, cands):
    from qdax.core.containers.mapelites_repertoire import MapElitesRepertoire

    centroids = case.centroids if case.kind == "cvt" else grid_centres(case.bins, case.lower, case.upper)
    desc, fit, gid = cands
    cells = nearest_cells(case, desc)
    f, d, g = best_per_cell(cells, desc, fit, gid, len(centroids))
    rep = MapElitesRepertoire.init_default(
        genotype=jnp.zeros((1,), jnp.float32), centroids=jnp.asarray(centroids)
    )
    # Same elites as an add of all pre-fill candidates would give (QDax's brute
    # force over all centroids is too slow to pre-fill 1M cells).
    genotypes = np.where(g >= 0, g, 0).astype(np.float32)[:, None]
    return rep.replace(
        genotypes=jnp.asarray(genotypes),
        fitnesses=jnp.asarray(f)[:, None],
        descriptors=jnp.asarray(d),
    )


# ------------------------------------------------------------------------- timing


@dataclass
class Policy:
    """How many calls to time for one system in one configuration.

    Timed calls continue while fewer than ``hard_min`` were made, or while less than
    ``budget_s`` of timed work was spent, or (up to ``3 * budget_s``) while fewer than
    ``min_calls`` were made; never more than ``max_calls``. Warm-up stops early once
    ``WARMUP_CAP_S`` was spent on it (a slow call is its own warm-up).
    """

    warmup: int  # untimed calls after the first (compile) call
    hard_min: int
    min_calls: int
    max_calls: int
    budget_s: float


WARMUP_CAP_S = 0.5


@dataclass
class Measure:
    first_s: float = float("nan")
    times: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")


def policy_for(system: str, batch: int, case: Case, quick: bool) -> Policy:
    slow = (system == "QDax") or (system == "pyribs" and case.kind == "cvt" and case.dim > 8)
    if quick:
        if slow and batch >= 16384:
            return Policy(0, 1, 1, 1, 0.0)
        return Policy(1, 1, 3, 10, 0.2)
    if slow and batch >= 16384:  # ~1-10 s per call: first call + 2 timed
        return Policy(0, 2, 2, 2, 0.0)
    return Policy(3, 2, 15, 400, 2.0)


def measure_config(runners, batches: Batches, policies) -> dict[str, Measure]:
    """Interleaved timing: first calls, warm-ups, then round-robin timed calls."""
    results = {r.name: Measure() for r in runners}
    calls = {r.name: 0 for r in runners}  # batches consumed per system
    spent = {r.name: 0.0 for r in runners}

    def one(r) -> float:
        b = batches.get(calls[r.name])
        calls[r.name] += 1
        t0 = time.perf_counter()
        r.add(b)
        return time.perf_counter() - t0

    gc.collect()
    gc.disable()
    try:
        for r in runners:
            results[r.name].first_s = one(r)
        for r in runners:
            warm = 0.0
            for _ in range(policies[r.name].warmup):
                warm += one(r)
                if warm > WARMUP_CAP_S:
                    break

        def wants(r) -> bool:
            p, n, t = policies[r.name], len(results[r.name].times), spent[r.name]
            if n >= p.max_calls:
                return False
            return n < p.hard_min or t < p.budget_s or (n < p.min_calls and t < 3 * p.budget_s)

        while any(wants(r) for r in runners):
            for r in runners:
                if wants(r):
                    t = one(r)
                    results[r.name].times.append(t)
                    spent[r.name] += t
    finally:
        gc.enable()
    return results


# ------------------------------------------------------------------- CVT centroids


def bench_centroids(quick: bool, skip_ribs: bool, log) -> dict[str, Any]:
    out: dict[str, Any] = {}
    times = []
    centroids = None
    for _ in range(1 if quick else 3):
        t0 = time.perf_counter()
        centroids = np.asarray(
            jax.block_until_ready(qa.cvt_centroids(10_000, [0.0, 0.0], [1.0, 1.0], samples=100_000, seed=0))
        )
        times.append(time.perf_counter() - t0)
    out["qd_first_s"] = times[0]
    out["qd_s"] = statistics.median(times[1:]) if len(times) > 1 else times[0]
    out["qd_calls"] = len(times)
    out["qd_centroids"] = centroids
    log(f"  qd cvt_centroids: first {times[0]:.2f}s, all {[f'{t:.2f}' for t in times]}")
    if not skip_ribs:
        from ribs.archives import k_means_centroids

        t0 = time.perf_counter()
        k_means_centroids(centroids=10_000, ranges=[(0, 1), (0, 1)], samples=100_000, seed=0)
        out["ribs_s"] = time.perf_counter() - t0
        log(f"  pyribs k_means_centroids: {out['ribs_s']:.1f}s (timed once)")
    return out


def case_centroids(dim: int, qd_2d: np.ndarray | None, seed: int, log) -> np.ndarray:
    """10k centroids for the CVT cases.

    2-D: qd's ``cvt_centroids(10_000, [0,0], [1,1], samples=100_000, seed=0)`` (the
    centroid benchmark's output). 16-D: 10k uniform random points: k-means there is
    far too slow for a benchmark run (qd's ``cvt_centroids`` with 100k samples took
    ~570 s on this machine), and with 10 samples per centroid it barely moves them.
    """
    if dim == 2 and qd_2d is not None:
        return qd_2d.astype(np.float32)
    rng = np.random.default_rng(seed + dim)
    return rng.random((10_000, dim)).astype(np.float32)


# --------------------------------------------------------------- qd diagnostics


def qd_small_batch_breakdown(quick: bool) -> dict[str, float]:
    """Where a batch-64 insert into a 10k grid spends its time (median µs per call).

    Uses qd's private ``insert_device`` (the jitted core behind ``insert``) when present.
    """
    insert_mod = importlib.import_module("qd.archive.cells")

    spec = qa.GridSpec.create((100, 100), [0.0, 0.0], [1.0, 1.0])
    rng = np.random.default_rng(1)
    state = qa.init(spec, 1)
    state, _ = qa.insert(
        spec,
        state,
        0,
        rng.random((20000, 2), np.float32),
        rng.random(20000, np.float32),
        np.arange(20000, dtype=np.int32),
    )
    n = 64
    reps = 50 if quick else 300
    data = [
        (rng.random((n, 2), np.float32), rng.random(n, np.float32), np.arange(n, dtype=np.int32))
        for _ in range(reps)
    ]
    dev = [tuple(jax.device_put(x) for x in t) for t in data]
    isl, ok = np.zeros(n, np.int32), np.ones(n, bool)
    isl_d, ok_d = jax.device_put(isl), jax.device_put(ok)
    core = getattr(insert_mod, "insert_device", None)
    out: dict[str, float] = {}
    holder = {"state": state}

    def timed(label, fn):
        fn(0)
        ts = []
        gc.disable()
        for k in range(reps):
            t0 = time.perf_counter()
            fn(k)
            ts.append(time.perf_counter() - t0)
        gc.enable()
        out[label] = statistics.median(ts) * 1e6

    def full(k):
        holder["state"], r = qa.insert(spec, holder["state"], 0, *data[k])
        jax.block_until_ready((holder["state"], r))

    timed("`insert()` total", full)
    if core is None:
        return out

    def core_np(k):
        holder["state"], r = core(spec, holder["state"], isl, *data[k], ok)
        jax.block_until_ready((holder["state"], r))

    def core_dev(k):
        holder["state"], r = core(spec, holder["state"], isl_d, *dev[k], ok_d)
        jax.block_until_ready((holder["state"], r))

    timed("jitted core, numpy inputs (no padding, no result slicing)", core_np)
    timed("jitted core, device-resident inputs", core_dev)
    _, result = core(spec, jax.tree.map(jnp.copy, holder["state"]), isl_d, *dev[0], ok_d)
    jax.block_until_ready(result)
    timed(
        f"slicing the {len(result)} device result arrays `x[:n]` "
        "(what `insert()` avoids with one packed transfer)",
        lambda k: jax.block_until_ready(tuple(x[:n] for x in result)),
    )
    return out


def qd_compiled_insert(name: str, bins=(1000, 1000), batch=1024) -> str:
    """HLO text of qd's compiled jitted insert ``name`` (in ``qd.archive.cells``) on a
    one-island grid; empty if the module has no such function."""
    insert_mod = importlib.import_module("qd.archive.cells")
    jit = getattr(insert_mod, name, None)
    if jit is None:
        return ""
    spec = qa.GridSpec.create(bins, [0.0, 0.0], [1.0, 1.0])
    st = qa.init(spec, 1)
    return (
        jit.lower(
            spec,
            st,
            np.zeros(batch, np.int32),
            np.zeros((batch, 2), np.float32),
            np.zeros(batch, np.float32),
            np.zeros(batch, np.int32),
            np.ones(batch, bool),
        )
        .compile()
        .as_text()
    )


def qd_archive_sized_copies(bins=(1000, 1000), batch=1024) -> list[str]:
    """N-sized ``copy(`` ops in the compiled insert (each costs a pass over memory)."""
    text = qd_compiled_insert("insert_device", bins, batch)
    n = str(math.prod(bins))
    return [ln.strip()[:120] for ln in text.splitlines() if " copy(" in ln and n in ln.split("copy(")[0]]


def qd_insert_kernels(bins=(100, 100), batch=1024) -> dict[str, int]:
    """Kernels (XLA:CPU thunks: fusions, conditionals, copies, ...) per call of the
    compiled ``insert()`` core and of ``insert_device``: each costs a dispatch and,
    apart from the archive scatters, a pass over the batch."""
    free = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}
    out = {}
    for name in ("_insert_packed", "insert_device"):
        text = qd_compiled_insert(name, bins, batch)
        if not text:
            continue
        entry = text[text.index("\nENTRY") :]
        entry = entry[: entry.index("\n}")]
        ops = [
            re.search(r"\s([a-z][a-z0-9-]*)\(", ln.split("=", 1)[1])
            for ln in entry.splitlines()[1:]
            if "=" in ln
        ]
        out[name] = sum(1 for op in ops if op and op.group(1) not in free)
    return out


def scaling_check(quick: bool, seed: int, log) -> dict[str, float]:
    """qd and pyribs batch-1024 inserts into 10k and 1M cells, all four interleaved
    (so that machine noise hits both archive sizes alike): median seconds per call."""
    z2, o2 = np.zeros(2, np.float32), np.ones(2, np.float32)
    small = Case("10k", "grid", 2, z2, o2, bins=(100, 100), prefill=20_000)
    big = Case("1M", "grid", 2, z2, o2, bins=(1000, 1000), prefill=1_000_000)
    runners: list[Any] = []
    bt = Batches(small, 1024, 1, seed + 7)
    for case in (small, big):
        cands = prefill_candidates(case, seed + 11)
        spec = qd_spec(case)
        runners.append(QdRunner(spec, prefill_qd(case, spec, cands), 1, bt, f"qd {case.name}"))
        runners.append(RibsRunner(prefill_ribs(case, cands), 1, f"pyribs {case.name}"))
    pol = Policy(1, 1, 3, 10, 0.3) if quick else Policy(5, 2, 40, 400, 4.0)
    res = measure_config(runners, bt, {r.name: pol for r in runners})
    for r in runners:
        r.close()
    out = {k: m.median_s for k, m in res.items()}
    out.update({f"{k} calls": float(len(m.times)) for k, m in res.items()})
    log("  " + ", ".join(f"{k} {m.median_s * 1e6:.0f} µs ({len(m.times)} calls)" for k, m in res.items()))
    return out


# ---------------------------------------------------------------------- reporting


def fmt_rate(x: float) -> str:
    if not np.isfinite(x):
        return "n/m"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def fmt_ratio(x: float) -> str:
    if not np.isfinite(x):
        return "n/m"
    return f"{x:.0f}x" if x >= 100 else f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repeats: a smoke check")
    ap.add_argument(
        "--skip-ribs-kmeans",
        action="store_true",
        help="do not time pyribs k_means_centroids (~72 s); implied by --quick",
    )
    ap.add_argument(
        "--cases",
        default="grid10k,grid1M,cvt2d,cvt16d",
        help="comma-separated subset of grid10k,grid1M,cvt2d,cvt16d",
    )
    ap.add_argument("--no-qdax", action="store_true")
    ap.add_argument("--json", type=Path, help="also write raw results as JSON here")
    ap.add_argument(
        "--results", type=Path, help=f"write the markdown section '{SECTION_TITLE}' into this file"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    quick = args.quick
    wanted = set(args.cases.split(","))
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    import ribs

    versions = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
        "numpy": np.__version__,
        "ribs": ribs.__version__,
    }
    if not args.no_qdax:
        import qdax

        versions["qdax"] = qdax.__version__
    try:
        import scipy

        versions["scipy"] = scipy.__version__
    except ImportError:
        pass
    load = [os.getloadavg()[0]]
    log(f"versions {versions}; cpus={os.cpu_count()}; quick={quick}; load {load[0]:.1f}")

    # --- CVT centroid generation (also gives the 2-D centroids of the CVT cases).
    log("cvt_centroids benchmark")
    cent = bench_centroids(quick, args.skip_ribs_kmeans or quick, log)

    cases: list[Case] = []
    z2, o2 = np.zeros(2, np.float32), np.ones(2, np.float32)
    if "grid10k" in wanted:
        cases.append(
            Case(
                "grid 100x100 (10k cells), 2-D",
                "grid",
                2,
                z2,
                o2,
                bins=(100, 100),
                prefill=20_000,
                short="grid 10k",
            )
        )
    if "grid1M" in wanted:
        cases.append(
            Case(
                "grid 1000x1000 (1M cells), 2-D",
                "grid",
                2,
                z2,
                o2,
                bins=(1000, 1000),
                prefill=1_000_000,
                qdax_batches=(64,),
                qdax_many_islands=False,
                short="grid 1M",
            )
        )
    for key, dim in (("cvt2d", 2), ("cvt16d", 16)):
        if key not in wanted:
            continue
        c = case_centroids(dim, cent.get("qd_centroids"), args.seed, log)
        lo, hi = np.zeros(dim, np.float32), np.ones(dim, np.float32)
        cases.append(
            Case(
                f"CVT 10k centroids, {dim}-D",
                "cvt",
                dim,
                lo,
                hi,
                centroids=c,
                prefill=20_000,
                short=f"CVT {dim}-D",
            )
        )

    rows: list[dict[str, Any]] = []
    for ci, case in enumerate(cases):
        log(f"case {case.name}: pre-filling {case.prefill} candidates")
        cands = prefill_candidates(case, args.seed + 100 + ci)
        spec = qd_spec(case)
        qd_pre = prefill_qd(case, spec, cands)
        ribs_pre = prefill_ribs(case, cands)
        qdax_pre = None if args.no_qdax else prefill_qdax(case, cands)
        occupancy = float(np.mean(np.isfinite(np.asarray(qd_pre.fitness))))
        log(f"  occupancy after pre-fill: {occupancy:.1%} (pyribs {len(ribs_pre) / case.num_cells:.1%})")
        del cands
        for islands in (1, ISLANDS_MANY):
            for batch in BATCHES:
                bt = Batches(case, batch, islands, args.seed + 1000 * ci + 10 * islands + batch)
                runners: list[Any] = [QdRunner(spec, qd_pre, islands, bt), RibsRunner(ribs_pre, islands)]
                qdax_on = (
                    qdax_pre is not None
                    and batch in case.qdax_batches
                    and (islands == 1 or case.qdax_many_islands)
                )
                if qdax_on:
                    runners.append(QdaxRunner(qdax_pre, islands))
                policies = {r.name: policy_for(r.name, batch, case, quick) for r in runners}
                res = measure_config(runners, bt, policies)
                for r in runners:
                    r.close()
                del runners, bt
                row = {
                    "case": case.name,
                    "short": case.short,
                    "kind": case.kind,
                    "dim": case.dim,
                    "cells": case.num_cells,
                    "islands": islands,
                    "batch": batch,
                    "occupancy": occupancy,
                }
                for sys_name in ("qd", "pyribs", "QDax"):
                    m = res.get(sys_name)
                    row[sys_name] = {
                        "median_s": m.median_s if m else float("nan"),
                        "rate": batch / m.median_s if m and m.times else float("nan"),
                        "first_s": m.first_s if m else float("nan"),
                        "calls": len(m.times) if m else 0,
                    }
                rows.append(row)
                log(
                    f"  I={islands:2d} B={batch:5d}: "
                    + ", ".join(
                        f"{k} {fmt_rate(row[k]['rate'])}/s ({row[k]['calls']} calls, "
                        f"first {row[k]['first_s']:.3f}s)"
                        for k in ("qd", "pyribs", "QDax")
                        if row[k]["calls"]
                    )
                )
        del qd_pre, ribs_pre, qdax_pre
        gc.collect()

    scaling: dict[str, float] = {}
    if {"grid10k", "grid1M"} <= wanted:
        log("1M-vs-10k scaling check (batch 1024, interleaved)")
        scaling = scaling_check(quick, args.seed, log)
    log("qd diagnostics")
    breakdown = qd_small_batch_breakdown(quick)
    copies = qd_archive_sized_copies()
    kernels = qd_insert_kernels()
    total_s = time.perf_counter() - t_start
    load.append(os.getloadavg()[0])
    md = render(rows, cent, breakdown, copies, kernels, versions, quick, total_s, argv, scaling, load)
    print(md)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "centroids": {k: v for k, v in cent.items() if k != "qd_centroids"},
                    "scaling": scaling,
                    "load": load,
                    "breakdown_us": breakdown,
                    "copies": copies,
                    "kernels": kernels,
                    "versions": versions,
                },
                indent=1,
                default=float,
            )
        )
    if args.results:
        write_section(args.results, SECTION_TITLE, md)
        log(f"wrote section into {args.results}")
    return 0


def git_state() -> str:
    """HEAD commit and whether qd/archive has uncommitted edits (read-only git)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "qd/archive"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        dirty = [ln[3:] for ln in dirty if ln.strip()]
    except Exception:  # noqa: BLE001
        return "unknown"
    return f"HEAD {head}" + (f" + uncommitted {', '.join(dirty)}" if dirty else "")


def find(rows, kind, dim, cells, islands, batch):
    for r in rows:
        if (r["kind"], r["dim"], r["cells"], r["islands"], r["batch"]) == (kind, dim, cells, islands, batch):
            return r
    return None


def render(rows, cent, breakdown, copies, kernels, versions, quick, total_s, argv, scaling, load) -> str:
    out: list[str] = []
    cmd = "python bench/archive_insert.py" + ("".join(" " + a for a in (argv or sys.argv[1:])))
    out.append(SECTION_TITLE)
    out.append("")
    out.append(f"- Command: `{cmd}` ({'quick smoke check' if quick else 'full run'}, {total_s / 60:.1f} min)")
    out.append(
        f"- Date: {datetime.date.today().isoformat()}; machine: {os.cpu_count()} CPU cores "
        f"({platform.machine()}), shared and noisy: other jobs were running (1-min load "
        f"average {load[0]:.1f} at the start, {load[-1]:.1f} at the end)"
    )
    out.append(
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; qd tree: {git_state()}"
    )
    out.append(
        "- Throughput = batch / median wall time of one insert call (candidates/s), "
        "calls interleaved across systems, fresh uniform descriptors and fitness "
        "per call, archives pre-filled (occupancy column). qd: `jax.block_until_ready` "
        "on the returned state and result. pyribs: float32, `solution_dim=1`, CVT "
        "with the same centroids and its default scipy k-d tree. QDax: jitted, "
        "donated `MapElitesRepertoire.add`, genotype f32[1]; on grids its "
        "centroids are the cell centres (brute-force lookup; 1M cells only at "
        "batch 64, 1 island). 16 islands: qd one call with `island = i % 16`; "
        "pyribs/QDax 16 archives, one add of B/16 each; all B counted."
    )
    out.append(
        "- CVT centroids: 2-D = qd `cvt_centroids(10_000, [0,0], [1,1], samples=100_000, "
        "seed=0)`; 16-D = 10k uniform random points (k-means in 16-D is too slow to "
        "run here). All three systems get the same centroids; pre-fill 20k "
        "candidates per archive (10k grid: 20k, 1M grid: 1M)."
    )
    out.append(
        "- First call = the first insert of that configuration (jit compile for qd "
        "and QDax). QDax recompiles for every new batch size (16 islands use "
        "B/16 = 4, 64, 1024 per add: one compile shared by the 16 repertoires)."
    )
    out.append("")
    out.append(
        "| archive | islands | batch | occupancy | qd cand/s | pyribs cand/s | QDax cand/s "
        "| qd/pyribs | qd/QDax | qd first call (s) | QDax first call (s) | calls qd/ribs/QDax |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        q, p, x = r["qd"]["rate"], r["pyribs"]["rate"], r["QDax"]["rate"]
        qdax_first = r["QDax"]["first_s"]
        cells = [
            r["case"],
            str(r["islands"]),
            str(r["batch"]),
            f"{r['occupancy']:.0%}",
            fmt_rate(q),
            fmt_rate(p),
            fmt_rate(x),
            fmt_ratio(q / p),
            fmt_ratio(q / x),
            f"{r['qd']['first_s']:.2f}",
            f"{qdax_first:.2f}" if np.isfinite(qdax_first) else "n/m",
            f"{r['qd']['calls']}/{r['pyribs']['calls']}/{r['QDax']['calls']}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")

    # ---- metrics and targets
    out.append("Targets (1 island unless stated):")
    out.append("")

    def ratio_line(label, pairs, need, what="qd/pyribs"):
        vals = [(b, v) for b, v in pairs if v is not None and np.isfinite(v)]
        if not vals:
            return f"- {label}: **not measured**"
        met = all(v >= need for _, v in vals)
        detail = ", ".join(f"B={b}: {v:.2f}x" for b, v in vals)
        return f"- {label} (need {what} >= {need:g}x): **{'met' if met else 'missed'}** ({detail})"

    def rate_ratio(r, a, b):
        if r is None:
            return None
        return r[a]["rate"] / r[b]["rate"]

    for cells, label in ((10_000, "grid 10k"), (1_000_000, "grid 1M")):
        for batch, need in ((16384, 5), (1024, 2), (64, 1)):
            r = find(rows, "grid", 2, cells, 1, batch)
            out.append(ratio_line(f"{label}, batch {batch}", [(batch, rate_ratio(r, "qd", "pyribs"))], need))
    a = find(rows, "grid", 2, 1_000_000, 1, 1024)
    b = find(rows, "grid", 2, 10_000, 1, 1024)
    if scaling:
        qr = scaling["qd 1M"] / scaling["qd 10k"]
        pr = scaling["pyribs 1M"] / scaling["pyribs 10k"]
        table = ""
        if a and b:
            table = (
                f"; from the table rows above: qd {a['qd']['median_s'] / b['qd']['median_s']:.2f}x, "
                f"pyribs {a['pyribs']['median_s'] / b['pyribs']['median_s']:.2f}x"
            )
        out.append(
            f"- Cost grows with the batch, not the archive (need qd time per batch-1024 insert "
            f"into 1M cells / into 10k cells <= 1.5x): **{'met' if qr <= 1.5 else 'missed'}** "
            f"({qr:.2f}x: {scaling['qd 1M'] * 1e6:.0f} µs vs {scaling['qd 10k'] * 1e6:.0f} µs; "
            f"pyribs {pr:.2f}x: {scaling['pyribs 1M'] * 1e6:.0f} µs vs "
            f"{scaling['pyribs 10k'] * 1e6:.0f} µs; the four archives timed interleaved, "
            f"{int(scaling['qd 10k calls'])}+ calls each{table})"
        )
    else:
        out.append("- 1M-vs-10k cost ratio: **not measured**")
    if any(r["kind"] == "cvt" for r in rows):
        for dim, need in ((2, 1), (16, 3)):
            pairs = [
                (bb, rate_ratio(find(rows, "cvt", dim, 10_000, 1, bb), "qd", "pyribs")) for bb in BATCHES
            ]
            out.append(ratio_line(f"CVT 10k, {dim}-D vs pyribs", pairs, need))
        for dim in (2, 16):
            pairs = [(bb, rate_ratio(find(rows, "cvt", dim, 10_000, 1, bb), "qd", "QDax")) for bb in BATCHES]
            out.append(ratio_line(f"CVT 10k, {dim}-D vs QDax", pairs, 100, "qd/QDax"))
    else:
        out.append("- CVT targets: **not measured** in this run (not in `--cases`)")
    many = [r for r in rows if r["islands"] == ISLANDS_MANY]
    if many:
        vals = [(r, r["qd"]["rate"] / r["pyribs"]["rate"]) for r in many]
        met = all(v >= 10 for _, v in vals)
        detail = "; ".join(f"{r['short']} B={r['batch']}: {v:.1f}x" for r, v in vals)
        out.append(
            f"- 16 islands in one qd call vs 16 pyribs archives (need >= 10x): "
            f"**{'met' if met else 'missed'}** ({detail})"
        )
    t = cent["qd_s"]
    ribs_txt = (
        f"pyribs `k_means_centroids` (0.12 has no `k_means_cvt`) {cent['ribs_s']:.1f} s, "
        f"timed once -> qd {cent['ribs_s'] / t:.0f}x faster"
        if "ribs_s" in cent
        else "pyribs not timed in this run"
    )
    out.append(
        f"- `cvt_centroids(10_000, [0,0], [1,1], samples=100_000, seed=0)` under 10 s: "
        f"**{'met' if t < 10 else 'missed'}** ({t:.2f} s median of "
        f"{max(cent['qd_calls'] - 1, 1)} after a first call of {cent['qd_first_s']:.2f} s; "
        f"{ribs_txt})"
    )
    out.append("")
    if breakdown:
        out.append(
            "qd small-batch cost (grid 10k, batch 64, median µs per call): "
            + "; ".join(f"{k} {v:.0f}" for k, v in breakdown.items())
            + "."
        )
    if copies:
        out.append(
            f"Archive-sized `copy` ops in qd's compiled insert at 1M cells: {len(copies)} "
            f"(`{'`, `'.join(c.split('=')[0].strip() for c in copies)}`)."
        )
    if kernels:
        out.append(
            "Kernels per qd insert call (compiled HLO, grid 10k, batch 1024): "
            + ", ".join(f"`{k}` {v}" for k, v in kernels.items())
            + "."
        )
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
