"""``qd plot RUN_DIR [RUN_DIR ...] [--out DIR] [--axes i,j] [--parallel] [--islands all|0,2]
[--format png,svg] [--dpi N]``: writes a run's figures and prints their paths.

Per run: ``archive.<fmt>`` (:func:`qd.plot.archive.archive_figure`), ``curves.<fmt>``
(:func:`qd.plot.curves.curves_figure`), for a Pareto run ``fronts.<fmt>`` (the
hypervolume curve and the cells' fronts, :func:`qd.plot.fronts.fronts_figure`) and with
``--parallel`` ``parallel.<fmt>``;
given several runs (or a multirun folder), each run's figures go to a folder of its
own and ``compare.<fmt>`` (:func:`qd.plot.curves.compare_figure`) to ``--out`` itself.

``--out`` defaults to ``./qd-plots/<name>/`` (the run's or multirun folder's name;
``compare`` for several arguments) in the current directory. The runs are only read:
an ``--out`` inside a run directory is refused, so a live run's folder never holds
anything it did not write itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from qd.plot.archive import archive_figure, check_axes, parallel_figure
from qd.plot.curves import compare_figure, curves_figure
from qd.plot.fronts import fronts_figure
from qd.rundir import RunDir, RunDirError, runs_in

FORMATS = ("png", "svg", "pdf")


class UsageError(ValueError):
    """Bad input: its message names the argument and the fix (printed on one line, exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the usage too: keep the error one line
        raise UsageError(f"{message} (see qd plot --help)")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="qd plot",
        description="Write a run's archive heatmaps and curves as PNG and SVG; "
        "several runs (or a multirun folder) also get their curves compared, grouped by setting.",
    )
    ap.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories or multirun folders"
    )
    ap.add_argument(
        "--out", type=Path, metavar="DIR", help="folder for the figures (default ./qd-plots/<name>/)"
    )
    ap.add_argument(
        "--axes",
        metavar="i,j",
        help="two descriptor axes for the heatmap, e.g. 0,2 (default 0,1); "
        "over more axes each pixel shows the best elite over the others",
    )
    ap.add_argument(
        "--parallel", action="store_true", help="also draw the elites' descriptors on parallel axes"
    )
    ap.add_argument(
        "--islands",
        default="all",
        metavar="all|0,2",
        help="islands to draw: all (default) or a list, e.g. 0,2",
    )
    ap.add_argument(
        "--format",
        default="png,svg",
        metavar="png,svg",
        help=f"file formats, some of {','.join(FORMATS)} (default png,svg)",
    )
    ap.add_argument("--dpi", type=int, default=150, metavar="N", help="PNG resolution (default 150)")
    return ap


def main(argv: list[str] | None = None) -> None:
    try:
        plot(parser().parse_args(sys.argv[1:] if argv is None else argv), print)
    except UsageError as e:
        print(f"qd plot: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def plot(args: argparse.Namespace, report: Any) -> list[Path]:
    """Writes the figures ``args`` ask for, calling ``report(path)`` for each file; the paths.

    Raises:
        UsageError: a bad argument.
    """
    formats = _formats(args.format)
    axes = _numbers("--axes", args.axes, "two axis numbers, e.g. --axes 0,2") if args.axes else None
    islands = (
        None if args.islands == "all" else _numbers("--islands", args.islands, "all, or numbers, e.g. 0,2")
    )
    if args.dpi <= 0:
        raise UsageError(f"--dpi {args.dpi}: give a positive resolution, e.g. --dpi 150")
    try:
        named = named_runs(args.runs)
    except RunDirError as e:
        raise UsageError(f"RUN_DIR {e}") from None
    out = args.out or Path.cwd() / "qd-plots" / (
        args.runs[0].resolve().name if len(args.runs) == 1 else "compare"
    )
    for path in named.values():
        if out.resolve().is_relative_to(path.resolve()):
            raise UsageError(
                f"--out {out} is inside the run directory {path}; qd plot never writes into a run: "
                "pass --out DIR elsewhere"
            )
    runs = {name: RunDir(path) for name, path in named.items()}
    written: list[Path] = []

    def save(fig: Any, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for fmt in formats:
            path = folder / f"{name}.{fmt}"
            fig.savefig(path, dpi=args.dpi)
            written.append(path)
            report(path)

    try:
        chosen = {
            name: _choices(run, axes, islands) for name, run in runs.items()
        }  # every run's, before any file
        for name, run in runs.items():
            picked, shown = chosen[name]
            folder = out / name
            save(archive_figure(run, picked, shown, args.dpi)[0], folder, "archive")
            save(curves_figure(run, shown, args.dpi)[0], folder, "curves")
            if run.geometry.pareto is not None:
                save(fronts_figure(run, args.dpi)[0], folder, "fronts")
            if args.parallel:
                save(parallel_figure(run, shown, args.dpi)[0], folder, "parallel")
        if len(runs) > 1:
            save(compare_figure(runs, args.dpi)[0], out, "compare")
    finally:
        for run in runs.values():
            run.close()
    return written


def named_runs(paths: list[Path]) -> dict[str, Path]:
    """Each run the arguments name, by the folder its figures go to (relative to ``--out``):
    one run: ``""`` (``--out`` itself); one multirun folder: its run's number; several
    arguments: each run's folder name, a multirun's runs under the multirun's name."""
    named: dict[str, Path] = {}
    for path in paths:
        runs = runs_in(path)
        for run in runs:
            if len(paths) == 1:
                name = "" if run == path else run.name
            else:
                name = run.resolve().name if run == path else f"{path.resolve().name}/{run.name}"
            unique, k = name, 1
            while unique in named:
                k += 1
                unique = f"{name}-{k}"
            named[unique] = run
    return named


def _formats(raw: str) -> list[str]:
    formats = [f.strip().lower() for f in raw.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UsageError(f"--format {raw}: give some of {','.join(FORMATS)}, e.g. --format png,svg")
    return formats


def _numbers(flag: str, raw: str, fix: str) -> list[int]:
    try:
        return [int(x) for x in raw.split(",")]
    except ValueError:
        raise UsageError(f"{flag} {raw}: give {fix}") from None


def _choices(run: RunDir, axes: list[int] | None, islands: list[int] | None) -> tuple[Any, list[int] | None]:
    """``--axes`` and ``--islands`` checked against ``run``'s archive: (axes or None, islands or None)."""
    g = run.geometry
    if islands is not None and not all(0 <= i < g.islands for i in islands):
        raise UsageError(
            f"--islands {','.join(map(str, islands))}: {run.path} has {g.islands} islands "
            f"(0..{g.islands - 1}); pick among them, or pass --islands all"
        )
    if axes is None:
        return None, islands
    try:
        return check_axes(tuple(axes), g.dim), islands
    except ValueError as e:
        raise UsageError(f"--axes {','.join(map(str, axes))}: {run.path}: {e}") from None
