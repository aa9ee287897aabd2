#!/usr/bin/env python
"""The device entry point: qd's archive insert and device loop on whatever backend JAX sees, beside QDax.

Needs only jax and numpy (run it as ``PYTHONPATH=. python bench/device.py``); QDax
is measured beside qd when it is importable (``pip install qdax==0.5.0``), on the
same backend in the same process.

* insert: a grid of 100 x 100 = 10k cells, and of 1000 x 1000 = 1M cells (the
  issue's goal: >= 1e9 inserts/s), over [0, 1]^2; each call inserts a fresh
  batch of uniformly random descriptors and fitnesses that is already on the
  device. qd: ``qd.archive.insert_device`` (jitted, archive donated, results left
  on the device). QDax: ``MapElitesRepertoire.add`` under ``jax.jit`` with the
  archive donated, the grid's cell centres as centroids (QDax has no grid lookup:
  it computes every candidate's distance to every centroid, so it is skipped
  where a batch needs more than 2^32 distances, i.e. at 1M cells). Reported:
  candidates inserted per second.
* device loop: sphere (``experiments/sphere``'s evaluation, its ``evaluate_jax``),
  MAP-Elites with Gaussian mutation (sigma 0.5) over a 100 x 100 grid on
  [-D*5.12/2, D*5.12/2]^2, a batch of children per generation, a number of
  generations per jitted call (``lax.scan``). qd: ``qd.device.step.device_loop``.
  QDax: ``MAPElites`` with a ``MixingEmitter`` of ``isoline_variation(iso_sigma=0.5,
  line_sigma=0)`` (Gaussian mutation), ``scan_update`` over the same number of
  generations per call, a metrics function that computes nothing (so QDax does no
  per-generation work qd does not). Reported: evaluations per second after
  compilation (the issue's goal: >= 10x QDax), and the first call (which compiles) apart.

Each figure is the median of ``--repeats`` timed calls after one untimed warm-up.

Usage::

    PYTHONPATH=. python bench/device.py --quick            # tiny sizes, a CPU smoke run
    PYTHONPATH=. python bench/device.py                    # the full run on any backend
    PYTHONPATH=. python bench/device.py --gpu --results bench/RESULTS.md
        # the full run on a GPU (under 5 minutes on one H200), its section in bench/RESULTS.md;
        # on another backend it refuses unless --allow-cpu (the tests: --gpu --allow-cpu --quick)
    PYTHONPATH=. python bench/device.py --json out.json    # also write the numbers
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.gaussian import gaussian_apply, gaussian_noise  # noqa: E402
from qd import archive  # noqa: E402
from qd.device.step import DeviceOperator, device_loop  # noqa: E402
from qd.task import load_task  # noqa: E402

GOAL_INSERTS_PER_S = 1e9  # issue 32: the insert at 1M cells
GOAL_LOOP_VS_QDAX = 10.0  # issue 32: the device loop's evaluations/s over QDax's
GPU_BUDGET_S = 300  # issue 32: the --gpu run on one GPU
QDAX_MAX_DISTANCES = 2**32  # QDax's insert is measured where a batch's cell lookup needs at most this many
SECTION = "## Device (GPU) run: bench/device.py --gpu"
UNITS = {"inserts_per_s": "inserts/s", "evaluations_per_s": "evaluations/s"}


def qdax_available() -> bool:
    try:
        import qdax  # noqa: F401
    except ImportError:
        return False
    return True


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call s, median s of ``repeats`` later calls); ``fn`` blocks until its result is ready."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def grid_centres(bins: tuple[int, int]) -> np.ndarray:
    """Cell centres in qd's flat cell order, for QDax's centroids."""
    axes = [(np.arange(b) + 0.5) / b for b in bins]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], 1).astype(np.float32)


# ------------------------------------------------------------------------- insert


class InsertCase(NamedTuple):
    bins: tuple[int, int]
    batch: int
    calls: int  # inserts per timed repeat
    goal: bool  # the goal (>= GOAL_INSERTS_PER_S) is set for this archive size


# The 1M-cell cases bear the goal; --quick keeps the same roles at tiny sizes.
INSERT_CASES = {
    "full": [
        InsertCase((100, 100), 64, 50, False),
        InsertCase((100, 100), 1024, 50, False),
        InsertCase((100, 100), 16384, 20, False),
        InsertCase((100, 100), 262144, 5, False),
        InsertCase((1000, 1000), 65536, 20, True),
        InsertCase((1000, 1000), 1048576, 5, True),
    ],
    "quick": [InsertCase((100, 100), 256, 4, False), InsertCase((200, 200), 512, 4, True)],
}


def qdax_insert_skipped(case: InsertCase) -> str | None:
    """Why QDax's insert is not measured for ``case`` (None: it is)."""
    if not qdax_available():
        return "not installed"
    distances = case.batch * int(np.prod(case.bins))
    if distances > QDAX_MAX_DISTANCES:
        return f"skipped: its brute-force cell lookup is {distances:.2g} distances per call"
    return None


def bench_insert(case: InsertCase, repeats: int) -> dict:
    bins, batch, calls = case.bins, case.batch, case.calls
    spec = archive.GridSpec(bins, (0.0, 0.0), (1.0, 1.0))
    key = jax.random.key(0)
    desc = jax.random.uniform(key, (calls, batch, 2))
    fit = jax.random.uniform(jax.random.key(1), (calls, batch))
    ids = jnp.arange(calls * batch, dtype=jnp.int32).reshape(calls, batch)
    island, valid = jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool)
    out = {"batch": batch, "cells": int(np.prod(bins)), "goal": case.goal}

    box = {"state": archive.init(spec)}

    def qd_calls():
        state = box["state"]
        for c in range(calls):
            state, _ = archive.insert_device(spec, state, island, desc[c], fit[c], ids[c], valid)
        box["state"] = jax.block_until_ready(state)

    first, median = timed(qd_calls, repeats)
    out["qd"] = {"inserts_per_s": calls * batch / median, "first_s": first}
    skipped = qdax_insert_skipped(case)
    if skipped:
        out["QDax_skipped"] = skipped
        return out
    from qdax.core.containers.mapelites_repertoire import MapElitesRepertoire

    add = jax.jit(lambda rep, g, d, f: rep.add(g, d, f), donate_argnums=(0,))
    qbox = {
        "rep": MapElitesRepertoire.init_default(
            genotype=jnp.zeros((1,), jnp.float32), centroids=jnp.asarray(grid_centres(bins))
        )
    }

    def qdax_calls():
        rep = qbox["rep"]
        for c in range(calls):
            rep = add(rep, ids[c][:, None].astype(jnp.float32), desc[c], fit[c])
        qbox["rep"] = jax.block_until_ready(rep)

    first, median = timed(qdax_calls, repeats)
    out["QDax"] = {"inserts_per_s": calls * batch / median, "first_s": first}
    return out


# -------------------------------------------------------------------------- loop


# (sphere's dimension, children per generation, generations per call)
LOOP_CASES = {"full": [(100, 256, 50), (100, 4096, 50), (100, 65536, 10)], "quick": [(10, 64, 5)]}


def bench_loop(dim: int, batch: int, per_call: int, repeats: int) -> dict:
    task = load_task("sphere", {"dim": dim})
    bound = task.descriptor_bound
    spec = archive.GridSpec((100, 100), (-bound, -bound), (bound, bound))
    op = DeviceOperator(gaussian_noise, gaussian_apply, 1, {"sigma": 0.5}, 1.0)
    loop = device_loop(spec, task.evaluate_jax, [op], 1, batch, dim, np.zeros((1, dim), np.float32))
    box = {"state": loop.init(0)}

    def qd_call():
        state, _, _ = loop.run(box["state"], per_call, 2**31 - 1, per_call, False)
        box["state"] = jax.block_until_ready(state)

    first, median = timed(qd_call, repeats)
    evals = per_call * batch
    out = {
        "dim": dim,
        "batch": batch,
        "generations_per_call": per_call,
        "qd": {
            "evaluations_per_s": evals / median,
            "first_s": first,
            "qd_score": float(archive.stats(box["state"].archive).qd_score[-1]),
        },
    }
    if not qdax_available():
        out["QDax_skipped"] = "not installed"
        return out
    from qdax.core.emitters.mutation_operators import isoline_variation
    from qdax.core.emitters.standard_emitters import MixingEmitter
    from qdax.core.map_elites import MAPElites

    def scoring(genotypes, key):
        fitness, descriptor, _ = task.evaluate_jax(genotypes)
        return fitness, descriptor, {}

    emitter = MixingEmitter(
        mutation_fn=None,
        variation_fn=functools.partial(isoline_variation, iso_sigma=0.5, line_sigma=0.0),
        variation_percentage=1.0,
        batch_size=batch,
    )
    me = MAPElites(scoring_function=scoring, emitter=emitter, metrics_function=lambda repertoire: {})
    centroids = jnp.asarray(grid_centres((100, 100)) * 2 * bound - bound)
    repertoire, emitter_state, _ = me.init(jnp.zeros((1, dim)), centroids, jax.random.key(0))

    @functools.partial(jax.jit, donate_argnums=(0,))
    def qdax_run(carry):
        carry, _ = jax.lax.scan(me.scan_update, carry, None, length=per_call)
        return carry

    qbox = {"carry": (repertoire, emitter_state, jax.random.key(1))}

    def qdax_call():
        qbox["carry"] = jax.block_until_ready(qdax_run(qbox["carry"]))

    first, median = timed(qdax_call, repeats)
    fitnesses = np.asarray(qbox["carry"][0].fitnesses).reshape(-1)
    out["QDax"] = {
        "evaluations_per_s": evals / median,
        "first_s": first,
        "qd_score": float(fitnesses[np.isfinite(fitnesses)].sum()),
    }
    return out


# --------------------------------------------------------------------------- main


def metric_of(row: dict) -> str:
    return next(key for key in UNITS if key in row["qd"])


def vs_qdax(row: dict) -> float | None:
    """qd's figure over QDax's (None where QDax was not measured)."""
    if "QDax" not in row:
        return None
    metric = metric_of(row)
    return row["qd"][metric] / row["QDax"][metric]


def goal_of(row: dict) -> tuple[str, float | None, str]:
    """(the issue's goal for ``row``, the measured figure as a multiple of it, met | missed | why
    not measured); ``("", None, "")`` where the issue sets no goal."""
    if metric_of(row) == "inserts_per_s":
        if not row["goal"]:
            return "", None, ""
        goal, ratio = (
            f">= {GOAL_INSERTS_PER_S:,.0f} inserts/s",
            row["qd"]["inserts_per_s"] / GOAL_INSERTS_PER_S,
        )
    else:
        goal, ratio = f"qd/QDax >= {GOAL_LOOP_VS_QDAX:g}x", vs_qdax(row)
        if ratio is None:
            return goal, None, f"not measured (QDax {row['QDax_skipped']})"
        ratio /= GOAL_LOOP_VS_QDAX
    return goal, ratio, "met" if ratio >= 1 else "missed"


def report(row: dict, elapsed: float) -> None:
    """One line: qd's rate, QDax's beside it when measured, their ratio, qd's first (compiling)
    call, the goal where the issue sets one, and the time the run has taken so far."""
    metric = metric_of(row)
    unit = UNITS[metric]
    line = f"{row['case']}: qd {row['qd'][metric]:.3g} {unit}"
    if "QDax" in row:
        line += f", QDax {row['QDax'][metric]:.3g} {unit} (qd/QDax {vs_qdax(row):.2f}x"
    else:
        line += f" (QDax {row['QDax_skipped']}"
    line += f"; first call qd {row['qd']['first_s']:.2f}s)"
    goal, ratio, verdict = goal_of(row)
    if goal:
        line += f"; goal {goal}: " + (f"{ratio:.3g}x of it, {verdict}" if ratio is not None else verdict)
    print(f"{line}; {elapsed:.0f} s elapsed", flush=True)


def results_section(header: str, results: dict, argv: list[str]) -> str:
    """The run's section for bench/RESULTS.md. Its first line is the backend line the run printed
    first: ``backend=gpu`` there is what marks the GPU path as measured (tests/test_readme.py)."""
    from _results import commit, versions

    table = [
        "| case | qd | QDax | qd/QDax | goal | measured / goal | goal met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in [*results["insert"], *results["loop"]]:
        metric, ratio = metric_of(row), vs_qdax(row)
        goal, of_goal, verdict = goal_of(row)
        cells = [row["case"], f"{row['qd'][metric]:.3g} {UNITS[metric]}"]
        if ratio is None:
            cells += [row["QDax_skipped"], ""]
        else:
            cells += [f"{row['QDax'][metric]:.3g} {UNITS[metric]}", f"{ratio:.2f}x"]
        cells += [goal or "none set", "" if of_goal is None else f"{of_goal:.3g}x", verdict]
        table.append("| " + " | ".join(cells) + " |")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"""{SECTION}

`{header}`

- Command: `PYTHONPATH=. python bench/device.py {" ".join(argv)}`
- Device: {results["device_kind"]}; {versions("jax", "jaxlib", "numpy", "qdax")}; commit {commit()}; {date}
- The whole run took {results["elapsed_s"]:.0f} s (goal: under {GPU_BUDGET_S} s on one GPU). Each figure
  is the median of {results["repeats"]} timed calls after one untimed call (which compiles); the setup of
  each case is in the script's docstring, the first calls' times in its `--json`.

{chr(10).join(table)}
"""


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run (the tests run it)")
    ap.add_argument("--gpu", action="store_true", help="the GPU run: refuses any other backend")
    ap.add_argument("--allow-cpu", action="store_true", help="let --gpu run on another backend")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--results", type=Path, default=None, help=f"add or replace the section '{SECTION[3:]}' in this file"
    )
    args = ap.parse_args(argv)
    if args.results and not args.gpu:
        ap.error("--results records the GPU run: add --gpu")
    return args


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    backend = jax.default_backend()
    if args.gpu and backend != "gpu" and not args.allow_cpu:
        sys.exit(
            f"bench/device.py --gpu: JAX's default backend is {backend}, not gpu; run it where JAX sees "
            "a GPU (pip install -U 'jax[cuda12]'), or add --allow-cpu to run the same code here "
            "(--quick: tiny sizes)"
        )
    start = time.perf_counter()
    header = (
        f"backend={backend} devices={[d.device_kind for d in jax.devices()]} jax={jax.__version__} "
        f"qdax={'yes' if qdax_available() else 'no'}"
    )
    print(header, flush=True)
    size = "quick" if args.quick else "full"
    repeats = args.repeats or (2 if args.quick else 5)
    kind = jax.devices()[0].device_kind
    results = {"backend": backend, "device_kind": kind, "repeats": repeats, "insert": [], "loop": []}
    for case in INSERT_CASES[size]:
        row = {"case": f"insert {int(np.prod(case.bins)):,} cells, batch {case.batch:,}"}
        row.update(bench_insert(case, repeats))
        results["insert"].append(row)
        report(row, time.perf_counter() - start)
    for dim, batch, per_call in LOOP_CASES[size]:
        row = {"case": f"device loop sphere {dim}-D, batch {batch:,}"}
        row.update(bench_loop(dim, batch, per_call, repeats))
        results["loop"].append(row)
        report(row, time.perf_counter() - start)
    results["elapsed_s"] = time.perf_counter() - start
    print(f"elapsed {results['elapsed_s']:.0f} s in all", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.results:
        from _results import write_section

        write_section(args.results, SECTION, results_section(header, results, argv))
    return results


if __name__ == "__main__":
    main()
