"""What the search-quality benchmarks share: one model server whose access log counts every
run's LLM calls alike, each run in a fresh child process, function_fit programs scored exactly
as qd's cascade scores them (in a limited child interpreter), and one descriptor grid that
turns any system's programs into a QD score.

``bench/smol_quality.py`` (qd vs OpenEvolve) and ``bench/quality.py`` (every system, three
tasks) import it; only the standard library at module level, so an evaluator running in a
peer's own interpreter can import it too.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIMITS = {"wall_s": 5.0, "cpu_s": 5, "memory_mb": 512}  # conf/experiment/function_fit.yaml sandbox

_RUNNER = r"""
import importlib.util, json, sys
req = json.load(sys.stdin)
spec = importlib.util.spec_from_file_location("ff_entry", req["entry"])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
try:
    out = {"value": mod.run(req["text"], req["xs"])}
except BaseException as e:
    out = {"error": f"{type(e).__name__}: {e}"[:500]}
sys.stdout.write("\n@@RESULT@@" + json.dumps(out))
"""


@functools.cache
def function_fit_task(target: str = "quadratic"):
    """The function_fit task with this target (built once per process: it draws its points)."""
    from experiments.function_fit.task import FunctionFitTask

    return FunctionFitTask(target=target)


def limit_child(cpu_s: int = LIMITS["cpu_s"], memory_mb: int = LIMITS["memory_mb"]) -> None:
    """A candidate's limits (``preexec_fn``): address space, CPU seconds, no core dump."""
    mem = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def sandboxed(text: str, xs: list[float]) -> tuple[Any, str | None]:
    """entry.run(text, xs) in a fresh, limited interpreter: (value, error)."""
    entry = str(ROOT / "experiments" / "function_fit" / "entry.py")
    with tempfile.TemporaryDirectory(prefix="qd_bench_ev_") as cwd:
        try:
            p = subprocess.run(
                [sys.executable, "-I", "-c", _RUNNER],
                input=json.dumps({"entry": entry, "text": text, "xs": xs}),
                capture_output=True,
                text=True,
                timeout=LIMITS["wall_s"],
                cwd=cwd,
                preexec_fn=limit_child,
                env={"PATH": os.environ.get("PATH", "")},
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {LIMITS['wall_s']:g}s"
    marker = p.stdout.rfind("\n@@RESULT@@")
    if marker < 0:
        return None, f"exited with code {p.returncode}: {p.stderr.strip()[-300:]}"
    out = json.loads(p.stdout[marker + len("\n@@RESULT@@") :])
    return out.get("value"), out.get("error")


def score_program(text: str, target: str = "quadratic") -> dict[str, Any]:
    """qd's evaluation of one function_fit program: the cascade of ``qd.evaluator`` + ``task.score``."""
    task = function_fit_task(target)
    outputs: list[Any] = []
    scored = None
    for i, stage in enumerate(task.stages):
        if i and (not scored.valid or (stage.threshold is not None and scored.fitness < stage.threshold)):
            break
        value, error = sandboxed(text, stage.args["xs"])
        if error is not None:
            return {"fitness": math.nan, "valid": False, "error": f"{stage.name}: {error}", "artifacts": {}}
        outputs.append(value)
        scored = task.score(text, outputs)
    return {
        "fitness": scored.fitness,
        "valid": bool(scored.valid),
        "error": scored.error,
        "metrics": scored.metrics or {},
        "artifacts": scored.artifacts or {},
    }


def run_qd(p: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A qd run of ``overrides`` (an experiment and its variant) on the server at ``p["base_url"]``,
    ``p["calls"]`` LLM calls, run seed ``p["seed"]``: every stored program and qd's own summary."""
    import logging

    from qd.plan import compose
    from qd.run import build_engine
    from qd.store import Store

    for name in ("jax._src.xla_bridge", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    run_dir = Path(p["work"]) / "qd_run"
    run_dir.mkdir(parents=True)
    overrides = [
        *overrides,
        "llm.provider=server",
        f"llm.base_url={p['base_url']}",
        f"llm.models=[{{name: {p['model']}}}]",
        "llm.api_key_env=null",
        f"runner.max_llm_calls={p['calls']}",
        "runner.progress=false",
        f"seed={p['seed']}",
    ]
    cfg = compose(overrides)
    t0 = time.perf_counter()
    engine = build_engine(cfg, run_dir)
    t1 = time.perf_counter()
    try:
        summary = engine.run()
    finally:
        t2 = time.perf_counter()
        engine.close()
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = [
            {
                "text": c.text,
                "fitness": c.fitness,
                "valid": bool(c.valid),
                "llm": c.model is not None,
                "operator": c.operator,
                "error": c.error,
                "descriptor": None if c.descriptor is None else [float(x) for x in c.descriptor],
            }
            for c in store.iter()
        ]
    return {
        "programs": rows,
        "wall_s": t2 - t1,
        "build_s": t1 - t0,
        "own_qd_score": summary["global"]["qd_score"],
        "own_best": summary["global"]["max_fitness"],
        "own_calls": (summary.get("llm") or {}).get("calls"),
        "stop_reason": summary.get("stop_reason"),
        "archive": {
            "bins": list(cfg.archive.bins),
            "lower": list(cfg.archive.lower),
            "upper": list(cfg.archive.upper),
            "qd_offset": cfg.archive.qd_offset,
        },
    }


def calls_in_log(path: Path) -> tuple[int, int]:
    """(chat completion requests, of which not 200) logged so far by the server."""
    n = bad = 0
    with open(path, errors="replace") as f:
        for line in f:
            if '"POST /v1/chat/completions' in line:
                n += 1
                bad += '" 200' not in line
    return n, bad


def run_child(
    system: str,
    params: dict[str, Any],
    count: Callable[[], tuple[int, int]],
    timeout_s: float,
    command: list[str],
) -> dict[str, Any]:
    """One run in a fresh child process (``command`` + the params as JSON; the child writes
    ``result.json`` into ``params["work"]``), its LLM calls counted by the server: ``count()``
    -> (requests so far, of which failed), e.g. ``calls_in_log`` of its access log."""
    work = Path(tempfile.mkdtemp(prefix=f"qd_bench_{system}_s{params['seed']}_"))
    params = {**params, "work": str(work)}
    calls0, bad0 = count()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(work / "child.log", "w") as f:
        proc = subprocess.run(
            [*command, json.dumps(params)], stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=ROOT
        )
    proc_s = time.perf_counter() - t0
    calls1, bad1 = count()
    out_path = work / "result.json"
    if proc.returncode != 0 or not out_path.exists():
        tail = (work / "child.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"{system} seed {params['seed']} failed (rc={proc.returncode}), work dir {work}:\n{tail}"
        )
    out = json.loads(out_path.read_text())
    out.update(
        {
            "system": system,
            "seed": params["seed"],
            "calls": calls1 - calls0,
            "failed_calls": bad1 - bad0,
            "proc_s": proc_s,
            "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "work": str(work),
        }
    )
    return out


def code_descriptor(text: str) -> list[float] | None:
    """(AST nodes, numeric constants) of a program; None if it does not parse."""
    from descriptors.code_metrics import code_metrics

    m = code_metrics(text)
    return None if m is None else [float(m["nodes"]), float(m["constants"])]


def grid_quality(
    programs: list[dict[str, Any]],
    archive: dict[str, Any],
    describe: Callable[[str], list[float] | None] = code_descriptor,
) -> dict[str, Any]:
    """Best fitness per cell of one grid (``archive``: bins, lower, upper, qd_offset) over every
    valid program, each placed by ``describe(text)`` (default: the code-metrics grid's axes)."""
    import numpy as np

    from qd.archive import GridSpec

    spec = GridSpec(tuple(archive["bins"]), tuple(archive["lower"]), tuple(archive["upper"]))
    best_cell: dict[int, float] = {}
    best, best_text, mismatched = -math.inf, None, 0
    keep = [p for p in programs if p["valid"] and p["fitness"] is not None and math.isfinite(p["fitness"])]
    described = [describe(p["text"]) for p in keep]
    keep = [(p, d) for p, d in zip(keep, described) if d is not None]
    if keep:
        desc = np.asarray([d for _, d in keep], np.float32)
        cells = np.asarray(spec.index(desc))
        for (p, _), d, c in zip(keep, desc, cells):
            if p.get("descriptor") is not None and list(map(float, d)) != p["descriptor"]:
                mismatched += 1
            f = float(np.float32(p["fitness"]))  # as the archive stores it
            best_cell[int(c)] = max(best_cell.get(int(c), -math.inf), f)
            if f > best:
                best, best_text = f, p["text"]
    llm = [p for p in programs if p["llm"]]
    seed_fitness = [p["fitness"] for p, _ in keep if not p["llm"]]
    return {
        "best_seed": max(seed_fitness) if seed_fitness else None,
        "best": best if keep else None,
        "best_text": best_text,
        "qd_score": float(sum(f - archive["qd_offset"] for f in best_cell.values())),
        "cells": len(best_cell),
        "programs": len(programs),
        "llm_programs": len(llm),
        "llm_valid": sum(p["valid"] for p in llm),
        "seeds": len(programs) - len(llm),
        "descriptor_mismatch": mismatched,
    }


def start_server(prefix: str) -> tuple[Any, Path, datetime.datetime, float, float]:
    """The shared embedded SmolLM2 server, logging to a fresh temp dir: (server, its log,
    start time, perf_counter at start, 1-min load at start)."""
    from qd.llm.server import EmbeddedServer

    log = Path(tempfile.mkdtemp(prefix=prefix)) / "llm_server.log"
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start, load_start = time.perf_counter(), round(os.getloadavg()[0], 2)
    server = EmbeddedServer(log_path=log)
    server.start()
    print(
        f"server {server.base_url} model {server.model} up in {server.startup_s:.1f}s (log {log})", flush=True
    )
    return server, log, started, t_start, load_start
