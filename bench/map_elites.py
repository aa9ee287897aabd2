#!/usr/bin/env python
"""MAP-Elites on the 100-D sphere: qd's engine vs pyribs, side by side in one process.

Both systems run the same algorithm on the same task, for the same evaluation
budget and batch size, over the same seeds:

* task: ``experiments/sphere`` (``make_task(dim=100)``): fitness normalized to
  [0, 100], 2 linear-projection descriptors in [-256, 256]^2, a 100x100 grid;
  both systems call the same ``task.evaluate``.
* operator: Gaussian mutation, sigma 0.5, one uniformly sampled elite per child,
  no genome bounds; the first batch starts from the zero vector (qd: the task's
  ``initial`` = zeros; pyribs: ``x0 = 0`` plus the sigma-0.5 noise).
* pyribs: ``GridArchive(solution_dim=100, dims=[100, 100], ranges=[(-256, 256)] * 2)``,
  one ``GaussianEmitter(sigma=0.5, x0=zeros, batch_size=B)``, ``Scheduler``;
  loop ask -> evaluate -> tell.
* qd: the real engine on the host loop, ``qd.run.build_engine(cfg, run_dir)`` from a
  config composed like the tests do (``experiment=sphere operators=gaussian
  runner.loop=host`` with batch B, the same budget, ``runner.progress=false``; the
  device loop, which ``auto`` picks for this task, is ``bench/sphere_loops.py``'s) in
  a temporary run dir, then ``engine.run()`` and ``engine.close()``. Everything a real
  run does is included: every candidate committed to SQLite, one events.jsonl line per
  insert batch, a checkpoint every ``runner.checkpoint_every`` batches.
  ``runner.in_flight`` defaults to 1 here (one batch at a time, the same sequential
  algorithm as pyribs's ask/tell); the config default (2) is run as an extra variant.

QD score follows pyribs (sum of elite fitness, offset 0). pyribs's curve is read
from ``archive.stats`` after each ``tell``; qd's from its ``events.jsonl`` (one line
per insert batch with ``evaluations`` and ``global.qd_score``).

Timing: wall clock per run; pyribs from archive construction to the last tell, qd
from ``build_engine`` to ``engine.close()`` (hydra's config compose is timed apart).
Seeds alternate which system goes first. The first qd run of the process pays
JAX's jit compilation; it is reported apart (time to the first two insert batches,
first run vs the others). After the timed runs, one extra qd run (seed 0) runs
under cProfile (top functions are printed).

Whole process (``--whole N``, issue 32): a fresh interpreter per run, N repeats (seeds
0..N-1, who goes first rotating), 102,400 evaluations by default: pyribs's loop as a script
(its imports included) beside ``python -m qd.run experiment=sphere ...`` (the device loop,
everything a run writes) twice in a row, first with an EMPTY JAX compilation cache (a new
``QD_COMPILE_CACHE`` folder: XLA compiles the fused step), then with that folder WARM (the
second run compiles nothing). Besides the wall clock it reads the real run after
compilation from the same processes: pyribs's loop (the script times it after its
imports), qd's evaluations between its first and last ``commit`` event (the first call
compiles). The 1-min load average is recorded before and after: the machine is shared,
so the ratios (both sides suffer alike) are what to read.

Usage::

    python bench/map_elites.py                      # full run (~7 min on 2 shared cores)
    python bench/map_elites.py --quick              # smoke run (~1 min)
    python bench/map_elites.py --results bench/RESULTS.md   # also write the section
    python bench/map_elites.py --whole 5 --results bench/RESULTS.md   # whole process (~3 min)
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import logging
import os
import platform
import pstats
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from ribs.archives import GridArchive  # noqa: E402
from ribs.emitters import GaussianEmitter  # noqa: E402
from ribs.schedulers import Scheduler  # noqa: E402

import qd.archive as qa  # noqa: E402
from qd.plan import compose  # noqa: E402
from qd.run import build_engine  # noqa: E402
from qd.task import load_task  # noqa: E402

logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)

from _results import commit as _results_commit  # noqa: E402  (bench/ is on sys.path)
from _results import write_section  # noqa: E402

SECTION_TITLE = "## MAP-Elites on sphere 100-D (bench/map_elites.py)"
WHOLE_TITLE = (
    "## Sphere 100-D as a whole process, empty and warm compilation cache (bench/map_elites.py --whole)"
)
DIM = 100
SIGMA = 0.5
BINS = (100, 100)
RANGE = (-256.0, 256.0)
FRACTIONS = (0.10, 0.25, 0.50, 1.00)


# --------------------------------------------------------------------------- runs


def checkpoints(evals: int, batch: int) -> list[int]:
    """Evaluation counts at which the curves are read (multiples of the batch)."""
    return [max(batch, int(round(f * evals / batch)) * batch) for f in FRACTIONS]


def run_pyribs(task: Any, seed: int, evals: int, batch: int, marks: list[int]) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    archive = GridArchive(solution_dim=DIM, dims=list(BINS), ranges=[RANGE] * 2, seed=seed)
    emitter = GaussianEmitter(archive, sigma=SIGMA, x0=np.zeros(DIM), batch_size=batch, seed=seed)
    scheduler = Scheduler(archive, [emitter])
    curve: dict[int, dict[str, float]] = {}
    done, eval_s, first_batch_s = 0, 0.0, None
    pending = list(marks)
    while done < evals:
        x = scheduler.ask()
        te = time.perf_counter()
        ev = task.evaluate(x)
        eval_s += time.perf_counter() - te
        scheduler.tell(ev.fitness, ev.descriptor)
        done += len(x)
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t0
        while pending and done >= pending[0]:
            s = archive.stats
            curve[pending.pop(0)] = {
                "qd_score": float(s.qd_score),
                "coverage": float(s.coverage),
                "best": float(s.obj_max),
            }
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "evaluations": done,
        "eval_s": eval_s,
        "first_batch_s": first_batch_s,
        "curve": curve,
    }


def qd_config(seed: int, evals: int, batch: int, in_flight: int):
    return compose(
        [
            "experiment=sphere",
            "operators=gaussian",
            f"operators.mix.0.sigma={SIGMA}",
            f"experiment.params.dim={DIM}",
            f"runner.batch_size={batch}",
            f"runner.max_evaluations={evals}",
            f"runner.in_flight={in_flight}",
            "runner.evaluator=inprocess",
            "runner.progress=false",
            f"seed={seed}",
            "runner.loop=host",
        ]
    )


def read_events(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_qd(
    seed: int,
    evals: int,
    batch: int,
    in_flight: int,
    marks: list[int],
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    tc = time.perf_counter()
    cfg = qd_config(seed, evals, batch, in_flight)
    compose_s = time.perf_counter() - tc
    run_dir = Path(tempfile.mkdtemp(prefix="qd_map_elites_"))
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)  # as qd.run.run_in does
        engine = build_engine(cfg, run_dir)
        built_s = time.perf_counter() - t0
        run_start_epoch = time.time()
        tr = time.perf_counter()
        if profile is not None:
            profile.enable()
        summary = engine.run()
        if profile is not None:
            profile.disable()
        run_s = time.perf_counter() - tr
        engine.close()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        events = read_events(run_dir / "events.jsonl")
        footprint = dir_bytes(run_dir)
        with sqlite3.connect(run_dir / "store.sqlite") as db:
            rows = db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    curve: dict[int, dict[str, float]] = {}
    for m in marks:
        e = next(e for e in events if e["evaluations"] >= m)
        g = e["global"]
        curve[m] = {
            "qd_score": g["qd_score"],
            "coverage": g["coverage"],
            "best": g["max_fitness"],
            "at": e["evaluations"],
        }
    times = np.array([e["time"] for e in events])
    gaps = np.diff(times)
    steady = gaps[len(gaps) // 2 :] if len(gaps) >= 4 else gaps
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "compose_s": compose_s,
        "build_s": built_s,
        "run_s": run_s,
        "evaluations": summary["evaluations"],
        "stored_rows": rows,
        "batches": len(events),
        "first2_s": float(times[min(1, len(times) - 1)] - run_start_epoch),
        "steady_batch_ms": float(np.median(steady) * 1e3) if len(steady) else float("nan"),
        "final": summary["global"],
        "curve": curve,
        "run_dir_bytes": footprint,
    }


# --------------------------------------------------------------------------- whole process

PYRIBS_SCRIPT = """
import sys, time
import numpy as np
from ribs.archives import GridArchive
from ribs.emitters import GaussianEmitter
from ribs.schedulers import Scheduler
sys.path.insert(0, {root!r})
from qd.task import load_task
task = load_task("sphere", {{"dim": {dim}}})
t0 = time.perf_counter()
archive = GridArchive(solution_dim={dim}, dims={bins}, ranges=[{range}] * 2, seed={seed})
emitter = GaussianEmitter(archive, sigma={sigma}, x0=np.zeros({dim}), batch_size={batch}, seed={seed})
scheduler = Scheduler(archive, [emitter])
for _ in range({evals} // {batch}):
    x = scheduler.ask()
    ev = task.evaluate(x)
    scheduler.tell(ev.fitness, ev.descriptor)
print("loop_s", time.perf_counter() - t0)
print("qd_score", float(archive.stats.qd_score))
"""
PER_CALL = 100  # runner.generations_per_call of the whole-process qd-run


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU (user + system, the process and its threads) seconds of a process, and its stdout."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return wall, now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime, proc.stdout


def pyribs_process(seed: int, evals: int, batch: int, cwd: Path, env: dict[str, str]) -> dict[str, float]:
    """pyribs's loop in a fresh interpreter: wall clock (imports included) and the loop alone."""
    script = PYRIBS_SCRIPT.format(
        root=str(ROOT),
        dim=DIM,
        bins=list(BINS),
        range=tuple(RANGE),
        seed=seed,
        sigma=SIGMA,
        batch=batch,
        evals=evals,
    )
    wall, cpu, out = _timed([sys.executable, "-c", script], cwd, env)
    said = dict(line.split() for line in out.splitlines() if line.strip())
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "evals_per_s": evals / float(said["loop_s"]),
        "qd_score": float(said["qd_score"]),
    }


def qd_process(seed: int, evals: int, batch: int, run_dir: Path, env: dict[str, str]) -> dict[str, float]:
    """``qd-run experiment=sphere`` in a fresh interpreter: wall clock, and evaluations/s between
    its first and last commit events (after the first call, which compiles)."""
    argv = [
        sys.executable,
        "-m",
        "qd.run",
        "experiment=sphere",
        f"runner.batch_size={batch}",
        f"runner.max_evaluations={evals}",
        f"runner.generations_per_call={PER_CALL}",
        "runner.progress=false",
        f"seed={seed}",
        f"hydra.run.dir={run_dir}",
        "--json",
    ]
    wall, cpu, out = _timed(argv, run_dir.parent, env)
    end = json.loads(out.strip().splitlines()[-1])
    commits = [e for e in read_events(run_dir / "events.jsonl") if e.get("event", "commit") == "commit"]
    first, last = commits[0], commits[-1]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "evals_per_s": (last["evaluations"] - first["evaluations"]) / (last["time"] - first["time"]),
        "qd_score": end["global"]["qd_score"],
    }


def whole_process(seed: int, evals: int, batch: int) -> dict[str, dict[str, float]]:
    """pyribs, then qd-run with an empty compilation cache, then qd-run with it warm (pyribs last
    on odd seeds), each a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="qd_whole_") as tmp:
        tmp = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        env.update(PYTHONPATH=str(ROOT), QD_COMPILE_CACHE=str(tmp / "jax"))  # empty: nothing compiled yet
        out = {}
        runs = [
            ("qd, empty cache", lambda: qd_process(seed, evals, batch, tmp / "empty", env)),
            ("qd, warm cache", lambda: qd_process(seed, evals, batch, tmp / "warm", env)),
        ]
        pyribs = ("pyribs", lambda: pyribs_process(seed, evals, batch, tmp, env))
        for name, fn in [pyribs, *runs] if seed % 2 == 0 else [*runs, pyribs]:
            out[name] = fn()
    return out


def whole_main(repeats: int, evals: int, batch: int, results: Path | None, cmd: str) -> int:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()[0]
    runs = []
    for seed in range(repeats):
        runs.append(whole_process(seed, evals, batch))
        print(
            f"seed {seed}: " + ", ".join(f"{k} {v['wall_s']:.2f}s" for k, v in runs[-1].items()), flush=True
        )
    load1 = os.getloadavg()[0]
    names = list(runs[0])
    wall = {k: statistics.median(r[k]["wall_s"] for r in runs) for k in names}
    rate = {k: statistics.median(r[k]["evals_per_s"] for r in runs) for k in names}
    out = [WHOLE_TITLE, ""]
    out.append(f"- Command: `{cmd}`, commit {_results_commit()}")
    out.append(f"- Date: {date}; 1-min load average {load0:.1f} before, {load1:.1f} after")
    out.append(f"- Machine: {machine()}")
    out.append(f"- Versions: {versions()}")
    out.append(
        f"- Setup: sphere 100-D, 100x100 grid, Gaussian sigma {SIGMA}, batch {batch}, {evals:,} "
        f"evaluations, seeds 0..{repeats - 1}; each run a fresh interpreter. pyribs: its loop as a script "
        f"(imports included). qd: `python -m qd.run experiment=sphere runner.batch_size={batch} "
        f"runner.max_evaluations={evals} runner.generations_per_call={PER_CALL} runner.progress=false "
        "seed=S --json` (device loop; store, checkpoints, events, elites.jsonl all included), first "
        "with an empty `QD_COMPILE_CACHE` folder, then again with it warm. After compilation: pyribs's "
        "loop; qd between its first and last commit event. Medians [min, max] over seeds."
    )
    out.append("")
    cpu = {k: statistics.median(r[k]["cpu_s"] for r in runs) for k in names}
    out.append(
        "| system | whole process s | pyribs/qd | CPU s | pyribs/qd | evaluations/s after compilation "
        "| qd/pyribs | QD score |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in names:
        w, c = [r[k]["wall_s"] for r in runs], [r[k]["cpu_s"] for r in runs]
        e, q = [r[k]["evals_per_s"] for r in runs], [r[k]["qd_score"] for r in runs]
        out.append(
            f"| {k} | {med_range(w, '.2f')} | {wall['pyribs'] / wall[k]:.2f}x | {med_range(c, '.2f')} | "
            f"{cpu['pyribs'] / cpu[k]:.2f}x | {med_range(e, ',.0f')} | {rate[k] / rate['pyribs']:.2f}x | "
            f"{med_range(q, ',.0f')} |"
        )
    out.append("")
    out.append(
        "Per seed, pyribs/qd whole process (empty cache): "
        + ", ".join(f"{r['pyribs']['wall_s'] / r['qd, empty cache']['wall_s']:.2f}x" for r in runs)
        + "; warm cache: "
        + ", ".join(f"{r['pyribs']['wall_s'] / r['qd, warm cache']['wall_s']:.2f}x" for r in runs)
        + "."
    )
    section = "\n".join(out)
    print(section)
    if results:
        write_section(results, WHOLE_TITLE, section)
        print(f"wrote section to {results}")
    return 0


def med_range(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} [{format(min(xs), fmt)}, {format(max(xs), fmt)}]"


def verdict(p_final: list[float], q_final: list[float], p_wall: list[float], q_wall: list[float]):
    overlap = min(q_final) <= max(p_final) and min(p_final) <= max(q_final)
    spread = max(max(p_final) - min(p_final), max(q_final) - min(q_final))
    diff = statistics.median(q_final) - statistics.median(p_final)
    noise_ok = overlap or abs(diff) < 2 * spread
    faster = statistics.median(q_wall) < statistics.median(p_wall)
    return noise_ok, faster, overlap, spread, diff


# --------------------------------------------------------------------------- main


def versions() -> str:
    import jaxlib
    import ribs

    return (
        f"Python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__} "
        f"(backend {jax.default_backend()}), ribs {ribs.__version__}, numpy {np.__version__}, "
        f"SQLite {sqlite3.sqlite_version}"
    )


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{n} cores ({cpu}), {platform.system()} {platform.release()}, shared and noisy"


def git_commit() -> str:
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (ROOT / ".git" / ref[5:]).read_text().strip()[:10]
        return ref[:10]
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 12,800 evaluations")
    ap.add_argument("--evals", type=int, default=None, help="evaluations per run (default 204,800)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5)")
    ap.add_argument(
        "--variant-in-flight",
        type=int,
        default=2,
        help="also run qd with this runner.in_flight (the config default); 0 = skip",
    )
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run and micro-measurements")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"write the markdown section '{SECTION_TITLE}' into this file",
    )
    ap.add_argument("--json", type=Path, default=None, help="also dump raw results here")
    ap.add_argument(
        "--whole",
        type=int,
        default=0,
        metavar="N",
        help="whole-process mode: N repeats of pyribs vs qd-run (empty, then warm compilation cache)",
    )
    args = ap.parse_args(argv)
    cmd = "python bench/map_elites.py" + "".join(" " + a for a in (sys.argv[1:] if argv is None else argv))
    if args.whole:
        return whole_main(args.whole, args.evals or 102_400, args.batch, args.results, cmd)
    # an empty compilation cache of the process's own: its first qd run compiles, as reported apart
    os.environ["QD_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="qd_map_elites_jax_")
    evals = args.evals or (12_800 if args.quick else 204_800)
    seeds = list(range(args.seeds or (2 if args.quick else 5)))
    batch = args.batch
    if evals % batch:
        ap.error("--evals must be a multiple of --batch")
    marks = checkpoints(evals, batch)
    started = time.perf_counter()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    task = load_task("sphere", {"dim": DIM, "function": "sphere"})

    runs: dict[str, list[dict[str, Any]]] = {"pyribs": [], "qd": []}
    variant = f"qd in_flight={args.variant_in_flight}" if args.variant_in_flight else None
    if variant:
        runs[variant] = []
    for seed in seeds:
        order = ["pyribs", "qd"] if seed % 2 == 0 else ["qd", "pyribs"]
        for system in order:
            if system == "pyribs":
                r = run_pyribs(task, seed, evals, batch, marks)
            else:
                r = run_qd(seed, evals, batch, 1, marks)
            r["seed"] = seed
            runs[system].append(r)
            print(
                f"seed {seed} {system:7s} wall {r['wall_s']:7.2f}s  "
                f"qd_score {r['curve'][marks[-1]]['qd_score']:10.1f}  "
                f"coverage {r['curve'][marks[-1]]['coverage']:.4f}",
                flush=True,
            )
        if variant:
            r = run_qd(seed, evals, batch, args.variant_in_flight, marks)
            r["seed"] = seed
            runs[variant].append(r)
            print(
                f"seed {seed} {variant} wall {r['wall_s']:7.2f}s  "
                f"qd_score {r['curve'][marks[-1]]['qd_score']:10.1f}",
                flush=True,
            )

    profile_text, micro = None, None
    if not args.no_profile:
        prof = cProfile.Profile()
        r = run_qd(seeds[0], evals, batch, 1, marks, profile=prof)
        profile_text = profile_excerpt(prof, r["run_s"])
        print(f"cProfile qd run: run {r['run_s']:.2f}s", flush=True)
        micro = micro_measurements(batch)

    total_s = time.perf_counter() - started
    section = render(
        runs, marks, evals, batch, seeds, variant, profile_text, micro, cmd, date, total_s, args.quick
    )
    print()
    print(section)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "marks": marks}, indent=1, default=str))
    if args.results:
        write_section(args.results, SECTION_TITLE, section)
        print(f"wrote section to {args.results}")
    return 0


MICRO_REPS = 200


def micro_measurements(batch: int) -> list[tuple[str, float]]:
    """What the engine's per-batch store write and event summary cost, vs leaner forms."""
    from qd.store import Candidate, Store

    def ms(fn) -> float:
        fn()
        ts = []
        for _ in range(MICRO_REPS):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return 1e3 * statistics.median(ts)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, DIM)).astype(np.float32)
    d = rng.uniform(-200, 200, size=(batch, 2)).astype(np.float32)
    f = rng.uniform(0, 100, size=batch).astype(np.float32)
    pid = np.zeros((batch, 1), np.int64)
    tmp = Path(tempfile.mkdtemp(prefix="qd_map_elites_micro_"))
    try:
        store = Store(tmp / "store.sqlite")

        def candidates():
            return [
                Candidate(
                    kind="vector",
                    island=0,
                    fitness=float(f[j]),
                    descriptor=d[j],
                    valid=True,
                    vector=x[j],
                    parent_ids=pid[j],
                    operator="gaussian",
                )
                for j in range(batch)
            ]

        built = ms(candidates)
        add = ms(lambda: store.add(candidates())) - built
        store.close()
        db = sqlite3.connect(tmp / "raw.sqlite")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE c (id INTEGER PRIMARY KEY, vector BLOB, descriptor BLOB, "
            "fitness REAL, parent_ids TEXT, island INTEGER, valid INTEGER)"
        )
        next_id = [0]

        def raw():
            rows = [
                (next_id[0] + j, x[j].tobytes(), d[j].tobytes(), float(f[j]), "[0]", 0, 1)
                for j in range(batch)
            ]
            with db:
                db.executemany("INSERT INTO c VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            next_id[0] += batch

        lean = ms(raw)
        db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    spec = qa.GridSpec(BINS, (RANGE[0],) * 2, (RANGE[1],) * 2)
    state = qa.init(spec, 1, 2)
    state, _ = qa.insert(spec, state, 0, d, f, np.arange(batch), None)
    s = qa.stats(state, 0.0)
    fields = qa.ArchiveStats._fields
    per_element = ms(lambda: [{k: float(getattr(s, k)[i]) for k in fields} for i in range(2)])
    one_get = ms(lambda: [{k: float(v[i]) for k, v in jax.device_get(s)._asdict().items()} for i in range(2)])
    return [
        (f"`Store.add` of {batch} candidates (as the engine calls it, excl. building them)", add),
        (f"building the {batch} `Candidate` objects", built),
        (f"plain `executemany` of the same {batch} rows (7 columns, one transaction, WAL)", lean),
        ("stats read, one `float(x[i])` per field (1 island)", per_element),
        ("the same read after one `jax.device_get(stats)` (what the engine does)", one_get),
    ]


def profile_excerpt(prof: cProfile.Profile, run_s: float, top: int = 18) -> str:
    stream = io.StringIO()
    st = pstats.Stats(prof, stream=stream)
    st.sort_stats("cumulative").print_stats(
        r"qd/|operators/|experiments/|sqlite|json|jax/_src/(array|random/core|numpy/indexing)", top
    )
    lines = stream.getvalue().splitlines()
    keep, on = [], False
    for ln in lines:
        if ln.strip().startswith("ncalls"):
            on = True
        if on and ln.strip():
            keep.append(ln.replace(str(ROOT) + "/", "").replace(sys.prefix + "/", ""))
    return (
        f"cProfile of one qd run (seed 0, engine.run() {run_s:.1f}s under the profiler), "
        f"sorted by cumulative time:\n\n```\n" + "\n".join(keep) + "\n```"
    )


def render(runs, marks, evals, batch, seeds, variant, profile_text, micro, cmd, date, total_s, quick) -> str:
    out: list[str] = [SECTION_TITLE, ""]
    out.append(
        f"- Command: `{cmd}` ({'quick smoke run' if quick else 'full run'}, "
        f"{total_s / 60:.1f} min in all), commit `{git_commit()}` plus the working tree"
    )
    out.append(f"- Date: {date}")
    out.append(f"- Machine: {machine()}")
    out.append(f"- Versions: {versions()}")
    out.append(
        f"- Setup: sphere 100-D (`experiments/sphere`, `make_task(dim=100)`), 100x100 grid over "
        f"[-256, 256]^2; Gaussian mutation sigma {SIGMA}; batch {batch}; {evals:,} evaluations "
        f"per run ({evals // batch} batches); seeds {seeds[0]}..{seeds[-1]}. pyribs: GridArchive + "
        f"one GaussianEmitter(x0=0) + Scheduler, ask/evaluate/tell. qd: "
        f"`build_engine(cfg, run_dir)` from `experiment=sphere operators=gaussian "
        f"runner.batch_size={batch} runner.max_evaluations={evals} runner.in_flight=1 "
        f"runner.progress=false seed=S`, then `engine.run()`, `engine.close()` "
        f"(SQLite store, events.jsonl, checkpoint every 50 batches, all included). "
        f"Same `task.evaluate` for both."
    )
    out.append(
        "- QD score: sum of elite fitness (pyribs convention, offset 0; max 10,000 x 100 = 1e6). "
        "Cells: median [min, max] over seeds."
    )
    out.append("")
    systems = ["pyribs", "qd"] + ([variant] if variant else [])
    out.append("| evaluations | system | QD score | coverage % | best fitness |")
    out.append("|---:|---|---:|---:|---:|")
    for m in marks:
        for s in systems:
            c = [r["curve"][m] for r in runs[s]]
            out.append(
                f"| {m:,} ({100 * m / evals:.0f}%) | {s} | "
                f"{med_range([x['qd_score'] for x in c], ',.0f')} | "
                f"{med_range([100 * x['coverage'] for x in c], '.2f')} | "
                f"{med_range([x['best'] for x in c], '.3f')} |"
            )
    out.append("")
    out.append("Wall clock per run (seconds; median [min, max] over seeds):")
    out.append("")
    out.append("| system | wall s | CPU s (process) | evaluations/s (median wall) | notes |")
    out.append("|---|---:|---:|---:|---|")
    for s in systems:
        w = [r["wall_s"] for r in runs[s]]
        rate = evals / statistics.median(w)
        if s == "pyribs":
            ev = statistics.median([r["eval_s"] for r in runs[s]])
            note = f"of which task.evaluate {ev:.2f}s"
        else:
            rs = runs[s]
            note = (
                f"build_engine {statistics.median([r['build_s'] for r in rs]):.2f}s; steady "
                f"{statistics.median([r['steady_batch_ms'] for r in rs]):.1f} ms per insert batch "
                f"of {evals // rs[0]['batches']} candidates ({rs[0]['batches']} batches); "
                f"run dir {statistics.median([r['run_dir_bytes'] for r in rs]) / 2**20:.0f} MiB "
                f"({rs[0]['stored_rows']:,} store rows); hydra compose "
                f"{statistics.median([r['compose_s'] for r in rs]):.2f}s (not in wall)"
            )
        cpu = [r["cpu_s"] for r in runs[s]]
        out.append(f"| {s} | {med_range(w, '.2f')} | {med_range(cpu, '.2f')} | {rate:,.0f} | {note} |")
    out.append("")
    q, p = runs["qd"], runs["pyribs"]
    if len(q) > 1:
        warm = statistics.median([r["first2_s"] for r in q[1:]])
        out.append(
            f"qd one-time JIT compile/startup: the first qd run of the process took "
            f"{q[0]['first2_s']:.2f}s to its first two insert batches (init batch + first "
            f"Gaussian batch: compiles insert, stats, sample, gaussian) vs {warm:.2f}s in the "
            f"later, warm runs (median), i.e. ~{q[0]['first2_s'] - warm:.1f}s of compilation; "
            f"its build_engine took {q[0]['build_s']:.2f}s vs "
            f"{statistics.median([r['build_s'] for r in q[1:]]):.2f}s warm. "
            f"Its total wall was {q[0]['wall_s']:.2f}s (seed {q[0]['seed']}); the other, warm "
            f"qd runs: median {statistics.median([r['wall_s'] for r in q[1:]]):.2f}s vs pyribs "
            f"{statistics.median([r['wall_s'] for r in p[1:]]):.2f}s over the same seeds. "
            f"pyribs's first run: first batch {p[0]['first_batch_s'] * 1e3:.0f} ms, wall "
            f"{p[0]['wall_s']:.2f}s."
        )
        out.append("")
    pf = [r["curve"][marks[-1]]["qd_score"] for r in p]
    qf = [r["curve"][marks[-1]]["qd_score"] for r in q]
    pw, qw = [r["wall_s"] for r in p], [r["wall_s"] for r in q]
    noise_ok, faster, overlap, spread, diff = verdict(pf, qf, pw, qw)
    met = noise_ok and faster
    out.append(
        "**MAP-Elites reaches pyribs's QD score within seed noise in less wall-clock time: "
        f"{'met' if met else 'missed'}** (final QD score qd {statistics.median(qf):,.0f} "
        f"[{min(qf):,.0f}, {max(qf):,.0f}] vs pyribs {statistics.median(pf):,.0f} "
        f"[{min(pf):,.0f}, {max(pf):,.0f}]: median diff {diff:+,.0f}, max seed spread {spread:,.0f}, "
        f"ranges {'overlap' if overlap else 'do not overlap'} -> "
        f"{'within' if noise_ok else 'NOT within'} seed noise; wall clock qd "
        f"{statistics.median(qw):.2f}s vs pyribs {statistics.median(pw):.2f}s median = "
        f"{statistics.median(qw) / statistics.median(pw):.2f}x -> qd {'faster' if faster else 'slower'}; "
        "process CPU time qd/pyribs "
        f"{statistics.median([r['cpu_s'] for r in q]) / statistics.median([r['cpu_s'] for r in p]):.2f}x)."
    )
    out.append("")
    if profile_text:
        out.append(profile_text)
        out.append("")
    if micro:
        out.append(
            f"Micro-measurements of the two largest host costs (batch {batch}, median of "
            f"{MICRO_REPS} calls, same process):"
        )
        out.append("")
        out.append("| operation | ms/call |")
        out.append("|---|---:|")
        for name, ms in micro:
            out.append(f"| {name} | {ms:.3f} |")
        out.append("")
    if variant and runs[variant]:
        nb = runs[variant][0]["batches"]
        out.append(
            f"Note on `{variant}` (the runner's config default): with the in-process "
            f"evaluator nothing in a proposal awaits, so the in-flight proposals finish in "
            f"the same event-loop turn and are committed together: {nb} insert batches of "
            f"{evals // nb} candidates, all parents of a batch sampled from the same archive "
            f"(in effect batch {evals // nb})."
        )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
