#!/usr/bin/env python
"""Sandbox worker start-up: the time from ``Sandbox(...)`` to the worker's hello and to the
first result of a do-nothing entry, and the CPU a worker's start costs.

A worker's start is what a sandbox pays once per worker (and again for each restart):
``python -I worker.py``, its imports, the namespaces and mounts, the entry's import
(``json:dumps``: already imported, so it costs nothing) and the first fork. Each
measurement starts one fresh ``Sandbox(entry, workers=1)``, waits for its hello
(``isolation()``), runs ``""`` once and closes it. "CPU per start" is the user + system
time of the finished workers (and their children), from ``RUSAGE_CHILDREN``.

``--before DIR`` measures a second tree too (a directory holding another version's
``qd/``, e.g. ``git archive <commit> qd | tar -x -C DIR``), in alternating rounds in
the same run, so both see the same machine.

Usage::

    python bench/sandbox_start.py                      # this checkout: 3 rounds of 20 starts
    python bench/sandbox_start.py --before /tmp/old    # the old tree beside it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(tree: str, starts: int) -> dict:
    """``starts`` fresh one-worker sandboxes of the ``qd`` in ``tree``: per start, seconds to
    the hello and to the first result, and the workers' CPU seconds."""
    sys.path.insert(0, tree)
    from qd.sandbox import Sandbox

    hello, first = [], []
    cpu = children_cpu()
    for _ in range(starts):
        start = time.perf_counter()
        sandbox = Sandbox("json:dumps", workers=1)
        try:
            sandbox.isolation()
            hello.append(time.perf_counter() - start)
            result = asyncio.run(sandbox.run('""'))
            first.append(time.perf_counter() - start)
            assert result.ok, result
        finally:
            sandbox.close()
    return {"hello_s": hello, "first_s": first, "cpu_s": (children_cpu() - cpu) / starts}


def round_in_subprocess(tree: str, starts: int) -> dict:
    """One round in a fresh interpreter, so that each tree's ``qd`` is the one imported."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", tree, "--starts", str(starts)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="a directory holding the qd/ to compare with (measured alternately)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--starts", type=int, default=20, help="sandboxes started per round")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # one round for the tree given (internal)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.starts)))
        return
    trees = {"after": str(REPO)} if not args.before else {"before": args.before, "after": str(REPO)}
    seen = {name: {"hello_s": [], "first_s": [], "cpu_s": []} for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            got = round_in_subprocess(tree, args.starts)
            for key in ("hello_s", "first_s"):
                seen[name][key] += got[key]
            seen[name]["cpu_s"].append(got["cpu_s"])
    print(f"{args.rounds} rounds x {args.starts} starts each (one worker per sandbox, json:dumps)")
    print("| tree | median to hello | median to first result | CPU per start (median of rounds) |")
    print("|---|---|---|---|")
    for name, got in seen.items():
        hello, first = statistics.median(got["hello_s"]), statistics.median(got["first_s"])
        cpu = statistics.median(got["cpu_s"])
        print(f"| {name} | {hello * 1e3:.1f} ms | {first * 1e3:.1f} ms | {cpu * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
