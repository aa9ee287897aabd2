"""``qd compare RUN_A RUN_B ...``: runs side by side, one row each; given a hydra
multirun folder, also one row per setting with the spread over its seeds.

A multirun folder (``qd-run -m ...``) holds numbered run folders ``0/``, ``1/``, ...
(and ``multirun.yaml``); each run's ``.hydra/overrides.yaml`` names its setting.
Runs whose overrides differ only in ``seed=`` are repeats of one setting, so they
are summarised together (median and [min, max] of best, QD score and coverage):
one seed's luck is not a finding.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from qd import rundir
from qd.rundir import RunDir, RunDirError, runs_in
from qd.views import render
from qd.views.summary import summary

PROG = "qd compare"
SPREAD = ("best", "qd_score", "coverage")  # summarised per setting


def main(argv: list[str]) -> None:
    ap = render.parser(PROG, "Runs side by side; a hydra multirun folder also per setting over its seeds.")
    ap.add_argument("runs", metavar="RUN", nargs="+", help="run directories and/or hydra multirun folders")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    rows = []
    for arg in args.runs:
        for path, name, setting in expand(Path(arg)):
            with RunDir(path) as run:
                rows.append({**summary(run), "name": name, "setting": setting})
    settings = spread(rows)
    if args.json:
        return render.dump({"runs": rows, "settings": settings})
    with_setting = any(r["setting"] is not None for r in rows)
    render.table(
        "runs",
        [
            "run",
            *(["setting"] if with_setting else []),
            "experiment",
            "evaluations",
            "best",
            "QD score",
            "coverage",
            "elites",
            "LLM calls",
            "cost",
            "wall time",
        ],
        [
            [
                r["name"],
                *([r["setting"] or "-"] if with_setting else []),
                r["experiment"],
                r["evaluations"],
                r["best"],
                r["qd_score"],
                f"{r['coverage']:.2%}",
                r["elites"],
                r["llm_calls"],
                r["cost"],
                render.seconds(r["wall_s"]),
            ]
            for r in rows
        ],
    )
    if settings:
        render.table(
            "per setting (median [min, max] over its runs)",
            ["setting", "runs", "best", "QD score", "coverage"],
            [[s["setting"], s["runs"], *(_spread(s[k], k == "coverage") for k in SPREAD)] for s in settings],
        )


def expand(path: Path) -> list[tuple[Path, str, str | None]]:
    """``path`` as (run dir, name, setting) rows: itself if it is a run, else each run of a
    multirun folder with its setting (``(defaults)`` when only the seed varies; ``?`` when
    hydra saved no overrides); fails with one line if it is neither."""
    try:
        runs = runs_in(path)
    except RunDirError as e:
        render.fail(PROG, f"RUN {e}")
    if runs == [path]:
        return [(path, path.name or str(path), None)]
    return [(d, f"{path.name}/{d.name}", _label(rundir.setting(d))) for d in runs]


def _label(kept: list[str] | None) -> str:
    return "?" if kept is None else " ".join(kept) or "(defaults)"


def spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting of the multirun members: the run count and, of best, QD score and
    coverage, the median, min and max (runs with an empty archive have no best)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["setting"] is not None:
            groups[r["setting"]].append(r)
    out = []
    for name, members in groups.items():
        entry: dict[str, Any] = {"setting": name, "runs": len(members)}
        for k in SPREAD:
            values = np.asarray([r[k] for r in members if r[k] is not None], np.float64)
            entry[k] = (
                {"median": float(np.median(values)), "min": float(values.min()), "max": float(values.max())}
                if len(values)
                else None
            )
        out.append(entry)
    return out


def _spread(s: dict[str, float] | None, percent: bool) -> str:
    if s is None:
        return "-"
    f = (lambda x: f"{x:.2%}") if percent else render.fmt
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"
