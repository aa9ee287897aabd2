#!/usr/bin/env python
"""A real ``qd-run experiment=function_fit`` against the scripted model: throughput, CPU and wall split.

What runs: the engine ``qd-run`` builds (``qd.run.build_engine`` on the composed config
``experiment=function_fit llm=openai llm.base_url=<scripted> runner.in_flight=C
llm.concurrency=C runner.max_llm_calls=N``): the function_fit task with its two-stage cascade
(train points, then held-out points, both in one sandbox process: ``Stage.same_visit``) in the
sandbox (``runner.workers`` pre-forked workers), ``LLMClient`` over real HTTP on loopback to
``tests/scripted_llm.py`` in its own process (keep-alive,
a fixed latency before every answer; the answers are ``bench/llm_loop.py``'s fresh lines
``def f(x): return A * x + B  # k``). SQLite store, events.jsonl and checkpoints included. The first
run at each C (a short warm-up, not reported) pays JAX's compilation.

Measured per run (after the engine is built):

* candidates/s (store rows over ``engine.run()``'s wall), "of ideal": LLM calls x latency / C / wall.
* CPU per candidate (ms): ``main`` (this process, ``process_time``: the driver, the HTTP client,
  the sandbox's client side), ``helpers`` (its long-lived child processes: the sandbox workers,
  their own user+system time), ``children`` (what the helpers forked per run: the helpers' reaped
  children's time plus any still alive); ``machine`` (all cores busy, from /proc/stat, over the
  run: the scripted server and everyone else on the machine included) and the 1-min load.
* where a candidate's wall time goes (ms per candidate, from wrappers timing the engine's
  proposer, model client, sandbox and commit): an in-flight slot is held from a proposal's start
  until it is done (the engine forms a wave ahead; before that change, until its wave was taken
  for commit), so C x wall = the slots' time = per candidate: ``model`` (the HTTP call),
  ``queue`` (waiting for a free sandbox worker), ``sandbox`` (the stages' runs), ``other`` (the
  rest of the proposal: prompt, parsing, scoring, hand-offs between stages), ``wave`` (done,
  holding its slot while it waits for its wave's slowest member and the commits before it; none
  once slots free as proposals finish) and ``idle`` (slots with no proposal: refill gaps, the
  drain); apart, ``commit``: the loop's time in commits (the event loop serves nothing else
  meanwhile). The ideal is ``model`` alone.

Usage::

    python bench/llm_function_fit.py                                   # C 8 64 256, 1000 calls, 3 repeats
    python bench/llm_function_fit.py --concurrency 8 --calls 200 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "tests", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import llm_loop  # noqa: E402  (the scripted answers and server, process accounting)

PARTS = ("model", "queue", "sandbox", "other", "wave", "idle", "commit")


def _own_and_reaped(pid: int) -> tuple[float, float] | None:
    """(own user+system, reaped children's user+system) CPU seconds of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class ProcessCPU:
    """The CPU of this process's helpers (its descendants alive at ``start``: the sandbox workers,
    and the one child each has forked ahead) and of what they fork later (reaped or alive)."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude

    def start(self) -> None:
        tree = llm_loop._descendants_cpu(os.getpid(), self.exclude)
        self.helpers = {pid: cpu for pid in tree if (cpu := _own_and_reaped(pid)) is not None}
        self.busy0 = _busy()

    def stop(self) -> dict[str, float]:
        own = reaped = 0.0
        for pid, (own0, reaped0) in self.helpers.items():
            now = _own_and_reaped(pid)
            if now is not None:
                own, reaped = own + now[0] - own0, reaped + now[1] - reaped0
        tree = llm_loop._descendants_cpu(os.getpid(), self.exclude)
        others = sum(cpu for pid, cpu in tree.items() if pid not in self.helpers)
        busy = _busy()
        cores = os.cpu_count() or 1
        share = (busy[0] - self.busy0[0]) / max(1, busy[1] - self.busy0[1])
        return {"helpers": own, "children": reaped + others, "machine_busy": share * cores}


class WallSplit:
    """Times the engine's proposals, model calls, sandbox runs and commits (wrappers on the
    instances of one built engine), and splits the in-flight slots' time by them."""

    def __init__(self, engine: Any):
        self.model = self.queue = self.sandbox = self.commit = self.wave = self.slots = 0.0
        self.started: dict[int, float] = {}
        self.frees_at_done = hasattr(engine, "_running")  # (a slot per running proposal, not per wave)
        self.done: dict[int, float] = {}
        self._wrap_proposer(engine.proposer)
        self._wrap_model(engine.llm)
        self._wrap_sandbox(engine.parts.evaluator.runner)
        self._wrap_commit(engine)

    def _wrap_proposer(self, proposer: Any) -> None:
        start = proposer.start

        def timed(ticket: Any, view: Any) -> Any:  # it reads the view now, as the engine calls it
            return finish(start(ticket, view))

        async def finish(started: Any) -> Any:
            t = time.perf_counter()  # it runs: its slot is held from now
            proposal = await started
            self.started[id(proposal)], self.done[id(proposal)] = t, time.perf_counter()
            return proposal

        proposer.start = timed

    def _wrap_model(self, client: Any) -> None:
        complete = client.complete

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await complete(*args, **kwargs)
            finally:
                self.model += time.perf_counter() - t

        client.complete = timed

    def _wrap_sandbox(self, sandbox: Any) -> None:
        run, acquire = sandbox.run, sandbox._acquire

        async def timed_run(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await run(*args, **kwargs)
            finally:
                self.sandbox += time.perf_counter() - t

        async def timed_acquire() -> Any:
            t = time.perf_counter()
            try:
                return await acquire()
            finally:
                self.queue += time.perf_counter() - t

        sandbox.run, sandbox._acquire = timed_run, timed_acquire

    def _wrap_commit(self, engine: Any) -> None:
        commit = engine._commit

        async def timed(proposals: list) -> None:
            t = time.perf_counter()
            try:
                return await commit(proposals)
            finally:
                end = time.perf_counter()
                for p in proposals:  # its slot freed as it finished, or as its wave was taken (before this)
                    done, started = self.done.pop(id(p)), self.started.pop(id(p))
                    self.wave += 0.0 if self.frees_at_done else t - done
                    self.slots += (done if self.frees_at_done else t) - started
                self.commit += end - t

        engine._commit = timed

    def split(self, wall: float, slots: int, n: int) -> dict[str, float]:
        """ms per candidate of each of ``PARTS`` (``sandbox`` without its queueing; ``commit``: the
        loop's time in commits, outside the slots' sum)."""
        held = self.slots
        proposal = held - self.wave
        parts = {
            "model": self.model,
            "queue": self.queue,
            "sandbox": self.sandbox - self.queue,
            "other": proposal - self.model - self.sandbox,
            "wave": self.wave,
            "commit": self.commit,
            "idle": slots * wall - held,
        }
        return {k: 1e3 * v / n for k, v in parts.items()}


def run_function_fit(concurrency: int, calls: int, latency_s: float, workers: int) -> dict[str, Any]:
    """One real function_fit run; see the module docstring."""
    from qd.plan import compose
    from qd.run import build_engine
    from qd.store import Store

    load = llm_loop._load()
    server = llm_loop._server(latency_s)
    server_pid = llm_loop._server_pid(server)
    run_dir = Path(tempfile.mkdtemp(prefix="bff_qd_")) / "run"
    try:
        cfg = compose(
            [
                "experiment=function_fit",
                "llm=openai",
                f"llm.base_url={server.base_url}",
                "llm.api_key_env=null",
                "llm.models=[{name: scripted}]",
                f"llm.concurrency={concurrency}",
                f"runner.in_flight={concurrency}",
                f"runner.max_llm_calls={calls}",
                f"runner.workers={workers}",
                "runner.progress=false",
            ]
        )
        engine = build_engine(cfg, run_dir)
        split = WallSplit(engine)
        cpu = ProcessCPU({server_pid} if server_pid else set())
        engine.parts.evaluator.runner.isolation()  # the workers started: helpers, not run-time children
        cpu.start()
        cpu0, t0 = time.process_time(), time.perf_counter()
        try:
            engine.run()
        finally:
            wall, main = time.perf_counter() - t0, time.process_time() - cpu0
            procs = cpu.stop()
            stats = server.stats()
            engine.close()
        with Store(run_dir / "store.sqlite", readonly=True) as store:
            n = store.count()
    finally:
        server.stop()
    ms = {k: 1e3 * v / n for k, v in {"main": main, **procs}.items() if k != "machine_busy"}
    return {
        "concurrency": concurrency,
        "candidates": n,
        "requests": stats["requests"],
        "max_in_flight": stats["max_in_flight"],
        "wall_s": wall,
        "cand_per_s": n / wall,
        "of_ideal": stats["requests"] * latency_s / concurrency / wall,
        "cpu_ms": {**ms, "main+helpers": ms["main"] + ms["helpers"]},
        "cores_busy": procs["machine_busy"],
        "wall_ms": split.split(wall, concurrency, n),
        "load": load,
    }


def _median(runs: list[dict], *keys: str) -> float:
    def get(r: dict) -> float:
        for k in keys:
            r = r[k]
        return r

    return statistics.median(get(r) for r in runs)


def table(groups: dict[int, list[dict]], latency_s: float) -> str:
    """The markdown table: medians of the repeats, the loads they ran at."""
    head = (
        "| C | cand/s | ideal | of ideal | CPU ms/cand: main / helpers / their children "
        "(main+helpers) | cores busy | wall ms/cand: " + " / ".join(PARTS) + " | load |"
    )
    rows = [head, "|" + "---:|" * 8]
    for c, runs in groups.items():
        cpu = " / ".join(f"{_median(runs, 'cpu_ms', k):.2f}" for k in ("main", "helpers", "children"))
        wall = " / ".join(f"{_median(runs, 'wall_ms', k):.1f}" for k in PARTS)
        loads = ", ".join(f"{r['load']:.1f}" for r in runs)
        rows.append(
            f"| {c} | {_median(runs, 'cand_per_s'):.1f} | {c / latency_s:.0f} | "
            f"{_median(runs, 'of_ideal'):.2f} | {cpu} (**{_median(runs, 'cpu_ms', 'main+helpers'):.2f}**) | "
            f"{_median(runs, 'cores_busy'):.2f} | {wall} | {loads} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--calls", type=int, default=1000, help="runner.max_llm_calls per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency", type=float, default=llm_loop.LATENCY_S, help="scripted latency, seconds")
    ap.add_argument("--workers", type=int, default=2, help="runner.workers (sandbox workers)")
    ap.add_argument("--json", type=Path, default=None, help="dump every run as JSON")
    args = ap.parse_args(argv)

    for c in args.concurrency:  # warm-up: JAX compiles here (a wave's shapes follow C)
        run_function_fit(c, 2 * c, args.latency, args.workers)
    groups: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    for rep in range(args.repeats):
        for c in args.concurrency:
            r = run_function_fit(c, args.calls, args.latency, args.workers)
            groups[c].append(r)
            print(
                f"C={c} rep {rep}: {r['cand_per_s']:.1f} cand/s ({r['of_ideal']:.2f} of ideal), "
                f"CPU ms/cand {json.dumps({k: round(v, 2) for k, v in r['cpu_ms'].items()})}, "
                f"wall ms/cand {json.dumps({k: round(v, 1) for k, v in r['wall_ms'].items()})}, "
                f"cores busy {r['cores_busy']:.2f}, load {r['load']}",
                flush=True,
            )
    print(table(groups, args.latency))
    if args.json:
        args.json.write_text(json.dumps(groups, indent=1))


if __name__ == "__main__":
    main()
