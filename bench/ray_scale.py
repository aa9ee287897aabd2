#!/usr/bin/env python
"""Evaluations per second against the number of Ray worker nodes, beside the local sandbox.

A CPU-bound stand-in evaluator (a sandboxed entry that spins for ``--work`` seconds of CPU,
the shape of a program's tests or an agent's reasoning with the model's time left out) is run
``--evaluations`` times, all submitted at once, by:

- the peer, ``runner=local``'s ``qd.sandbox.Sandbox`` with 1..N pre-forked workers;
- ``runner=ray``'s ``RaySandbox`` on a local cluster of a head (no CPUs) and 1..N worker
  nodes of 1 CPU each (``ray start --block`` processes on this machine).

It reports evaluations/s, the ratio to the local sandbox with as many workers, and the
driver's CPU seconds per evaluation (``time.process_time`` of this process: what each
evaluation costs the process that holds the archive and the store, the number that
sets how many workers one driver can feed, docs/scaling.md).

Then, on the largest cluster, whole function_fit runs (``--run-calls`` scripted model calls;
the scripted server in its own process, so its CPU is not the driver's): the driver's CPU per
stored candidate with ``runner=local`` and with ``runner=ray``, after a warm-up run.

Usage::

    PYTHONPATH=. python bench/ray_scale.py                      # 1 and 2 nodes (2-core machine)
    PYTHONPATH=. python bench/ray_scale.py --nodes 1 2 4 8 --evaluations 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = """
import time
def run(text, seconds=0.2):
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1
    return len(text) + x % 2
"""
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def measure(runner, n: int, work: float) -> dict[str, float]:
    """Seconds and driver CPU for ``n`` evaluations submitted at once (after one warm-up each worker)."""

    async def go(count: int) -> None:
        results = await asyncio.gather(
            *(runner.run(f"candidate {i}", {"seconds": work}) for i in range(count))
        )
        bad = [r.error for r in results if not r.ok]
        if bad:
            raise SystemExit(f"ray_scale: an evaluation failed: {bad[0]}")

    asyncio.run(go(4))  # workers started and warm
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(go(n))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"evals_per_s": n / wall, "seconds": wall, "driver_cpu_ms_per_eval": 1000 * cpu / n}


def whole_runs(address: str, calls: int, root: Path) -> dict[str, float]:
    """Driver CPU ms per stored candidate of a function_fit run, local and on the cluster."""
    import resource

    # The tests' helpers after the project (tests/ has a descriptors/ folder too); and not this
    # script's own folder: its modules are benchmarks, not the project's.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here] + [str(here.parent / "tests")]
    from helpers import stored, text_run, varied_program
    from scripted_llm import Rule, ScriptedLLM

    def cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_SELF)
        return used.ru_utime + used.ru_stime

    server = ScriptedLLM([Rule("", varied_program)]).start(in_process=True)
    out = {}
    try:
        for name, extra in (
            ("warm-up", ()),
            ("local", ()),
            ("ray", ("runner=ray", f"runner.address={address}")),
        ):
            before = cpu()
            path = text_run(root / name, server.base_url, f"runner.max_llm_calls={calls}", *extra)
            out[name] = 1000 * (cpu() - before) / len(stored(path))
    finally:
        server.stop()
    del out["warm-up"]
    return out


def start_cluster(root: Path, nodes: int) -> tuple[str, list[subprocess.Popen]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs: list[subprocess.Popen] = []
    for k in range(nodes + 1):
        args = (
            ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={root}"]
            if k == 0
            else [f"--address=127.0.0.1:{port}", "--num-cpus=1"]
        )
        log = root.parent / f"{root.name}-node{k}.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ray.scripts.scripts",
                    "start",
                    "--block",
                    "--disable-usage-stats",
                    "--object-store-memory=80000000",
                    *args,
                ],
                stdout=open(log, "w"),
                stderr=subprocess.STDOUT,
                env=ENV,
                process_group=0 if k == 0 else procs[0].pid,
            )
        )
        while "Ray runtime started" not in log.read_text():
            if procs[-1].poll() is not None:
                raise SystemExit(f"ray_scale: node {k} did not start: {log.read_text()[-500:]}")
            time.sleep(0.2)
    return f"127.0.0.1:{port}", procs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--evaluations", type=int, default=60)
    ap.add_argument("--work", type=float, default=0.2, help="CPU seconds per evaluation")
    ap.add_argument("--run-calls", type=int, default=300, help="model calls of each whole run (0: none)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from qd.sandbox import Limits, Sandbox
    from qd.sandbox.cluster import RaySandbox

    tmp = Path(tempfile.mkdtemp(prefix="qdrs", dir="/tmp"))
    entry = tmp / "task" / "entry.py"  # its folder is what the runtime environment uploads
    entry.parent.mkdir()
    entry.write_text(ENTRY)
    limits = Limits(wall_s=60, cpu_s=60)
    rows, runs = [], None
    try:
        for n in args.nodes:
            local = Sandbox(f"{entry}:run", workers=n, limits=limits)
            try:
                peer = measure(local, args.evaluations, args.work)
            finally:
                local.close()
            address, procs = start_cluster(tmp / f"r{n}", n)
            try:
                ray_sandbox = RaySandbox(f"{entry}:run", limits=limits, address=address)
                try:
                    ours = measure(ray_sandbox, args.evaluations, args.work)
                finally:
                    ray_sandbox.close()
                if n == max(args.nodes) and args.run_calls:
                    runs = whole_runs(address, args.run_calls, tmp / "runs")
                    print(
                        f"whole function_fit run on {n} node(s): driver CPU per candidate: local "
                        f"{runs['local']:.2f} ms, ray {runs['ray']:.2f} ms",
                        flush=True,
                    )
            finally:
                os.killpg(procs[0].pid, signal.SIGKILL)
                for p in procs:
                    p.wait()
            rows.append({"workers": n, "local": peer, "ray": ours})
            print(
                f"{n} worker(s): local {peer['evals_per_s']:.2f}/s, ray {ours['evals_per_s']:.2f}/s "
                f"(x{ours['evals_per_s'] / peer['evals_per_s']:.2f}); driver CPU per evaluation: local "
                f"{peer['driver_cpu_ms_per_eval']:.2f} ms, ray {ours['driver_cpu_ms_per_eval']:.2f} ms",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"evaluations": rows, "whole_runs": runs}, indent=1))


if __name__ == "__main__":
    main()
