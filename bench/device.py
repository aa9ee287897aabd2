#!/usr/bin/env python
"""The device entry point: qd's archive insert and device loop on whatever backend JAX sees, beside QDax.

Needs only jax and numpy (run it as ``PYTHONPATH=. python bench/device.py``); QDax
is measured beside qd when it is importable (``pip install qdax==0.5.0``), on the
same backend in the same process.

* insert: a grid of ``--cells`` (100 x 100 = 10k) cells over [0, 1]^2; each call
  inserts a fresh batch of uniformly random descriptors and fitnesses that is
  already on the device. qd: ``qd.archive.insert_device`` (jitted, archive
  donated, results left on the device). QDax: ``MapElitesRepertoire.add`` under
  ``jax.jit`` with the archive donated, the grid's cell centres as centroids
  (QDax has no grid lookup). Reported: candidates inserted per second.
* device loop: sphere (``experiments/sphere``'s evaluation, its ``evaluate_jax``),
  MAP-Elites with Gaussian mutation (sigma 0.5) over a 100 x 100 grid on
  [-D*5.12/2, D*5.12/2]^2, ``--batch`` children per generation, ``--per-call``
  generations per jitted call (``lax.scan``). qd: ``qd.device.step.device_loop``.
  QDax: ``MAPElites`` with a ``MixingEmitter`` of ``isoline_variation(iso_sigma=0.5,
  line_sigma=0)`` (Gaussian mutation), ``scan_update`` over the same number of
  generations per call, a metrics function that computes nothing (so QDax does no
  per-generation work qd does not). Reported: evaluations per second after
  compilation, and the first call (which compiles) apart.

Each figure is the median of ``--repeats`` timed calls after one untimed warm-up.

Usage::

    PYTHONPATH=. python bench/device.py --quick            # a small CPU run (a test runs it)
    PYTHONPATH=. python bench/device.py                    # the full run (a GPU: under 5 minutes)
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

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.gaussian import gaussian_apply, gaussian_noise  # noqa: E402
from qd import archive  # noqa: E402
from qd.device.step import DeviceOperator, device_loop  # noqa: E402
from qd.task import load_task  # noqa: E402


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


def bench_insert(bins: tuple[int, int], batch: int, calls: int, repeats: int) -> dict:
    spec = archive.GridSpec(bins, (0.0, 0.0), (1.0, 1.0))
    key = jax.random.key(0)
    desc = jax.random.uniform(key, (calls, batch, 2))
    fit = jax.random.uniform(jax.random.key(1), (calls, batch))
    ids = jnp.arange(calls * batch, dtype=jnp.int32).reshape(calls, batch)
    island, valid = jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool)
    out = {"batch": batch, "cells": int(np.prod(bins))}

    box = {"state": archive.init(spec)}

    def qd_calls():
        state = box["state"]
        for c in range(calls):
            state, _ = archive.insert_device(spec, state, island, desc[c], fit[c], ids[c], valid)
        box["state"] = jax.block_until_ready(state)

    first, median = timed(qd_calls, repeats)
    out["qd"] = {"inserts_per_s": calls * batch / median, "first_s": first}
    if qdax_available():
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
    if qdax_available():
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


def report(row: dict, what: str, metric: str, unit: str) -> None:
    """One line: qd's rate, QDax's beside it when measured, their ratio, qd's first (compiling) call."""
    line = f"{what}: qd {row['qd'][metric]:.3g} {unit}"
    if "QDax" in row:
        line += (
            f", QDax {row['QDax'][metric]:.3g} {unit} (qd/QDax {row['qd'][metric] / row['QDax'][metric]:.2f}x"
        )
    else:
        line += " (QDax not installed"
    print(f"{line}; first call qd {row['qd']['first_s']:.2f}s)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a CPU smoke run")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (2 if quick else 5)
    backend = jax.default_backend()
    print(
        f"backend={backend} devices={[d.device_kind for d in jax.devices()]} jax={jax.__version__} "
        f"qdax={'yes' if qdax_available() else 'no'}"
    )
    results = {"backend": backend, "insert": [], "loop": []}
    insert_cases = [(256, 4)] if quick else [(64, 50), (1024, 50), (16384, 20), (262144, 5)]
    for batch, calls in insert_cases:
        row = bench_insert((100, 100), batch, calls, repeats)
        results["insert"].append(row)
        report(row, f"insert grid 10k batch {batch}", "inserts_per_s", "inserts/s")
    loop_cases = [(10, 64, 5)] if quick else [(100, 256, 50), (100, 4096, 50), (100, 65536, 10)]
    for dim, batch, per_call in loop_cases:
        row = bench_loop(dim, batch, per_call, repeats)
        results["loop"].append(row)
        report(row, f"device loop sphere {dim}-D batch {batch}", "evaluations_per_s", "evaluations/s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
