#!/usr/bin/env python
"""LLM-loop throughput: qd's engine vs OpenEvolve against the same scripted model, in one run.

Setup (both systems, same run of this script):

* model: ``tests/scripted_llm.py`` in its own process (``ScriptedLLM(...).start(in_process=True)``),
  real HTTP on loopback, a fixed latency (default 100 ms) before every answer. Every
  answer is a small python block ``def f(x): return A * x + B  # k`` with A, B on a
  20x20 lattice and a unique k (so no child ever repeats its parent). One fresh
  server per measured run, so its ``stats()`` (requests, max in flight) are per run.
* evaluation: the trivial program is run for real. qd: ``qd.sandbox.Sandbox`` (the
  entry is ``sandbox_entry`` in this file: exec the text, return ``[f(0), f(1)]``),
  scored on the host: descriptor (A, B) = (f(1) - f(0), f(0)) on a 20x20 grid over
  [0, 10]^2, fitness -(|A - 3| + |B - 7|). OpenEvolve: an evaluator file computing
  the same numbers in its worker (imports the candidate file, as OpenEvolve's own
  examples do), ``feature_dimensions: [a, b]``, 20 bins.
* qd: built as ``qd-run`` builds a text run, directly (there is no trivial text
  experiment config): ``qd.build(task=..., spec=GridSpec,
  operators=[(make_llm_operator("rewrite", client), 1)],
  StagedEvaluator(task, Sandbox(entry, workers=W, limits=Limits())), batch_size=1,
  in_flight=C, budget=Budget(max_evaluations=N), llm=client, checkpoint_every=50,
  progress=False)`` with ``LLMClient(LLMSettings(base_url, (ModelSpec("scripted"),),
  concurrency=C, cache_dir=None))``. Everything a real run does is included (SQLite
  store, events.jsonl, checkpoints). The first run of the process (a short warm-up,
  reported apart) pays JAX's jit compilation; the timed runs do not.
* OpenEvolve (PyPI ``openevolve``): ``OpenEvolve(initial_program, evaluator_file,
  config).run(iterations=N)`` in a child process, config: ``llm.api_base`` = the
  scripted server, one model ``scripted``, dummy key; ``diff_based_evolution: false``
  (full rewrites, the same answer parses); ``evaluator.parallel_evaluations = P``,
  ``cascade_evaluation: false``; everything else default (5 islands, checkpoint every
  100 iterations, INFO logging to its log file).

Measured per run: wall time of ``engine.run()`` / ``controller.run()`` (qd: after the
engine is built; OpenEvolve: including its process-pool start, which happens inside
``run``); candidates = evaluated programs stored (qd: store rows, its seeds included;
OpenEvolve: the children its iterations add to the database, plus the initial program;
migrants' copies are not counted); LLM calls and the
maximum of requests in flight, from the server. "of ideal": (LLM calls x latency /
C) / wall, i.e. LLM calls/s over C / latency (seeds need no call). Engine CPU: the
main process's ``time.process_time()`` (all its threads) over the run / candidates,
and over the first and last quarter of the steady part, candidates C to N - C (from a
hook after each commit; the first C include the seeds and the ramp-up, the last C proposals
start before the drain).
Sandbox: median ``SandboxResult.seconds`` (store ``eval_seconds``) and the CPU of the
sandbox's processes (descendants of this process, from /proc, plus reaped children),
per evaluation. A separate probe times the sandbox alone on the trivial program.

Decomposition (``--decompose C``, default 8): the same qd run with an in-process
stand-in model (the client's interface, same answers after the same latency, no HTTP),
then also with the evaluation in process (no sandbox), and qd's ``LLMClient`` alone
against the server: what the HTTP client, the sandbox's client side and the engine
itself each cost the main process per candidate.

Usage::

    python bench/llm_loop.py                              # 1000 candidates, C 8 64 256, OpenEvolve 8 64,
                                                          # 3 repeats
    python bench/llm_loop.py --candidates 200 --concurrency 8 --openevolve 8 --repeats 1   # smoke run
    python bench/llm_loop.py --results bench/RESULTS.md   # also write the section
    python bench/llm_loop.py --profile 8                  # also cProfile one extra qd run at C=8
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Only the standard library at module level: the scripted server process imports this
# module to unpickle ``reply``, and the sandbox imports it to run ``sandbox_entry``.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "tests", ROOT):  # ROOT first: the project's packages before any module of bench/
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

LATENCY_S = 0.1
TITLE = "## LLM loop throughput (bench/llm_loop.py)"
SEED_PROGRAM = "def f(x):\n    return 0.0 * x + 0.0\n"
LATTICE = 20  # A, B in {0, 0.5, ..., 9.5}
DESCRIPTION = (
    "Write a Python function f(x) = A * x + B that returns a float. "
    "The score is higher the closer A is to 3 and B to 7."
)

# ----- the model's answers (runs in the scripted server's process) -----------------

_COUNTER = itertools.count()


def reply(request: dict) -> str:
    """A fresh small program for every request: A and B walk the 20x20 lattice."""
    k = next(_COUNTER)
    a, b = (k // LATTICE) % LATTICE / 2, k % LATTICE / 2
    return f"Here you go:\n```python\ndef f(x):\n    return {a} * x + {b}  # {k}\n```\n"


def _picklable_reply():
    """``reply`` under a module name the server process can import (not ``__main__``)."""
    if reply.__module__ != "__main__":
        return reply
    import importlib

    return importlib.import_module(Path(__file__).stem).reply  # HERE is on sys.path


# ----- the trivial program's evaluation ------------------------------------------------


def sandbox_entry(text: str) -> list[float]:
    """Runs in the sandbox: the candidate's f at 0 and 1."""
    namespace: dict = {"__name__": "candidate"}
    exec(compile(text, "candidate.py", "exec"), namespace)
    f = namespace["f"]
    return [float(f(0.0)), float(f(1.0))]


def _judge(f0: float, f1: float) -> tuple[float, float, float]:
    a, b = f1 - f0, f0
    return -(abs(a - 3.0) + abs(b - 7.0)), a, b


@dataclasses.dataclass
class LineTask:
    """A trivial text task (qd.task.TextTask): evolve f(x) = A x + B toward A=3, B=7."""

    kind: str = "text"
    descriptor_dim: int = 2
    language: str = "python"
    description: str = DESCRIPTION
    sandbox_entry: str = f"{Path(__file__).resolve()}:sandbox_entry"
    stages: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        from qd.task import Stage

        self.stages = [Stage()]

    def initial(self, rng: Any, n: int) -> list[str]:
        return [SEED_PROGRAM] * n

    def score(self, text: str, outputs: list[Any]) -> Any:
        from qd.task import Scored

        values = outputs[-1]
        if not isinstance(values, list) or len(values) != 2:
            return Scored(math.nan, None, False, error=f"bad output {values!r}")
        fitness, a, b = _judge(*values)
        return Scored(fitness, [a, b], True, {"a": a, "b": b})


OE_EVALUATOR = """\
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    f0, f1 = float(module.f(0.0)), float(module.f(1.0))
    a, b = f1 - f0, f0
    return {"combined_score": -(abs(a - 3.0) + abs(b - 7.0)), "a": a, "b": b}
"""

# ----- process accounting ------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds incl. reaped children) for every readable process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        # fields[0] is state (field 3); utime, stime, cutime, cstime are fields 14..17
        ppid = int(fields[1])
        cpu = sum(int(x) for x in fields[11:15]) / tick
        out[int(name)] = (ppid, cpu)
    return out


def _descendants_cpu(root: int, exclude: set[int]) -> dict[int, float]:
    """CPU seconds of every descendant of ``root``, skipping the subtrees in ``exclude``."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in exclude:
            continue
        out[pid] = table[pid][1]
        stack.extend(children.get(pid, []))
    return out


def _pid_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    entry = _proc_table().get(pid)
    return None if entry is None else entry[1]


def _children_rusage() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class _ChildCPU:
    """CPU of this process's descendants (except ``exclude``) between start() and stop()."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude

    def start(self) -> None:
        self._before = _descendants_cpu(os.getpid(), self.exclude)
        self._reaped = _children_rusage()

    def stop(self) -> float:
        after = _descendants_cpu(os.getpid(), self.exclude)
        live = sum(cpu - self._before.get(pid, 0.0) for pid, cpu in after.items())
        return live + (_children_rusage() - self._reaped)


def _server(latency_s: float):
    from scripted_llm import Rule, ScriptedLLM

    return ScriptedLLM([Rule("", _picklable_reply())], latency_s=latency_s).start(in_process=True)


def _server_pid(server: Any) -> int | None:
    proc = getattr(server, "_proc", None)
    return None if proc is None else proc.pid


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ----- qd ------------------------------------------------------------------------------


class _StandInModel:
    """Decomposition only: the client's interface in process, the same answers after the
    same latency, no HTTP (what the engine costs without the OpenAI client stack)."""

    def __init__(self, latency_s: float):
        from qd.llm import Ledger

        self.ledger, self.latency_s = Ledger(), latency_s
        self.in_flight = self.max_in_flight = 0
        self.down = None  # never down (the engine checks it before each proposal)

    def pick_model(self, rng: Any) -> str:
        return "scripted"

    async def complete(self, messages: list[dict], **kwargs: Any) -> Any:
        from qd.llm import Completion

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self.in_flight -= 1
        text = reply({})
        prompt = sum(len(str(m.get("content", ""))) for m in messages)
        c = Completion(
            text, "scripted", max(1, prompt // 4), max(1, len(text) // 4), 0.0, False, "stop", self.latency_s
        )
        self.ledger.add(c)
        return c

    async def aclose(self) -> None:
        pass


class _InProcessSandbox:
    """Decomposition only: ``sandbox_entry`` called in the loop's process (no isolation)."""

    async def run(self, text: str, args: dict | None = None, *, calls: Any = None) -> Any:
        from qd.sandbox import SandboxResult

        t = time.perf_counter()
        try:
            value, ok, error = sandbox_entry(text, **(args or {})), True, None
        except Exception as e:
            value, ok, error = None, False, f"{type(e).__name__}: {e}"
        return SandboxResult(ok, value, error, "", "", time.perf_counter() - t)

    def close(self) -> None:
        pass


def _build_qd(
    client: Any,
    concurrency: int,
    candidates: int,
    workers: int,
    run_dir: Path,
    checkpoint_every: int,
    in_process_eval: bool = False,
    on_commit: Any = None,
):
    import operators.llm
    import qd.archive
    from qd import Budget, Settings, build
    from qd.evaluator import StagedEvaluator
    from qd.sandbox import Limits, Sandbox

    task = LineTask()
    sandbox = (
        _InProcessSandbox()
        if in_process_eval
        else Sandbox(task.sandbox_entry, workers=workers, limits=Limits())
    )
    return build(
        task=task,
        spec=qd.archive.GridSpec((LATTICE, LATTICE), (0.0, 0.0), (LATTICE / 2, LATTICE / 2)),
        operators=[(operators.llm.make_llm_operator("rewrite", client), 1.0)],
        evaluator=StagedEvaluator(task, sandbox),
        run_dir=run_dir,
        budget=Budget(max_evaluations=candidates),
        llm=client,
        settings=Settings(
            batch_size=1, in_flight=concurrency, checkpoint_every=checkpoint_every, progress=False
        ),
        on_commit=on_commit,
    )


def _llm_client(base_url: str, concurrency: int) -> Any:
    from qd.llm import LLMClient, LLMSettings, ModelSpec

    return LLMClient(
        LLMSettings(
            base_url=base_url, models=(ModelSpec("scripted"),), concurrency=concurrency, cache_dir=None
        )
    )


def run_qd(
    concurrency: int,
    candidates: int,
    latency_s: float,
    workers: int,
    checkpoint_every: int = 50,
    profile: bool = False,
    variant: str = "full",
) -> dict[str, Any]:
    """One qd run; see the module docstring.

    ``variant``: "full" (scripted server over HTTP, real sandbox), "standin" (in-process
    stand-in model, real sandbox) or "bare" (stand-in model, evaluation in process).
    """
    from qd.store import Store

    load = _load()
    server = _server(latency_s) if variant == "full" else None
    run_dir = Path(tempfile.mkdtemp(prefix="bll_qd_"))
    server_pid = _server_pid(server) if server else None
    try:
        t = time.perf_counter()
        client = _llm_client(server.base_url, concurrency) if server else _StandInModel(latency_s)
        marks: list[tuple[int, float, float]] = []  # after each commit: candidates, wall, CPU
        engine = _build_qd(
            client,
            concurrency,
            candidates,
            workers,
            run_dir,
            checkpoint_every,
            in_process_eval=variant == "bare",
            on_commit=lambda e: marks.append((e["evaluations"], time.perf_counter(), time.process_time())),
        )
        build_s = time.perf_counter() - t
        children = _ChildCPU({server_pid} if server_pid else set())
        server_cpu0 = _pid_cpu(server_pid)
        children.start()
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile(time.thread_time)  # the loop thread's CPU, not wall time
        cpu0, t0 = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        try:
            summary = engine.run()
        finally:
            if profiler:
                profiler.disable()
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            sandbox_cpu = children.stop()
            server_cpu = _pid_cpu(server_pid)
            if server:
                stats = server.stats()
            else:
                stats = {"requests": client.ledger.calls, "max_in_flight": client.max_in_flight}
            engine.close()
        with Store(run_dir / "store.sqlite", readonly=True) as store:
            rows = list(store.iter())
    finally:
        if server:
            server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)

    n = len(rows)
    llm_rows = sum(r.model is not None for r in rows)
    eval_s = [r.eval_seconds for r in rows if r.eval_seconds is not None]
    errors: dict[str, int] = {}
    for r in rows:
        if not r.valid:
            key = (r.error or "invalid").splitlines()[0][:100]
            errors[key] = errors.get(key, 0) + 1

    def window_cpu(lo: int, hi: int) -> float | None:
        """Engine CPU per candidate between the commits that reached lo and hi candidates."""
        pts = [(0, cpu0)] + [(c, p) for c, _, p in marks]
        a = next((pt for pt in pts if pt[0] >= lo), None)
        b = next((pt for pt in pts if pt[0] >= hi), None)
        if a is None or b is None or b[0] <= a[0]:
            return None
        return (b[1] - a[1]) / (b[0] - a[0])

    # Flatness: the first and last quarter of the steady part, candidates C..n-C (the
    # first C hold the seeds and the ramp-up; the last C proposals started before the drain).
    lo, hi = (concurrency, n - concurrency) if n - 2 * concurrency >= n // 4 else (0, n)
    q = (hi - lo) // 4

    out = {
        "system": "qd" if variant == "full" else f"qd ({variant})",
        "concurrency": concurrency,
        "candidates": n,
        "llm_children": llm_rows,
        "valid": sum(r.valid for r in rows),
        "errors": errors,
        "requests": stats["requests"],
        "max_in_flight": stats["max_in_flight"],
        "wall_s": wall,
        "build_s": build_s,
        "cand_per_s": n / wall,
        "of_ideal": stats["requests"] * latency_s / concurrency / wall,
        "engine_cpu_ms": 1e3 * cpu / n if n else None,
        "engine_cpu_q1_ms": _ms(window_cpu(lo, lo + q)),
        "engine_cpu_q4_ms": _ms(window_cpu(hi - q, hi)),
        "steady_window": [lo, hi],
        "sandbox_s_median": statistics.median(eval_s) if eval_s else None,
        "sandbox_cpu_ms": 1e3 * sandbox_cpu / len(eval_s) if eval_s else None,
        "total_cpu_ms": 1e3 * (cpu + sandbox_cpu) / n if n else None,
        "server_cpu_s": None if server_cpu is None or server_cpu0 is None else server_cpu - server_cpu0,
        "stop_reason": summary.get("stop_reason"),
        "load": load,
        "workers": workers,
    }
    if profiler:
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(25)
        out["profile"] = _trim_profile(buf.getvalue())
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def _trim_profile(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    keep = [
        ln.replace(str(ROOT) + "/", "").replace(sys.prefix + "/", "") for ln in lines[start:] if ln.strip()
    ]
    head = next((ln.strip() for ln in lines if "function calls" in ln), "")
    return "\n".join([head, *keep])


def client_probe(concurrency: int, calls: int, latency_s: float) -> dict[str, Any]:
    """qd's ``LLMClient`` alone: ``calls`` chat calls, ``concurrency`` at once, against the server."""
    server = _server(latency_s)
    messages = [
        {"role": "system", "content": "You write python."},
        {"role": "user", "content": DESCRIPTION + "\n" + SEED_PROGRAM * 8},
    ]
    try:

        async def main() -> dict[str, Any]:
            client = _llm_client(server.base_url, concurrency)
            try:
                await asyncio.gather(*(client.complete(messages, sample_index=i) for i in range(concurrency)))
                cpu0, t0 = time.process_time(), time.perf_counter()
                await asyncio.gather(*(client.complete(messages, sample_index=i) for i in range(calls)))
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            finally:
                await client.aclose()
            return {
                "concurrency": concurrency,
                "calls": calls,
                "per_s": calls / wall,
                "of_ideal": calls * latency_s / concurrency / wall,
                "cpu_ms": 1e3 * cpu / calls,
            }

        out = asyncio.run(main())
        out["max_in_flight"] = server.stats()["max_in_flight"]
        return out
    finally:
        server.stop()


def sandbox_probe(workers: int, calls: int) -> dict[str, Any]:
    """The sandbox alone on the trivial program: one call at a time, then ``calls`` at once."""
    from qd.sandbox import Limits, Sandbox

    text = reply({}).split("```python\n")[1].split("```")[0]
    task = LineTask()
    sandbox = Sandbox(task.sandbox_entry, workers=workers, limits=Limits())
    children = _ChildCPU(set())
    try:

        async def main() -> dict[str, Any]:
            for _ in range(10):  # warm-up: workers started, entry loaded
                r = await sandbox.run(text, {})
                if not r.ok:
                    raise RuntimeError(f"sandbox probe: the trivial program failed: {r.error}")
            children.start()
            cpu0 = time.process_time()
            walls, seconds = [], []
            for _ in range(calls):
                t = time.perf_counter()
                r = await sandbox.run(text, {})
                walls.append(time.perf_counter() - t)
                seconds.append(r.seconds)
            seq_cpu, seq_children = time.process_time() - cpu0, children.stop()
            children.start()
            cpu0, t0 = time.process_time(), time.perf_counter()
            results = await asyncio.gather(*(sandbox.run(text, {}) for _ in range(calls)))
            par_wall = time.perf_counter() - t0
            par_cpu, par_children = time.process_time() - cpu0, children.stop()
            return {
                "workers": workers,
                "calls": calls,
                "seq_wall_ms": 1e3 * statistics.median(walls),
                "seq_seconds_ms": 1e3 * statistics.median(seconds),
                "seq_main_cpu_ms": 1e3 * seq_cpu / calls,
                "seq_sandbox_cpu_ms": 1e3 * seq_children / calls,
                "par_per_s": calls / par_wall,
                "par_ok": sum(r.ok for r in results),
                "par_main_cpu_ms": 1e3 * par_cpu / calls,
                "par_sandbox_cpu_ms": 1e3 * par_children / calls,
            }

        return asyncio.run(main())
    finally:
        sandbox.close()


# ----- OpenEvolve ----------------------------------------------------------------------


def run_openevolve(parallel: int, candidates: int, latency_s: float, timeout_s: float) -> dict[str, Any]:
    """One OpenEvolve run in a child process against a fresh scripted server."""
    load = _load()
    server = _server(latency_s)
    work = Path(tempfile.mkdtemp(prefix="bll_oe_"))
    try:
        params = {
            "base_url": server.base_url,
            "parallel": parallel,
            "iterations": candidates,
            "work": str(work),
        }
        server_pid = _server_pid(server)
        server_cpu0 = _pid_cpu(server_pid)
        log = work / "child.log"
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, __file__, "--_openevolve-child", json.dumps(params)],
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
        if proc.returncode != 0 or not (work / "result.json").exists():
            tail = log.read_text()[-3000:]
            raise RuntimeError(f"OpenEvolve child failed (rc={proc.returncode}):\n{tail}")
        out = json.loads((work / "result.json").read_text())
        server_cpu = _pid_cpu(server_pid)
        stats = server.stats()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    n = out["candidates"]
    out.update(
        {
            "system": "OpenEvolve",
            "concurrency": parallel,
            "requests": stats["requests"],
            "max_in_flight": stats["max_in_flight"],
            "cand_per_s": n / out["wall_s"],
            "of_ideal": stats["requests"] * latency_s / parallel / out["wall_s"],
            "engine_cpu_ms": 1e3 * out["main_cpu_s"] / n,
            "total_cpu_ms": 1e3 * (out["main_cpu_s"] + out["workers_cpu_s"]) / n,
            "server_cpu_s": None if server_cpu is None or server_cpu0 is None else server_cpu - server_cpu0,
            "load": load,
        }
    )
    return out


def _openevolve_child(params: dict[str, Any]) -> None:
    """Runs in a fresh process: OpenEvolve for ``iterations`` iterations, result.json out."""
    import openevolve
    from openevolve.config import Config, LLMConfig, LLMModelConfig
    from openevolve.controller import OpenEvolve

    work = Path(params["work"])
    (work / "initial.py").write_text(SEED_PROGRAM)
    (work / "evaluator.py").write_text(OE_EVALUATOR)
    config = Config()
    config.language = "python"
    config.diff_based_evolution = False
    config.llm = LLMConfig(
        api_base=params["base_url"], api_key="sk-dummy", models=[LLMModelConfig(name="scripted", weight=1.0)]
    )
    config.evaluator.parallel_evaluations = params["parallel"]
    config.evaluator.cascade_evaluation = False
    config.database.feature_dimensions = ["a", "b"]
    config.database.feature_bins = LATTICE
    controller = OpenEvolve(
        str(work / "initial.py"), str(work / "evaluator.py"), config, output_dir=str(work / "out")
    )
    added: list[float] = []
    add = controller.database.add

    def timed_add(program, iteration=None, target_island=None):
        # Measurement hook: children of iterations (the initial program and the
        # migrants' copies are added without an iteration and not counted here).
        result = add(program, iteration=iteration, target_island=target_island)
        if iteration is not None:
            added.append(time.perf_counter())
        return result

    controller.database.add = timed_add
    children0 = _children_rusage()
    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(controller.run(iterations=params["iterations"]))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    workers_cpu = _children_rusage() - children0  # the pool is shut down and reaped by run()
    (work / "result.json").write_text(
        json.dumps(
            {
                "candidates": len(added) + 1,
                "children": len(added),
                "wall_s": wall,
                "main_cpu_s": cpu,
                "workers_cpu_s": workers_cpu,
                "version": openevolve.__version__ if hasattr(openevolve, "__version__") else _oe_version(),
                "steady_per_s": _steady_rate(added, t0),
            }
        )
    )


def _oe_version() -> str:
    from importlib.metadata import version

    return version("openevolve")


def _steady_rate(times: list[float], t0: float) -> float | None:
    """Candidates/s between the 10th and 90th percentile completions (startup excluded)."""
    if len(times) < 10:
        return None
    times = sorted(times)
    i, j = len(times) // 10, (9 * len(times)) // 10
    return (j - i) / (times[j] - times[i]) if times[j] > times[i] else None


# ----- reporting -----------------------------------------------------------------------


def _med(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "n/m"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _rng(runs: list[dict], key: str, digits: int = 1) -> str:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return "n/m"
    med = _fmt(statistics.median(vals), digits)
    return med if len(vals) == 1 else f"{med} [{_fmt(min(vals), digits)}, {_fmt(max(vals), digits)}]"


def table(groups: dict[tuple[str, int], list[dict]], latency_s: float) -> str:
    head = (
        "| system | C | candidates (LLM) | wall s | cand/s | ideal cand/s | of ideal | max in flight "
        "| engine CPU ms/cand (all; steady 1st / last quarter) | total CPU ms/cand | sandbox s/eval (median) "
        "| sandbox CPU ms/eval | server CPU s |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for (system, c), runs in groups.items():
        llm = _med(runs, "requests")
        q = f"{_fmt(_med(runs, 'engine_cpu_q1_ms'), 2)} / {_fmt(_med(runs, 'engine_cpu_q4_ms'), 2)}"
        engine = _rng(runs, "engine_cpu_ms", 2) + ("" if system != "qd" else f"; {q}")
        sb = _med(runs, "sandbox_s_median")
        lines.append(
            f"| {system} | {c} | {_fmt(_med(runs, 'candidates'), 0)} ({_fmt(llm, 0)}) | "
            f"{_rng(runs, 'wall_s', 2)} | {_rng(runs, 'cand_per_s')} | {c / latency_s:,.0f} | "
            f"{_rng(runs, 'of_ideal', 2)} | {_fmt(_med(runs, 'max_in_flight'), 0)} | {engine} | "
            f"{_fmt(_med(runs, 'total_cpu_ms'), 2)} | {'n/m' if sb is None else f'{1e3 * sb:.1f} ms'} | "
            f"{_fmt(_med(runs, 'sandbox_cpu_ms'), 2)} | {_fmt(_med(runs, 'server_cpu_s'), 2)} |"
        )
    return "\n".join(lines)


def targets(groups: dict[tuple[str, int], list[dict]], probe: dict | None) -> list[str]:
    out = []

    def med(system: str, c: int, key: str) -> float | None:
        runs = groups.get((system, c))
        return _med(runs, key) if runs else None

    f8 = med("qd", 8, "of_ideal")
    if f8 is not None:
        out.append(
            f"- qd at concurrency 8 >= 0.9 of ideal: **{'met' if f8 >= 0.9 else 'missed'}** ({f8:.2f})"
        )
    q64, o64 = med("qd", 64, "cand_per_s"), med("OpenEvolve", 64, "cand_per_s")
    if q64 is not None and o64:
        ratio = q64 / o64
        out.append(
            f"- qd >= 10x OpenEvolve at 64: **{'met' if ratio >= 10 else 'missed'}** "
            f"({q64:,.1f} vs {o64:,.1f} candidates/s = {ratio:.1f}x)"
        )
    cpu = [
        (c, med("qd", c, "engine_cpu_ms"), med("qd", c, "engine_cpu_q1_ms"), med("qd", c, "engine_cpu_q4_ms"))
        for (s, c) in groups
        if s == "qd"
    ]
    if cpu:
        ok = all(a is not None and a <= 1.0 and (q4 is None or q4 <= 1.0) for _, a, _, q4 in cpu)
        flat = all(q1 and q4 is not None and q4 <= 1.25 * q1 for _, _, q1, q4 in cpu)
        detail = "; ".join(
            f"C={c}: {_fmt(a, 2)} ms (quarters {_fmt(q1, 2)} -> {_fmt(q4, 2)})" for c, a, q1, q4 in cpu
        )
        out.append(
            f"- engine CPU <= 1 ms per candidate: **{'met' if ok else 'missed'}**; flat as the store grows "
            f"(last steady quarter <= 1.25x first): **{'met' if flat else 'missed'}** ({detail})"
        )
    if probe:
        s = probe["seq_seconds_ms"]
        out.append(
            f"- sandbox overhead per evaluation <= 5 ms: **{'met' if s <= 5 else 'missed'}** "
            f"(trivial program, one call at a time: SandboxResult.seconds {s:.2f} ms median, "
            f"{probe['seq_wall_ms']:.2f} ms as the caller sees it; CPU per evaluation "
            f"{probe['seq_main_cpu_ms']:.2f} ms in the loop's process + {probe['seq_sandbox_cpu_ms']:.2f} ms "
            f"in the sandbox's processes)"
        )
    return out


def _print_run(rep: int, r: dict) -> None:
    if r["system"] == "OpenEvolve":
        print(
            f"  [{rep}] OpenEvolve P={r['concurrency']}: {r['candidates']} cand ({r['requests']} LLM) in "
            f"{r['wall_s']:.2f}s = {r['cand_per_s']:.1f}/s (steady {_fmt(r['steady_per_s'])}/s), of ideal "
            f"{r['of_ideal']:.2f}, max in flight {r['max_in_flight']}, main CPU {r['engine_cpu_ms']:.2f} "
            f"ms/cand, total CPU {r['total_cpu_ms']:.2f} ms/cand, load {r['load']}",
            flush=True,
        )
        return
    sb = r["sandbox_s_median"]
    print(
        f"  [{rep}] {r['system']} C={r['concurrency']}: {r['candidates']} cand ({r['requests']} LLM) in "
        f"{r['wall_s']:.2f}s = {r['cand_per_s']:.1f}/s, of ideal {r['of_ideal']:.2f}, max in flight "
        f"{r['max_in_flight']}, engine CPU {r['engine_cpu_ms']:.2f} ms/cand (q1 "
        f"{_fmt(r['engine_cpu_q1_ms'], 2)}, q4 {_fmt(r['engine_cpu_q4_ms'], 2)}), sandbox "
        f"{_fmt(sb and 1e3 * sb, 2)} ms/eval, {_fmt(r['sandbox_cpu_ms'], 2)} ms CPU/eval, valid "
        f"{r['valid']}, load {r['load']}"
        + (f", errors {r['errors']}" if r["errors"] else "")
        + (f", stop: {r['stop_reason']}" if r["stop_reason"] else ""),
        flush=True,
    )


def decomposition(groups: dict[tuple[str, int], list[dict]], clients: list[dict], c: int) -> str:
    """Where the main process's CPU per candidate goes, at concurrency c."""
    rows = [
        ("qd: scripted server over HTTP (LLMClient), sandbox", groups.get(("qd", c))),
        ("qd: in-process stand-in model (no HTTP), sandbox", groups.get(("qd (standin)", c))),
        ("qd: stand-in model, evaluation in process (no sandbox)", groups.get(("qd (bare)", c))),
    ]
    lines = ["| variant (C=%d) | cand/s | main-process CPU ms/cand |" % c, "|---|---:|---:|"]
    for name, runs in rows:
        if runs:
            lines.append(f"| {name} | {_rng(runs, 'cand_per_s')} | {_rng(runs, 'engine_cpu_ms', 2)} |")
    if clients:
        lines.append(
            f"| `LLMClient` alone, {clients[0]['calls']} calls against the server "
            f"(max in flight {_fmt(_med(clients, 'max_in_flight'), 0)}) | {_rng(clients, 'per_s')} calls/s "
            f"| {_rng(clients, 'cpu_ms', 2)} per call |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=1000)
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=[8, 64, 256],
        help="qd runs (in_flight = llm concurrency)",
    )
    ap.add_argument(
        "--openevolve", type=int, nargs="*", default=[8, 64], help="OpenEvolve parallel_evaluations"
    )
    ap.add_argument(
        "--oe-candidates", type=int, default=None, help="OpenEvolve iterations (default: --candidates)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency", type=float, default=LATENCY_S, help="scripted model latency, seconds")
    ap.add_argument("--workers", type=int, default=2, help="qd sandbox workers (runner.workers default: 2)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="qd insert batches between checkpoints")
    ap.add_argument("--probe-calls", type=int, default=200, help="sandbox probe size (0: skip)")
    ap.add_argument(
        "--decompose",
        type=int,
        default=8,
        metavar="C",
        help="also run qd at C with a stand-in model / in-process evaluation, and LLMClient alone (0: skip)",
    )
    ap.add_argument(
        "--profile", type=int, default=None, metavar="C", help="cProfile one extra qd run at concurrency C"
    )
    ap.add_argument("--oe-timeout", type=float, default=900.0)
    ap.add_argument("--results", type=Path, default=None, help="write the section into this RESULTS.md")
    ap.add_argument("--json", type=Path, default=None, help="dump every run as JSON")
    ap.add_argument("--_openevolve-child", dest="oe_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.oe_child is not None:
        _openevolve_child(json.loads(args.oe_child))
        return

    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = _load()
    print(
        f"llm_loop: {args.candidates} candidates, qd C={args.concurrency}, OpenEvolve P={args.openevolve}, "
        f"{args.repeats} repeats, latency {args.latency * 1e3:.0f} ms, load {load0}",
        flush=True,
    )
    runs: list[dict] = []
    probes: list[dict] = []
    clients: list[dict] = []
    warmup = None
    qd_on = bool(args.concurrency) or bool(args.decompose) or bool(args.profile)
    if qd_on:
        import logging

        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
        t = time.perf_counter()
        w = run_qd(8, 64, args.latency, args.workers, args.checkpoint_every)
        warmup = {"s": time.perf_counter() - t, "wall_s": w["wall_s"], "candidates": w["candidates"]}
        print(
            f"  qd warm-up (first run of the process, jit compile): {warmup['candidates']} candidates, "
            f"run {w['wall_s']:.2f}s, {warmup['s']:.2f}s in all",
            flush=True,
        )
    oe_n = args.oe_candidates or args.candidates
    for rep in range(args.repeats):
        for c in args.concurrency:
            runs.append(
                dict(
                    run_qd(c, args.candidates, args.latency, args.workers, args.checkpoint_every), repeat=rep
                )
            )
            _print_run(rep, runs[-1])
        for p in args.openevolve:
            runs.append(dict(run_openevolve(p, oe_n, args.latency, args.oe_timeout), repeat=rep))
            _print_run(rep, runs[-1])
        if args.decompose:
            for variant in ("standin", "bare"):
                runs.append(
                    dict(
                        run_qd(
                            args.decompose,
                            args.candidates,
                            args.latency,
                            args.workers,
                            args.checkpoint_every,
                            variant=variant,
                        ),
                        repeat=rep,
                    )
                )
                _print_run(rep, runs[-1])
            clients.append(client_probe(args.decompose, args.candidates, args.latency))
            print(f"  [{rep}] LLMClient alone: {clients[-1]}", flush=True)
        if args.probe_calls and qd_on:
            probes.append(sandbox_probe(args.workers, args.probe_calls))
            print(f"  [{rep}] sandbox probe: {probes[-1]}", flush=True)
    probe = (
        {
            k: (statistics.median(p[k] for p in probes) if isinstance(probes[0][k], float) else probes[0][k])
            for k in probes[0]
        }
        if probes
        else None
    )
    profile = None
    if args.profile:
        profile = run_qd(
            args.profile, args.candidates, args.latency, args.workers, args.checkpoint_every, profile=True
        )
        print(
            f"  profiled qd C={args.profile}: {profile['cand_per_s']:.1f}/s, engine CPU "
            f"{profile['engine_cpu_ms']:.2f} ms/cand (under cProfile)\n{profile['profile']}",
            flush=True,
        )
    load1 = _load()

    groups: dict[tuple[str, int], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["system"], r["concurrency"]), []).append(r)
    main_groups = {k: v for k, v in groups.items() if k[0] in ("qd", "OpenEvolve")}
    tab = table(main_groups, args.latency)
    dec = decomposition(groups, clients, args.decompose) if args.decompose else ""
    goals = targets(main_groups, probe)
    print()
    print(tab)
    if dec:
        print()
        print(dec)
    print()
    print("\n".join(goals))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"runs": runs, "probes": probes, "clients": clients, "warmup": warmup, "profile": profile},
                indent=1,
                default=str,
            )
        )
    if args.results:
        from _results import commit, versions, write_section

        cmd = "python bench/llm_loop.py " + " ".join(sys.argv[1:] if argv is None else argv)
        loads = [r["load"] for r in runs]
        lines = [
            TITLE,
            "",
            f"- Command: `{cmd.strip()}`, commit {commit()}",
            f"- Date: {started:%Y-%m-%d %H:%M} UTC; "
            f"{(datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60:.1f} min in all",
            f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}, shared; "
            f"1-min load average {load0} at the start, {load1} at the end"
            + (
                f", {min(loads)}-{max(loads)} at the starts of the runs (these include this benchmark's own "
                "processes, e.g. OpenEvolve's 64 workers just before)"
                if loads
                else ""
            ),
            f"- Versions: {versions('jax', 'openai', 'httpx', 'httpx2', 'openevolve')}",
            "- Setup: scripted OpenAI-compatible server (`tests/scripted_llm.py`, own process, fresh per "
            f"run), {args.latency * 1e3:.0f} ms latency, every answer a small python block; "
            f"{args.candidates} candidates per qd run, {oe_n} iterations per OpenEvolve run; {args.repeats} "
            "repeat(s), median [min, max]. qd: batch 1, in_flight = llm.concurrency = C, `rewrite` operator, "
            f"`StagedEvaluator` on `qd.sandbox.Sandbox(workers={args.workers}, limits=Limits())`, checkpoint "
            f"every {args.checkpoint_every} batches; store, events and checkpoints included; jit warm (the "
            f"warm-up run, first of the process, took {_fmt(warmup and warmup['s'], 2)} s). OpenEvolve "
            f"{_oe_version() if args.openevolve else ''}: parallel_evaluations = C, full rewrites, its "
            "evaluator runs in its worker processes (no sandbox), defaults otherwise. Details in the "
            "script's docstring.",
            "- Columns: candidates = evaluated programs (qd: store rows, its seeds included; OpenEvolve: "
            "children + the initial program), (LLM) = chat requests the server answered; of ideal = LLM "
            "calls x latency / C / wall; engine CPU = the main process's `time.process_time()` per candidate "
            "(qd: also over the first and last quarter of its steady part, candidates C to N - C, to show "
            "whether it grows with the store; OpenEvolve: its controller, whose workers make the calls and "
            "evaluations); total CPU = main + sandbox or worker processes (not the server); sandbox = median "
            "`SandboxResult.seconds` and the sandbox processes' CPU per evaluation.",
            "",
            tab,
            "",
        ]
        oe_groups = [(c, g) for (sname, c), g in main_groups.items() if sname == "OpenEvolve"]
        if oe_groups:
            lines += [
                "OpenEvolve steady rate (10th to 90th percentile child, its pool start excluded): "
                + ", ".join(f"P={c}: {_rng(g, 'steady_per_s')}/s" for c, g in oe_groups)
                + ".",
                "",
            ]
        if dec:
            lines += [
                "Where qd's main-process CPU goes (same runs, variants of the model and evaluator):",
                "",
                dec,
                "",
            ]
        if probe:
            lines += [
                f"Sandbox alone (trivial program, {probe['workers']} workers, {probe['calls']} calls, median "
                f"of {len(probes)}): one at a time {probe['seq_wall_ms']:.2f} ms per call as the caller sees "
                f"it, `SandboxResult.seconds` {probe['seq_seconds_ms']:.2f} ms, CPU "
                f"{probe['seq_main_cpu_ms']:.2f} ms (loop process) + {probe['seq_sandbox_cpu_ms']:.2f} ms "
                f"(sandbox processes) per call; all at once {probe['par_per_s']:,.0f} evaluations/s, CPU "
                f"{probe['par_main_cpu_ms']:.2f} + {probe['par_sandbox_cpu_ms']:.2f} ms per call.",
                "",
            ]
        lines += ["Targets:", "", *goals, ""]
        if profile:
            lines += [
                f"cProfile of one qd run at C={args.profile} (the loop thread's CPU time, "
                "`time.thread_time`, sorted by own time; "
                f"{profile['cand_per_s']:.1f} cand/s, {profile['engine_cpu_ms']:.2f} ms CPU per candidate "
                "under the profiler):",
                "",
                "```",
                profile["profile"],
                "```",
                "",
            ]
        write_section(args.results, TITLE, "\n".join(lines))
        print(f"wrote {TITLE!r} into {args.results}")


if __name__ == "__main__":
    main()
