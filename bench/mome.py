#!/usr/bin/env python
"""qd's Pareto archive beside QDax's MOME on QDax's MOME example (issue 31).

The task is ``examples/mome.ipynb``'s (``experiments/mo_rastrigin``): two Rastrigin
functions in 100 variables within [-2, 4], centred on 0 and 2.2, both minimised
(maximised negated, as QDax's scorer returns them), descriptor the first two variables,
the notebook's 64 CVT cells, fronts of 50, batches of 100. Both sides get the same
centroids (``qd.archive.centroids.cvt_centroids``), so the archives have equal size.

1. Insert: the time of one insert of a batch of B into C cells x K slots, genomes
   carried (QDax's repertoire holds them): qd's ``pareto.insert_carrying`` jitted with
   the state donated, QDax's ``MOMERepertoire.add`` jitted with the repertoire donated,
   on the same prepared batches (a trade-off between the two optima, so fronts fill).
   Median of ``--calls`` calls after ``--warm`` calls, per repeat; medians of repeats.
2. Loop: hypervolume at equal evaluations, and the loop's seconds after compilation:
   qd's device loop (``qd.device.step`` over a ``ParetoSpec``, parents drawn uniformly
   over the fronts' members) vs QDax's ``MOME``, with the same variation: the notebook's
   ``MixingEmitter``, ``--crossover`` of each batch by polynomial crossover (a gene
   exchange, ``proportion_var_to_change`` 0.5) and the rest by polynomial mutation
   (``eta`` 1, ``proportion_to_mutate`` 0.6); qd has both as ``operators.polynomial``
   and draws each child's operator by those weights where QDax splits each batch. The
   notebook's ``crossover_percentage`` is 1.0 (the default here): crossover only.
   Both start from 100 uniform genomes
   and run ``--generations`` batches more; the hypervolume (every cell's front's,
   summed: QDax's MOQD score) is computed by ``qd.archive.hypervolume`` for both, from
   one reference point for all runs, derived from all final fronts
   (``qd.archive.hypervolume.derived_reference``) unless ``--reference`` is given (the
   notebook's is -150 per objective, for 100,000 evaluations); medians of ``--repeats`` seeds.

QDax stays out of qd's environment: this script calls itself in ``--qdax-python``
(a venv with ``qdax==0.5.0``; its jax is qd's, 0.10.2) with ``--_qdax`` and reads one
JSON line back. Run from the repository root:

    python -m venv /work/venv-qdax && /work/venv-qdax/bin/pip install qdax==0.5.0
    PYTHONPATH=$PWD python bench/mome.py --qdax-python /work/venv-qdax/bin/python --write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LOWER, UPPER, LAG, DIM = -2.0, 4.0, 2.2, 100
ETA, MUTATE, EXCHANGE = 1.0, 0.6, 0.5  # the notebook's eta, proportion_to_mutate, proportion_var_to_change
TITLE = "## Pareto fronts per cell: qd beside QDax's MOME (bench/mome.py, issue 31)"


def scores(genomes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32[N, 2] maximised objectives and f32[N, 2] descriptors, in numpy (the notebook's scorer)."""

    def rastrigin(z: np.ndarray) -> np.ndarray:
        return 10 * z.shape[1] + np.sum(z * z - 10 * np.cos(2 * np.pi * z), axis=1)

    x = genomes.astype(np.float64)
    values = -np.stack([rastrigin(x), rastrigin(x - LAG)], axis=1)
    return values.astype(np.float32), np.clip(x[:, :2], LOWER, UPPER).astype(np.float32)


def batches(count: int, size: int, seed: int) -> dict[str, np.ndarray]:
    """Genomes on the segment between the optima plus noise (trade-offs: fronts fill),
    their first two variables uniform (every cell is hit)."""
    rng = np.random.default_rng(seed)
    t = rng.random((count, size, 1))
    genomes = t * LAG + rng.normal(0, 0.3, (count, size, DIM))
    genomes[..., :2] = rng.uniform(LOWER, UPPER, (count, size, 2))
    genomes = np.clip(genomes, LOWER, UPPER).astype(np.float32)
    values, descriptors = scores(genomes.reshape(-1, DIM))
    return {
        "genomes": genomes,
        "values": values.reshape(count, size, 2),
        "descriptors": descriptors.reshape(count, size, 2),
    }


def timed_calls(call, count: int, warm: int) -> float:
    """Median seconds of ``call(i)`` (which blocks) over calls ``warm`` .. ``count``."""
    times = []
    for i in range(count):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return float(np.median(times[warm:]))


# ------------------------------------------------------------------ qd's side


def qd_insert(data: dict, centroids: np.ndarray, front: int, warm: int) -> float:
    import jax
    import jax.numpy as jnp

    from qd.archive import pareto
    from qd.archive.cvt import CVTSpec

    spec = pareto.ParetoSpec(CVTSpec(centroids), front_size=front, num_objectives=2)
    size = data["genomes"].shape[1]
    island, ids_of = jnp.zeros(size, jnp.int32), np.arange(size, dtype=np.int32)
    ok = jnp.ones(size, bool)

    @jax.jit
    def insert(state, genomes, batch, descriptor, values, ids):
        state, (genomes,), _ = pareto.insert_carrying(
            spec, state, island, descriptor, values, ids, ok, (pareto.Payload(genomes, batch, 0.0),)
        )
        return state, genomes

    insert = jax.jit(insert, donate_argnums=(0, 1))
    state = pareto.init(spec, 1)
    held = [jnp.zeros((1, len(centroids), front, DIM), jnp.float32)]
    args = [jnp.asarray(data[k]) for k in ("genomes", "descriptors", "values")]

    def call(i: int) -> None:
        nonlocal state
        state, held[0] = insert(state, held[0], args[0][i], args[1][i], args[2][i], ids_of + i * size)
        jax.block_until_ready(held[0])

    return timed_calls(call, len(data["genomes"]), warm)


def qd_loop(
    centroids: np.ndarray, front: int, size: int, generations: int, seed: int, crossover: float
) -> dict:
    import jax

    from operators import make_numeric_operator
    from qd.archive import pareto
    from qd.archive.cvt import CVTSpec
    from qd.device.step import DeviceOperator, device_loop
    from qd.task import load_task

    task = load_task("mo_rastrigin", {"dim": DIM, "lag": LAG})
    spec = pareto.ParetoSpec(CVTSpec(centroids), front_size=front, num_objectives=2)
    ops = [
        (make_numeric_operator("polynomial_crossover", LOWER, UPPER, proportion=EXCHANGE), crossover),
        (
            make_numeric_operator("polynomial_mutation", LOWER, UPPER, eta=ETA, proportion=MUTATE),
            1 - crossover,
        ),
    ]
    loop = device_loop(
        spec,
        task.objectives_jax,
        [DeviceOperator(op.draw, op.apply, op.num_parents, op.params, w) for op, w in ops if w > 0],
        1,
        size,
        DIM,
        task.initial(np.random.default_rng(seed), size),
    )
    total = size * (generations + 1)
    jax.block_until_ready(loop.run(loop.init(seed), 0, total, generations + 1, False)[0])  # compiles
    state = loop.init(seed)
    start = time.perf_counter()
    state = jax.block_until_ready(loop.run(state, generations + 1, total, generations + 1, False)[0])
    seconds = time.perf_counter() - start
    assert int(state.evaluations) == total
    return {"seconds": seconds, "objectives": np.asarray(state.archive.objectives)[0]}


# ------------------------------------------------------------------ QDax's side (its interpreter)


def qdax_child(params: dict) -> dict:
    """Runs in ``--qdax-python``: both measurements on QDax's side."""
    import functools

    import jax
    import jax.numpy as jnp
    from qdax.core.containers.mome_repertoire import MOMERepertoire
    from qdax.core.emitters.mutation_operators import polynomial_crossover, polynomial_mutation
    from qdax.core.emitters.standard_emitters import MixingEmitter
    from qdax.core.mome import MOME

    centroids = jnp.asarray(np.load(params["centroids"]))
    out: dict = {"qdax": __import__("qdax").__version__, "jax": jax.__version__}
    with np.load(params["batches"]) as f:
        data = {k: jnp.asarray(f[k]) for k in f.files}
    front = params["front"]

    add = jax.jit(lambda r, g, d, v: r.add(g, d, v), donate_argnums=(0,))
    times = []
    for _ in range(params["repeats"]):
        # A copy of the centroids: the donated repertoire takes its own with it.
        repertoire = MOMERepertoire.init(
            data["genomes"][0], data["values"][0], data["descriptors"][0], jnp.array(centroids), front
        )
        held = [repertoire]

        def call(i: int, held=held) -> None:
            held[0] = add(held[0], data["genomes"][i], data["descriptors"][i], data["values"][i])
            jax.block_until_ready(held[0].fitnesses)

        times.append(timed_calls(call, len(data["genomes"]), params["warm"]))
    out["insert_s"] = times

    def score(genotypes, key):
        values, descriptors = _jax_scores(genotypes)
        return values, descriptors, {}

    size, loops = params["size"], []
    emitter = MixingEmitter(
        mutation_fn=functools.partial(
            polynomial_mutation, eta=ETA, minval=LOWER, maxval=UPPER, proportion_to_mutate=MUTATE
        ),
        variation_fn=functools.partial(polynomial_crossover, proportion_var_to_change=EXCHANGE),
        variation_percentage=params["crossover"],
        batch_size=size,
    )
    mome = MOME(
        scoring_function=score, emitter=emitter, metrics_function=lambda r: {}, pareto_front_max_length=front
    )
    for seed in params["seeds"]:
        key = jax.random.key(seed)
        key, sub = jax.random.split(key)
        initial = jax.random.uniform(sub, (size, DIM), minval=LOWER, maxval=UPPER, dtype=jnp.float32)
        repertoire, emitter_state, _ = mome.init(initial, centroids, key)
        run = (
            jax.jit(lambda carry: jax.lax.scan(mome.scan_update, carry, (), length=params["generations"])[0])
            .lower((repertoire, emitter_state, key))
            .compile()
        )
        start = time.perf_counter()
        repertoire = jax.block_until_ready(run((repertoire, emitter_state, key))[0])
        loops.append(
            {"seconds": time.perf_counter() - start, "objectives": np.asarray(repertoire.fitnesses).tolist()}
        )
    out["loops"] = loops
    return out


def _jax_scores(genotypes):
    import jax.numpy as jnp

    def rastrigin(z):
        return 10 * z.shape[1] + jnp.sum(z * z - 10 * jnp.cos(2 * jnp.pi * z), axis=1)

    values = -jnp.stack([rastrigin(genotypes), rastrigin(genotypes - LAG)], axis=1)
    return values, jnp.clip(genotypes[:, :2], LOWER, UPPER)


# ------------------------------------------------------------------ both, side by side


def hypervolume_sum(objectives: np.ndarray, reference: np.ndarray) -> float:
    """The sum over cells of each front's hypervolume (QDax's MOQD score), by qd's function."""
    from qd.archive.hypervolume import front_hypervolumes
    from qd.archive.pareto import ParetoState

    values = np.asarray(objectives, np.float64)[None]
    members = np.all(np.isfinite(values), axis=-1)
    state = ParetoState(values, None, np.where(members, 0, -1))
    return float(front_hypervolumes(state, reference).sum())


def qdax_side(args: argparse.Namespace, files: dict, seed: int) -> dict:
    params = {
        **files,
        "front": args.front,
        "size": args.batch,
        "warm": args.warm,
        "repeats": 1,
        "generations": args.generations,
        "crossover": args.crossover,
        "seeds": [seed],
    }
    command = [args.qdax_python, __file__, "--_qdax", json.dumps(params)]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"QDax side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_range(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    v = np.asarray(values) * scale
    return f"{np.median(v):.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qdax-python", required=True, help="an interpreter with qdax==0.5.0")
    ap.add_argument("--cells", type=int, default=64)
    ap.add_argument("--front", type=int, default=50)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--calls", type=int, default=40, help="inserts timed per repeat")
    ap.add_argument("--warm", type=int, default=10, help="inserts before timing (not timed)")
    ap.add_argument("--generations", type=int, default=300, help="batches after the first, per loop")
    ap.add_argument("--repeats", type=int, default=3, help="seeds of the loops, repeats of the inserts")
    ap.add_argument(
        "--crossover", type=float, default=1.0, help="share of children by crossover (the notebook's: 1.0)"
    )
    ap.add_argument(
        "--reference",
        type=float,
        help="per objective, maximised units (the notebook's: -150); default: derived from all final fronts",
    )
    ap.add_argument("--write", action="store_true", help="write the section into bench/RESULTS.md")
    args = ap.parse_args()

    from qd.archive.centroids import cvt_centroids

    centroids = cvt_centroids(args.cells, [LOWER] * 2, [UPPER] * 2, samples=20_000, seed=0).astype(np.float32)
    data = batches(args.calls, args.batch, seed=0)
    reference = None if args.reference is None else np.full(2, args.reference)
    rows: dict[str, dict[str, list]] = {"qd": {}, "QDax": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"centroids": f"{tmp}/centroids.npy", "batches": f"{tmp}/batches.npz"}
        np.save(files["centroids"], centroids)
        np.savez(files["batches"], **data)
        for seed in range(args.repeats):
            sides = [("qd", None), ("QDax", None)]
            for name, _ in sides if seed % 2 == 0 else sides[::-1]:
                if name == "qd":
                    loop = qd_loop(centroids, args.front, args.batch, args.generations, seed, args.crossover)
                    got = {"insert_s": [qd_insert(data, centroids, args.front, args.warm)], "loops": [loop]}
                else:
                    got = qdax_side(args, files, seed)
                row = rows[name]
                row.setdefault("insert_s", []).extend(got["insert_s"])
                for loop in got["loops"]:
                    row.setdefault("loop_s", []).append(loop["seconds"])
                    row.setdefault("fronts", []).append(np.asarray(loop["objectives"], np.float64))
                    members = np.all(np.isfinite(np.asarray(loop["objectives"], np.float64)), axis=-1)
                    row.setdefault("members", []).append(float(members.sum()))
                print(name, seed, {k: v[-1] for k, v in row.items() if k != "fronts"}, flush=True)
    if reference is None:  # one reference for every run of both: the worst of all final fronts
        from qd.archive.hypervolume import derived_reference

        reference = derived_reference(
            np.concatenate([f.reshape(-1, 2) for r in rows.values() for f in r["fronts"]])
        )
    for row in rows.values():
        row["hypervolume"] = [hypervolume_sum(f, reference) for f in row.pop("fronts")]
    evaluations = args.batch * (args.generations + 1)
    speedup = np.median(rows["QDax"]["insert_s"]) / np.median(rows["qd"]["insert_s"])
    table = [
        "| system | ms per insert (median [min, max]) | hypervolume at "
        f"{evaluations:,} evaluations | front members | loop s after compilation |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        table.append(
            f"| {name} | {median_range(row['insert_s'], 1e3, 3)} | {median_range(row['hypervolume'], 1, 0)} "
            f"| {median_range(row['members'], 1, 0)} | {median_range(row['loop_s'])} |"
        )
    table.append(
        f"\nqd's insert: {speedup:.1f}x QDax's at {args.cells} cells x {args.front}, batch {args.batch}."
    )
    print("\n".join(table))
    if args.write:
        write(args, "\n".join(table), reference)


def write(args: argparse.Namespace, table: str, reference: np.ndarray) -> None:
    from _results import commit, versions, write_section

    command = " ".join(["python bench/mome.py", *sys.argv[1:]])
    load, date = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = f"""{TITLE}

- Command: `PYTHONPATH=$PWD {command}`
- Date: {date}, commit {commit()}; load average {load:.1f} at the end
  (2 shared CPU cores; other sessions' benchmarks and tests ran beside it)
- Versions: {versions("jax", "numpy")} for qd; qdax 0.5.0 (its own venv, the same jax) for QDax
- Setup (the script's docstring has it in full): QDax's `examples/mome.ipynb` task, {args.cells} CVT cells
  (the same centroids for both), fronts of {args.front}, batches of {args.batch}; insert: medians over
  {args.calls - args.warm} calls after {args.warm} per repeat, {args.repeats} repeats; loop: {args.repeats}
  seeds, hypervolume summed over cells from the reference {np.round(reference, 1).tolist()} (maximised units),
  computed by `qd.archive.hypervolume` for both. Who goes first alternates per repeat.
  Variation on both sides: {args.crossover:.0%} polynomial crossover (exchange {EXCHANGE}), the rest
  polynomial mutation (eta {ETA}, proportion {MUTATE}), the notebook's parameters.

{table}
"""
    write_section(HERE / "RESULTS.md", TITLE, section)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_qdax":
        print(json.dumps(qdax_child(json.loads(sys.argv[2]))))
    else:
        main()
