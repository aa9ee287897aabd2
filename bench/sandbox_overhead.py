#!/usr/bin/env python
"""Sandbox overhead per evaluation: what a run of a do-nothing entry costs.

The entry returns 0 at once, so all of a run's latency (``await sandbox.run``,
measured in the caller) is sandbox overhead: request and reply over the pipes, the
child's setup (fork, process group, rlimits, uid switch; the fork and most of the setup
happen before the request arrives, but a caller that sends its next request at once
still waits for them), the result pipe, the exit and the clean-up. It is reported as
the median of ``--runs`` runs after 20 warm-up runs, with workers=1 (one run at a
time) and workers=2 (two callers, so two runs overlap), each the median over
``--repeats`` fresh sandboxes, next to two references measured on the same machine:

* bare fork: ``os.fork()`` + ``os._exit(0)`` + ``waitpid`` in this process (the floor);
* fresh interpreter: ``python -c`` importing the entry and calling it (what the
  pre-forked workers avoid).

"CPU per run" adds up the CPU time of the caller, the workers and the children
(user + system), start-up included: unlike latency it hardly depends on what else
the machine is doing. "Caller CPU per run" is the calling process alone over the
timed runs: the sandbox's share of the main loop's CPU per candidate.

Usage::

    python bench/sandbox_overhead.py                 # 200 runs per setting, 3 repeats
    python bench/sandbox_overhead.py --runs 50 --repeats 1   # quicker
    python bench/sandbox_overhead.py --results bench/RESULTS.md   # also write section
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qd.sandbox import Sandbox  # noqa: E402

TITLE = "## Sandbox overhead per evaluation"


def cpu_seconds() -> float:
    """CPU time of this process and of its finished descendants (the workers, once closed)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


async def sandbox_run(entry: str, workers: int, runs: int) -> dict:
    """One sandbox's medians: the latency seen by the caller, the child's own wall time
    (``SandboxResult.seconds``), CPU per run (all processes; the caller's alone) and runs/s."""
    start, before_warm_up = time.perf_counter(), cpu_seconds()
    sandbox = Sandbox(entry, workers=workers)
    try:
        for _ in range(20):
            await sandbox.run("")
        latencies, child = [], []
        isolation = sandbox.isolation()

        async def caller(n: int) -> None:
            for _ in range(n):
                start = time.perf_counter()
                result = await sandbox.run("")
                latencies.append(time.perf_counter() - start)
                child.append(result.seconds)
                assert result.ok, result

        caller_cpu = time.process_time()
        await asyncio.gather(*(caller(runs // workers) for _ in range(workers)))
        caller_cpu = time.process_time() - caller_cpu
    finally:
        await sandbox.aclose()
    # Worker start-up and warm-up are in there too: spread over the runs, as a (small) upper bound.
    return {
        "latency": statistics.median(latencies),
        "child": statistics.median(child),
        "cpu": (cpu_seconds() - before_warm_up) / (len(latencies) + 20),
        "caller_cpu": caller_cpu / len(latencies),
        "rate": (len(latencies) + 20) / (time.perf_counter() - start),
        "isolation": isolation,
    }


def fork_latencies(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        out.append(time.perf_counter() - start)
    return out


def interpreter_latencies(path: Path, runs: int) -> list[float]:
    code = (
        f"import importlib.util as u; s = u.spec_from_file_location('e', {str(path)!r}); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); m.run('')"
    )
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--repeats", type=int, default=3, help="each setting this many times; medians reported"
    )
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    args = parser.parse_args()
    ms = lambda x: f"{x * 1e3:.2f} ms"  # noqa: E731
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sbx_bench_") as tmp:
        path = Path(tmp) / "sbx_noop.py"
        path.write_text("def run(text, **args):\n    return 0\n")
        rows = []
        for workers in (1, 2):
            reps = [asyncio.run(sandbox_run(f"{path}:run", workers, args.runs)) for _ in range(args.repeats)]
            med = {
                k: statistics.median(r[k] for r in reps)
                for k in ("latency", "child", "cpu", "caller_cpu", "rate")
            }
            rows.append(
                f"| sandbox, workers={workers} | {ms(med['latency'])} | {ms(med['child'])} | "
                f"{ms(med['cpu'])} | {ms(med['caller_cpu'])} | {med['rate']:.0f}/s |"
            )
        fork = statistics.median(statistics.median(fork_latencies(args.runs)) for _ in range(args.repeats))
        rows.append(f"| bare fork + exit + wait | {ms(fork)} | | | | |")
        rows.append(
            f"| fresh interpreter (`python -c`) | {ms(statistics.median(interpreter_latencies(path, 30)))} "
            "| | | | |"
        )
    enabled = ", ".join(k for k, v in reps[0]["isolation"].items() if v)
    section = "\n".join(
        [
            TITLE,
            "",
            f"`python bench/sandbox_overhead.py --runs {args.runs} --repeats {args.repeats}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; a do-nothing entry, so the whole latency "
            f"is overhead; {os.cpu_count()} CPUs, 1-min load {load:.2f} at the start; isolation in force: "
            f"{enabled}. Each figure is the median over the repeats of one sandbox's median (CPU: its mean "
            "per run, start-up included; the caller's: the calling process alone, timed runs only).",
            "",
            "| setting | median latency per run | median child wall time | CPU per run | caller CPU per run "
            "| runs/s (incl. start) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    print(section)
    if args.results:
        from _results import write_section

        write_section(args.results, TITLE, section)


if __name__ == "__main__":
    main()
