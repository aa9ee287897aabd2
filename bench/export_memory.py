#!/usr/bin/env python
"""``qd export``'s time and peak memory at two run sizes, beside the naive export a user writes today.

Builds two synthetic runs with ``bench/explore_latency.py``'s ``build_run`` (stored
programs with lineages, operators, models, prompts, answers and errors on a grid
archive; ``--small`` and ``--large`` candidates, 100k and 1M by default), then
exports each kind in ``--kinds`` (``--format``, parquet by default) from a fresh
process per export, and reports its wall time and peak resident memory (the
child's ``VmHWM``, read by the child as it ends: ``ru_maxrss`` would not do, Linux
carries it over ``exec`` from the forking parent, which grows as it builds the runs).
The target: an export streams, so its peak memory at the
large run is at most 1.2x that at the small one. The same holds for the readers ``qd stats``
and ``qd explore`` (``--kinds stats,explore``): each reads the store a page at a time.

Beside it (the peer), what a user hand-writes against ``store.sqlite`` today:
``pandas.read_sql`` of the candidates table (genomes, prompts and answers) and
``DataFrame.to_parquet``, in its own process, timed and measured the same way.

Usage::

    PYTHONPATH=. python bench/export_memory.py                             # 100k and 1M (about 30 min)
    PYTHONPATH=. python bench/export_memory.py --small 10000 --large 100000 --kinds elites,trace
    PYTHONPATH=. python bench/export_memory.py --json out.json
    PYTHONPATH=. python bench/export_memory.py --kinds stats,explore   # qd stats and qd explore
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VMHWM = "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n"
NAIVE = (
    """
import sqlite3, sys
import pandas as pd
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
frame = pd.read_sql("SELECT id, parent_ids, island, operator, model, prompt, response, text, fitness, "
                    "valid, error FROM candidates ORDER BY id", db)
frame.to_parquet(sys.argv[2])
print(len(frame))
"""
    + VMHWM
)
EXPORT = (
    """
import sys
from qd.export import write
path, rows = write(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
print(rows)
"""
    + VMHWM
)

# The readers beside the exports: ``qd stats --json`` (its output kept off stdout) and what
# ``qd explore`` computes for a run before its first page (``Explorer.warm``) plus the
# statistics endpoint; each prints the candidates it counted.
READERS = {
    "stats": """
import contextlib, io, json, sys
from qd.views import stats
out = io.StringIO()
with contextlib.redirect_stdout(out):
    stats.main([sys.argv[1], "--json"])
print(json.loads(out.getvalue())["totals"]["candidates"])
""",
    "explore": """
import sys
from qd.explore import data
from qd.explore.app import Explorer
explorer = Explorer([sys.argv[1]])
explorer.warm(0)
print(sum(r["candidates"] for r in data.stats(explorer.runs[0], "operator,model")))
explorer.close()
""",
}
READERS = {k: v + VMHWM for k, v in READERS.items()}


def measure(code: str, *args: str) -> dict[str, float]:
    """Wall seconds, peak RSS (MB) and the printed row count of ``code`` run in a fresh
    interpreter, which prints its rows and then its own ``VmHWM`` (kB) last."""
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,  # ``python -c`` puts the working folder first on sys.path: this tree, wherever called from
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    seconds = time.perf_counter() - started
    if child.returncode:
        raise SystemExit(f"export_memory: {args} failed: {child.stderr[-1500:]}")
    rows, peak_kb = child.stdout.split()[-2:]
    return {"seconds": seconds, "peak_mb": int(peak_kb) / 1024, "rows": int(rows)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument(
        "--kinds",
        default="elites,sft,dpo,trace",
        help=f"export kinds, and the readers {','.join(READERS)} (qd stats, qd explore's first page)",
    )
    ap.add_argument("--format", default="parquet", choices=("jsonl", "parquet", "hf"))
    ap.add_argument("--side", type=int, default=300, help="grid side of the synthetic archive (one island)")
    ap.add_argument("--work", type=Path, help="keep the runs and exports here (default: a temporary folder)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(BENCH))
    from explore_latency import build_run

    kinds = args.kinds.split(",")
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for size in (args.small, args.large):
            run = work / f"run{size}"
            if not (run / "store.sqlite").exists():
                started = time.perf_counter()
                build_run(run, args.side, 1, size)
                print(f"built {size:,} candidates in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            out[str(size)] = {
                "naive": measure(NAIVE, str(run / "store.sqlite"), str(work / f"naive{size}.parquet"))
            }
            for kind in kinds:
                target = work / f"{kind}{size}.{args.format}"
                if kind in READERS:
                    out[str(size)][kind] = measure(READERS[kind], str(run))
                else:
                    out[str(size)][kind] = measure(EXPORT, str(run), kind, args.format, str(target))
                print(f"{size:>9,} {kind:<8} {out[str(size)][kind]}", file=sys.stderr)
    print(
        f"qd export --format {args.format} (and the readers asked for): time and peak memory "
        "(fresh process each; peak RSS is the child's VmHWM)"
    )
    print(
        f"{'kind':<8} {'rows small':>11} {'rows large':>11} {'s small':>9} {'s large':>9} "
        f"{'MB small':>9} {'MB large':>9} {'MB ratio':>9}"
    )
    small, large = out[str(args.small)], out[str(args.large)]
    for kind in ["naive", *kinds]:
        a, b = small[kind], large[kind]
        print(
            f"{kind:<8} {a['rows']:>11,} {b['rows']:>11,} {a['seconds']:>9.1f} {b['seconds']:>9.1f} "
            f"{a['peak_mb']:>9.0f} {b['peak_mb']:>9.0f} {b['peak_mb'] / a['peak_mb']:>9.2f}"
        )
    print("target: MB ratio <= 1.2 for every qd kind (naive: pandas.read_sql + to_parquet, the peer)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
