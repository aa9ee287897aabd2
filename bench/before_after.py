#!/usr/bin/env python
"""One bench script on the engine before and after a change, interleaved in one run.

A refactor must not make the engine slower, and only a measurement that runs both
trees on the same machine in the same minutes can show it: load and thermal drift
between two separate runs are larger than the differences sought. So this

* exports ``--ref`` (the "before" tree) with ``git archive REF | tar -x`` into a
  temporary folder; the "after" tree is this working tree;
* runs the named script from ``bench/`` of each tree in turn, B A B A ...,
  ``--repeats`` times each, as its own process with ``PYTHONPATH=<tree>`` and
  ``cwd=<tree>``. Each side runs *its own* copy of the script, because the scripts
  follow the API of their tree (``bench/llm_loop.py`` builds through ``qd.build``
  with parts, which the older tree lacks). Before the first run it checks that
  ``import qd`` resolves into each tree, and stops if it does not;
* reads the ``--json`` each run writes, and reports per configuration the medians
  (over every row of every repeat) of throughput and engine CPU per candidate,
  before and after, and their ratios, beside the 1-minute load average at the
  start of each run.

Fields read, present in both trees' versions of the scripts:

* ``bench/llm_loop.py``: ``runs[]`` grouped by ``system`` and ``concurrency``;
  ``cand_per_s`` (throughput) and ``engine_cpu_ms`` (the main process's CPU per
  candidate).
* ``bench/sphere_loops.py``: ``rows{system: []}``, ``steady_evals_per_s``
  (throughput after compilation) and ``qd_score`` (same search, same score);
  ``processes[]`` wall seconds of a fresh interpreter. It writes no engine CPU; the
  CPU of the whole bench process (its children included) is reported for every
  script instead.

The peers (pyribs, QDax, OpenEvolve) run the same code on both sides, so their
ratios show how much of a difference is the machine. ``sphere_loops.py`` always
runs pyribs and QDax and ``llm_loop.py`` OpenEvolve unless ``--openevolve`` is
given no values: they need the ``bench`` extra (``pip install -e '.[bench]'``).

Usage::

    python bench/before_after.py --ref c256fd4 --dry-run -- llm_loop.py    # where each side's qd is
    python bench/before_after.py --ref c256fd4 --repeats 3 --results bench/RESULTS.md -- llm_loop.py \
        --candidates 1000 --concurrency 8 64 256 --openevolve --decompose 0 --probe-calls 0 --repeats 1
    python bench/before_after.py --ref c256fd4 --repeats 3 --results bench/RESULTS.md -- sphere_loops.py \
        --evals 102400 --seeds 1 --processes 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

from _results import commit, write_section

AFTER = Path(__file__).resolve().parents[1]
LIMITS = {"throughput": 0.95, "cpu": 1.05}  # issue 26: after/before >= 0.95x throughput, <= 1.05x CPU


class Metric(NamedTuple):
    """One reported number: which JSON field, what it is called, and which way is better."""

    field: str
    label: str
    kind: str  # "throughput" (higher is better), "cpu" or "seconds" (lower), "info" (neither)


def llm_loop_rows(data: dict) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for run in data["runs"]:
        groups.setdefault(f"{run['system']}, C={run['concurrency']}", []).append(run)
    return groups


def sphere_loops_rows(data: dict) -> dict[str, list[dict]]:
    groups = {name: list(rows) for name, rows in data["rows"].items()}
    for proc in data["processes"]:
        for system, seconds in proc.items():
            groups.setdefault(f"{system}, whole process", []).append({"wall_s": seconds})
    return groups


class Reader(NamedTuple):
    """How one bench script's JSON becomes configurations (name -> rows) and what to report of them."""

    rows: Callable[[dict], dict[str, list[dict]]]
    metrics: tuple[Metric, ...]


READERS = {
    "llm_loop.py": Reader(
        llm_loop_rows,
        (
            Metric("cand_per_s", "candidates/s", "throughput"),
            Metric("engine_cpu_ms", "engine CPU ms/cand", "cpu"),
        ),
    ),
    "sphere_loops.py": Reader(
        sphere_loops_rows,
        (
            Metric("steady_evals_per_s", "evals/s after compilation", "throughput"),
            Metric("qd_score", "QD score", "info"),
            Metric("wall_s", "wall s", "seconds"),
        ),
    ),
}


def export(ref: str, into: Path) -> Path:
    """``git archive REF | tar -x``: the tree as committed, nothing ignored or untracked."""
    tree = into / "before"
    tree.mkdir()
    archive = subprocess.Popen(["git", "-C", str(AFTER), "archive", ref], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"git archive {ref} failed")
    return tree


def environment(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree))


# Runs a bench script as ``python SCRIPT`` would, but with the script's own folder not first on
# sys.path and the PYTHONPATH entry taken out of this process's path: bench/llm_loop.py puts its
# tree's root first only when the root is not on sys.path already, and behind bench/ the module
# bench/descriptors.py of a tree before its rename (now bench/descriptor_costs.py) would shadow the
# descriptors package. Its child processes keep PYTHONPATH.
# After the script it names the file ``import qd`` loaded, so each run proves which tree it measured.
LAUNCHER = """
import runpy, sys
tree, sys.argv = sys.argv[1], sys.argv[2:]
sys.path = [p for p in sys.path if p != tree]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("before_after: qd from", getattr(sys.modules.get("qd"), "__file__", None), flush=True)
"""
QD_FROM = "before_after: qd from "


def resolved_qd(tree: Path) -> str:
    """Where ``import qd`` lands under the environment a run of ``tree`` gets (the dry run's check)."""
    out = subprocess.run(
        [sys.executable, "-c", "import qd; print(qd.__file__)"],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def inside(where: str, tree: Path) -> bool:
    return Path(where).resolve().is_relative_to(tree.resolve())


def run_once(tree: Path, script: str, args: list[str], out: Path, timeout: float | None) -> dict:
    """One bench process on ``tree``; its JSON, plus its wall and CPU (children included) and the load."""
    load = round(os.getloadavg()[0], 2)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tree), str(tree / "bench" / script), *args, "--json", str(out)],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode or not out.exists():
        raise SystemExit(f"{tree / 'bench' / script}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    where = next(ln[len(QD_FROM) :] for ln in proc.stdout.splitlines() if ln.startswith(QD_FROM))
    if not inside(where, tree):
        raise SystemExit(f"{tree / 'bench' / script} measured qd from {where}, outside {tree}")
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {"data": json.loads(out.read_text()), "wall_s": wall, "cpu_s": cpu, "load": load, "qd": where}


WHOLE = "whole bench process"
PROCESS_METRICS = (
    Metric("wall_s", "wall s", "seconds"),
    Metric("cpu_s", "CPU s, children included", "seconds"),
)


def medians(rows: list[dict], field: str) -> float | None:
    values = [r[field] for r in rows if r.get(field) is not None]
    return statistics.median(values) if values else None


def number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def verdict(kind: str, ratio: float) -> str:
    if kind == "throughput":
        return "ok" if ratio >= LIMITS["throughput"] else f"**below {LIMITS['throughput']}x**"
    if kind == "cpu":
        return "ok" if ratio <= LIMITS["cpu"] else f"**above {LIMITS['cpu']}x**"
    return ""


def table(reader: Reader, runs: dict[str, list[dict]]) -> list[str]:
    """Per configuration and metric: median before, median after, after/before, and the verdict."""
    groups = {side: {} for side in runs}
    for side, side_runs in runs.items():
        for run in side_runs:
            for name, rows in reader.rows(run["data"]).items():
                groups[side].setdefault(name, []).extend(rows)
            groups[side].setdefault(WHOLE, []).append(run)
    lines = [
        "| configuration | metric | before | after | after/before | |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, before_rows in groups["before"].items():
        after_rows = groups["after"].get(name, [])
        for metric in PROCESS_METRICS if name == WHOLE else reader.metrics:
            b, a = medians(before_rows, metric.field), medians(after_rows, metric.field)
            if b is None or a is None:
                continue
            ratio = a / b if b else float("nan")
            cells = (
                name,
                metric.label,
                number(b),
                number(a),
                f"{ratio:.3f}",
                verdict(metric.kind, ratio),
            )
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def section(
    title: str,
    args: argparse.Namespace,
    argv: list[str],
    started: datetime.datetime,
    reader: Reader,
    runs: dict[str, list[dict]],
) -> str:
    """The RESULTS.md section: how it was run, on what, under which load, and the table."""
    command = "python bench/before_after.py " + shlex.join(argv)
    loads = [r["load"] for side in runs.values() for r in side]
    lines = [
        title,
        "",
        f"- Command: `{command}`",
        f"- Before: `{args.ref}` (git archive); after: the working tree, {commit()}; {args.repeats} "
        f"bench process(es) per tree, interleaved B A B A ..., each tree running its own bench/{args.script}",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC, "
        f"{(datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60:.1f} min in all",
        f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}; 1-min load "
        f"average at the start of the runs {min(loads)}-{max(loads)} (before: "
        f"{[r['load'] for r in runs['before']]}, after: {[r['load'] for r in runs['after']]})",
        f"- Medians over every row of every repeat; targets after/before >= {LIMITS['throughput']}x "
        f"throughput and <= {LIMITS['cpu']}x engine CPU",
        "",
        *table(reader, runs),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: before_after.py [options] -- SCRIPT.py [its arguments]")
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="c256fd4", help="the 'before' git ref (default: c256fd4)")
    ap.add_argument("--repeats", type=int, default=3, help="bench processes per tree")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per bench process")
    ap.add_argument("--results", type=Path, default=None, help="write the section into this RESULTS.md")
    ap.add_argument("--dry-run", action="store_true", help="only export and show where qd resolves")
    args = ap.parse_args(argv[:split])
    args.script, bench_args = argv[split + 1], argv[split + 2 :]
    if args.script not in READERS:
        raise SystemExit(f"reads the JSON of {sorted(READERS)} only, not {args.script}")
    reader, script = READERS[args.script], args.script

    started = datetime.datetime.now(datetime.timezone.utc)
    work = Path(tempfile.mkdtemp(prefix="qd_before_after_"))
    try:
        trees = {"before": export(args.ref, work), "after": AFTER}
        for side, tree in trees.items():
            where = resolved_qd(tree)
            print(f"{side}: {tree}, qd from {where}", flush=True)
            if not inside(where, tree):
                raise SystemExit(f"{side}: qd resolves to {where}, outside {tree}")
        if args.dry_run:
            return 0
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for rep in range(args.repeats):
            for side, tree in trees.items():
                run = run_once(tree, script, bench_args, work / f"{side}{rep}.json", args.timeout)
                runs[side].append(run)
                print(
                    f"[{rep}] {side}: {run['wall_s']:.1f} s, CPU {run['cpu_s']:.1f} s, load {run['load']}, "
                    f"qd from {run['qd']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    title = f"## Engine before ({args.ref}) and after: bench/{script} (bench/before_after.py)"
    text = section(title, args, argv, started, reader, runs)
    print(text)
    if args.results:
        write_section(args.results, title, text)
        print(f"wrote {title!r} into {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
