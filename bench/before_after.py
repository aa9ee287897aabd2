#!/usr/bin/env python
"""The engine before and after a change, side by side in one run: numeric MAP-Elites and the LLM loop.

A refactor of the engine must not make it slower. This runs the qd side of
``bench/map_elites.py`` (100-D sphere, batch 256, in_flight 1, the real engine
with its store, events and checkpoints) and of ``bench/llm_loop.py`` (a
scripted OpenAI-compatible server with 100 ms latency, the real sandbox, one
LLM child per proposal) for two source trees, alternating which goes first:

* ``before``: a git ref (default ``fb3d216``, the last commit before the engine
  was split into a driver and parts), checked out into a temporary worktree;
* ``after``: this working tree.

Each run is its own process with ``PYTHONPATH`` set to its tree, and each tree
runs its *own* copy of the bench code (so each measures its engine the way it
was measured when it was current). Reported: medians over the repeats of wall
seconds and engine CPU per candidate, and after/before ratios (below 1 = faster).

Usage::

    python bench/before_after.py                         # 3 repeats (~10 min on 2 cores)
    python bench/before_after.py --repeats 5 --ref fb3d216 --results bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

MAP_ELITES = """
import json, sys
sys.argv = ["map_elites"]
import map_elites as b
r = b.run_qd(seed={seed}, evals={evals}, batch=256, in_flight=1, marks=[])
print("RESULT " + json.dumps({{"wall_s": r["wall_s"], "run_s": r["run_s"], "cpu_s": r["cpu_s"],
      "qd_score": r["final"]["qd_score"], "evaluations": r["evaluations"]}}))
"""

LLM_LOOP = """
import json
import llm_loop as b
r = b.run_qd({concurrency}, {candidates}, 0.1, 2)
print("RESULT " + json.dumps({{"wall_s": r["wall_s"], "cand_per_s": r["cand_per_s"],
      "engine_cpu_ms": r["engine_cpu_ms"], "candidates": r["candidates"]}}))
"""


def _run(tree: Path, code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'bench'}", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=1200
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode or line is None:
        raise RuntimeError(f"{tree}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def _med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="fb3d216", help="the 'before' git ref")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--evals", type=int, default=102_400, help="MAP-Elites evaluations per run")
    ap.add_argument("--candidates", type=int, default=1000, help="LLM-loop candidates per run")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[8, 64])
    ap.add_argument("--results", type=Path, default=None, help="append the table to this file")
    args = ap.parse_args(argv)

    before = Path(tempfile.mkdtemp(prefix="qd_before_")) / "tree"
    subprocess.run(
        ["git", "-C", str(HERE), "worktree", "add", "--detach", str(before), args.ref],
        check=True,
        capture_output=True,
    )
    trees = {"before": before, "after": HERE}
    cases = [("map_elites", None)] + [("llm_loop", c) for c in args.concurrency]
    runs: dict[tuple[str, str, int | None], list[dict]] = {}
    try:
        for rep in range(args.repeats):
            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
            for bench, c in cases:
                for name in order:
                    code = (
                        MAP_ELITES.format(seed=rep, evals=args.evals)
                        if bench == "map_elites"
                        else LLM_LOOP.format(concurrency=c, candidates=args.candidates)
                    )
                    r = _run(trees[name], code)
                    runs.setdefault((bench, name, c), []).append(r)
                    print(f"rep {rep} {bench} c={c} {name}: {json.dumps(r)}", flush=True)
    finally:
        subprocess.run(
            ["git", "-C", str(HERE), "worktree", "remove", "--force", str(before)], capture_output=True
        )

    lines = [
        f"Command: `python bench/before_after.py --ref {args.ref} --repeats {args.repeats}` "
        f"(medians of {args.repeats}; after/before < 1 is faster)",
        "",
        "| benchmark | metric | before | after | after/before |",
        "|---|---|---|---|---|",
    ]
    for bench, c in cases:
        b, a = runs[(bench, "before", c)], runs[(bench, "after", c)]
        label = (
            "MAP-Elites sphere 100-D, batch 256" if bench == "map_elites" else f"LLM loop, concurrency {c}"
        )
        metrics = (
            [("run_s", "engine.run() s"), ("cpu_s", "process CPU s"), ("qd_score", "final QD score")]
            if bench == "map_elites"
            else [("cand_per_s", "candidates/s"), ("engine_cpu_ms", "engine CPU ms/candidate")]
        )
        for key, what in metrics:
            mb, ma = _med(b, key), _med(a, key)
            lines.append(f"| {label} | {what} | {mb:.4g} | {ma:.4g} | {ma / mb:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
