#!/usr/bin/env python
"""MAP-Elites on the 100-D sphere: qd's device loop vs pyribs vs QDax, side by side in one run.

The same algorithm, task, operator, grid, batch and budget for all three, over
the same seeds (``bench/map_elites.py`` has the setup in full; its constants are
used here):

* task: ``experiments/sphere`` 100-D, a 100x100 grid over [-256, 256]^2, Gaussian
  mutation sigma 0.5 of one uniformly chosen elite, the first batch from zeros.
* pyribs: ``GridArchive`` + one ``GaussianEmitter(x0=0)`` + ``Scheduler``, ask ->
  ``task.evaluate`` (numpy) -> tell, for ``--evals`` evaluations in batches of 256.
* qd: the real run, ``qd.build(compose(["experiment=sphere", ...]))`` +
  ``engine.run()``, which ``runner.loop=auto`` puts on the device loop
  (``generations_per_call`` 100, elites store, a checkpoint and an event per call:
  all included). The founders' generation is the task's 8 initial genomes, then
  generations of 256 up to the budget (the last one partial).
* qd fused loop alone: ``qd.device.step.device_loop`` with the same operator and task, called as
  QDax is (no store, checkpoints or events), ``generations_per_call`` 100.
* QDax 0.5: ``MAPElites`` + ``MixingEmitter(isoline_variation(iso_sigma=0.5,
  line_sigma=0))`` (Gaussian mutation) + the same JAX evaluation, ``scan_update``
  over 100 generations per jitted call, a metrics function that computes nothing,
  the grid's cell centres as centroids.

Measured, per seed:

* after compilation: evaluations/s. pyribs: the whole loop (it compiles nothing).
  qd: the evaluations of its calls after the first, over the time between the
  first call's event and the last (the first call compiles). QDax: the median
  time of its calls after the first.
* QD score (pyribs's convention: sum of elite fitness) at the end of the budget.
* whole process (``--processes``, the issue's "first run"): a fresh interpreter
  each, an empty JAX compilation cache: ``python -m qd.run experiment=sphere ...`` vs the
  pyribs loop as a script (imports included), median wall seconds over seeds.

Usage::

    python bench/sphere_loops.py                         # 5 seeds, 102,400 evaluations
    python bench/sphere_loops.py --seeds 2 --evals 25600 # quicker
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # after the root: the project's packages first

import map_elites  # noqa: E402
from map_elites import BINS, DIM, RANGE, SIGMA, run_pyribs  # noqa: E402

import qd  # noqa: E402
from qd.task import load_task  # noqa: E402

PER_CALL = 100


def run_qd_device(seed: int, evals: int, batch: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="qd_sphere_device_"))
    times, evaluations = [], []

    def seen(event: dict) -> None:
        times.append(time.perf_counter())
        evaluations.append(event["evaluations"])

    try:
        cfg = qd.compose(
            [
                "experiment=sphere",
                "operators=gaussian",
                f"operators.mix.0.sigma={SIGMA}",
                f"experiment.params.dim={DIM}",
                f"runner.batch_size={batch}",
                f"runner.max_evaluations={evals}",
                f"runner.generations_per_call={PER_CALL}",
                "runner.progress=false",
                f"seed={seed}",
            ]
        )
        t0 = time.perf_counter()
        engine = qd.build(cfg, run_dir, on_commit=seen)
        summary = engine.run()
        engine.close()
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    assert summary["loop"] == "device", summary
    steady = (evaluations[-1] - evaluations[0]) / (times[-1] - times[0])
    return {
        "evaluations": summary["evaluations"],
        "qd_score": summary["global"]["qd_score"],
        "steady_evals_per_s": steady,
        "wall_s": wall,
    }


def run_qd_fused(seed: int, evals: int, batch: int) -> dict:
    """qd's fused loop alone (``qd.device.step.device_loop``), as QDax's row runs: no store,
    no checkpoints, no events; calls of ``PER_CALL`` generations, timed after the first."""
    from operators import make_numeric_operator
    from qd.archive import GridSpec
    from qd.device.step import DeviceOperator, device_loop

    task = load_task("sphere", {"dim": DIM})
    op = make_numeric_operator("gaussian", sigma=SIGMA)
    spec = GridSpec(tuple(BINS), (RANGE[0],) * 2, (RANGE[1],) * 2)
    loop = device_loop(
        spec,
        task.evaluate_jax,
        [DeviceOperator(op.draw, op.apply, 1, op.params, 1.0)],
        1,
        batch,
        DIM,
        task.initial(np.random.default_rng(seed), 8),
    )
    state, calls, t0 = loop.init(seed), [], time.perf_counter()
    generations = 1 + -(-(evals - 8) // batch)
    for done in range(0, generations, PER_CALL):
        start = time.perf_counter()
        state, _, _ = loop.run(state, min(PER_CALL, generations - done), evals, PER_CALL, False)
        jax.block_until_ready(state)
        calls.append((time.perf_counter() - start, min(PER_CALL, generations - done)))
    from qd.archive import stats

    steady = [(s, g) for s, g in calls[1:] if g == PER_CALL]
    return {
        "evaluations": int(state.evaluations),
        "qd_score": float(stats(state.archive).qd_score[-1]),
        "steady_evals_per_s": batch * sum(g for _, g in steady) / sum(s for s, _ in steady),
        "wall_s": time.perf_counter() - t0,
    }


def run_qdax(seed: int, evals: int, batch: int) -> dict:
    from qdax.core.emitters.mutation_operators import isoline_variation
    from qdax.core.emitters.standard_emitters import MixingEmitter
    from qdax.core.map_elites import MAPElites

    task = load_task("sphere", {"dim": DIM})

    def scoring(genotypes, key):
        fitness, descriptor, _ = task.evaluate_jax(genotypes)
        return fitness, descriptor, {}

    emitter = MixingEmitter(
        mutation_fn=None,
        variation_fn=functools.partial(isoline_variation, iso_sigma=SIGMA, line_sigma=0.0),
        variation_percentage=1.0,
        batch_size=batch,
    )
    me = MAPElites(scoring_function=scoring, emitter=emitter, metrics_function=lambda repertoire: {})
    lo, hi = RANGE
    axes = [lo + (np.arange(b) + 0.5) * (hi - lo) / b for b in BINS]
    mesh = np.meshgrid(*axes, indexing="ij")
    centroids = jnp.asarray(np.stack([m.reshape(-1) for m in mesh], 1), jnp.float32)
    t0 = time.perf_counter()
    repertoire, emitter_state, _ = me.init(jnp.zeros((1, DIM)), centroids, jax.random.key(seed))

    @functools.partial(jax.jit, donate_argnums=(0,))
    def call(carry):
        return jax.lax.scan(me.scan_update, carry, None, length=PER_CALL)[0]

    carry, calls = (repertoire, emitter_state, jax.random.key(seed + 1)), []
    for _ in range(evals // batch // PER_CALL):
        start = time.perf_counter()
        carry = jax.block_until_ready(call(carry))
        calls.append(time.perf_counter() - start)
    fitness = np.asarray(carry[0].fitnesses).reshape(-1)
    return {
        "evaluations": 1 + len(calls) * PER_CALL * batch,
        "qd_score": float(fitness[np.isfinite(fitness)].sum()),
        "steady_evals_per_s": PER_CALL * batch / statistics.median(calls[1:]),
        "wall_s": time.perf_counter() - t0,
    }


def whole_process(seed: int, evals: int, batch: int) -> dict:
    """Wall seconds of pyribs's script and of qd-run with an empty compilation cache, each a fresh
    interpreter (``map_elites.whole_process``, which also runs qd-run with the cache warm)."""
    runs = map_elites.whole_process(seed, evals, batch)
    return {"pyribs": runs["pyribs"]["wall_s"], "qd": runs["qd, empty cache"]["wall_s"]}


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.4g} [{min(xs):,.4g}, {max(xs):,.4g}]"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--evals", type=int, default=102_400)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--processes", type=int, default=3, help="whole-process runs (seeds 0..N-1)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    task = load_task("sphere", {"dim": DIM})
    rows: dict[str, list[dict]] = {"pyribs": [], "qd device": [], "qd fused loop alone": [], "QDax": []}
    run_qd_device(99, PER_CALL * args.batch * 2, args.batch)  # warm the imports (each build compiles anew)
    for seed in range(args.seeds):
        order = [
            ("pyribs", lambda: run_pyribs(task, seed, args.evals, args.batch, [args.evals])),
            ("qd device", lambda: run_qd_device(seed, args.evals, args.batch)),
            ("qd fused loop alone", lambda: run_qd_fused(seed, args.evals, args.batch)),
            ("QDax", lambda: run_qdax(seed, args.evals, args.batch)),
        ]
        for name, fn in order[seed % 4 :] + order[: seed % 4]:  # rotate who goes first
            r = fn()
            if name == "pyribs":
                r = {
                    "evaluations": r["evaluations"],
                    "qd_score": r["curve"][args.evals]["qd_score"],
                    "steady_evals_per_s": r["evaluations"] / r["wall_s"],
                    "wall_s": r["wall_s"],
                }
            rows[name].append(r)
            print(
                f"seed {seed} {name}: {r['steady_evals_per_s']:,.0f} evals/s, QD score {r['qd_score']:,.0f}",
                flush=True,
            )
    procs = [whole_process(s, args.evals, args.batch) for s in range(args.processes)]
    for p in procs:
        print(f"whole process: pyribs {p['pyribs']:.2f}s qd {p['qd']:.2f}s", flush=True)
    rate = {k: statistics.median(r["steady_evals_per_s"] for r in v) for k, v in rows.items()}
    proc = {k: statistics.median(p[k] for p in procs) for k in ("pyribs", "qd")}
    lines = [
        "| system | evaluations | evaluations/s after compilation | QD score (median [min, max]) |",
        "|---|---:|---:|---:|",
        *(
            f"| {k} | {v[0]['evaluations']:,} | {med([r['steady_evals_per_s'] for r in v])} | "
            f"{med([r['qd_score'] for r in v])} |"
            for k, v in rows.items()
        ),
        "",
        f"- after compilation: qd/pyribs **{rate['qd device'] / rate['pyribs']:.2f}x** (target >= 5x), "
        f"qd/QDax **{rate['qd device'] / rate['QDax']:.2f}x** (target >= 2x); the fused loop alone (as "
        f"QDax's row runs): qd/pyribs **{rate['qd fused loop alone'] / rate['pyribs']:.2f}x**, "
        f"qd/QDax **{rate['qd fused loop alone'] / rate['QDax']:.2f}x**",
        f"- whole process (median of {args.processes}, fresh interpreter, no compilation cache): pyribs "
        f"{med([p['pyribs'] for p in procs])} s, qd {med([p['qd'] for p in procs])} s: "
        f"pyribs/qd **{proc['pyribs'] / proc['qd']:.2f}x** (target >= 1.5x)",
    ]
    text = "\n".join(lines)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "processes": procs}, indent=1))
    return {"rows": rows, "processes": procs, "table": text}


if __name__ == "__main__":
    main()
