"""``qd stats RUN_DIR``: which operators, models and meta instructions pay off.

Per group (``--by``, default operator and model): candidates, how many were valid,
how many entered the archive, the mean improvement over the parent, tokens and
cost (``qd.history.operator_stats``), with a totals row; a per-instruction table
when the run evolved meta instructions; and the model-call ledger per role and
model, which also counts the calls no candidate carries (failed calls, judges,
meta mutations), so its totals are what the run was billed. A Pareto run adds its
hypervolume (``qd.fronts``): the total, and per front, the largest first.
"""

from __future__ import annotations

from typing import Any

from qd import history
from qd.fronts import cell_rows, of_run
from qd.llm.ledger import USAGE_FIELDS
from qd.views import render

PROG = "qd stats"
LEDGER = ("role", "model", *USAGE_FIELDS)  # a row of the store's llm_calls totals


def main(argv: list[str]) -> None:
    ap = render.parser(
        PROG,
        "Per operator, model and meta instruction: validity, archive entries, "
        "improvement, tokens, cost; and the model-call ledger.",
    )
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument(
        "--by",
        default="operator,model",
        help=f"comma-separated grouping, some of {','.join(history.GROUPS)} (default operator,model)",
    )
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    by = tuple(b.strip() for b in args.by.split(",") if b.strip())
    bad = [b for b in by if b not in history.GROUPS] or ([] if by else [args.by])
    if bad:
        render.fail(
            PROG,
            f"--by {bad[0]!r}: not a grouping; pass some of {','.join(history.GROUPS)}, "
            "comma-separated (e.g. --by operator,model)",
        )
    with render.open_run(PROG, args.run_dir) as run:
        groups = {",".join(by): history.operator_stats(run, by)}
        if "instruction" not in by and run.store.count(kind="instruction"):
            groups["instruction"] = history.operator_stats(run, ("instruction",))
        totals = _totals(next(iter(groups.values())), history.operator_stats(run, ()))
        ledger = [dict(zip(LEDGER, row)) for row in run.store.calls.totals()]
        ledger_total = {k: sum(r[k] for r in ledger) for k in LEDGER[2:]}
        elites_only = not run.store.keeps_every_candidate()
        volume = _hypervolume(run)
        if args.json:
            return render.dump(
                {
                    "run": str(run.path),
                    "elites_only": elites_only,
                    "by": list(by),
                    "groups": groups,
                    "totals": totals,
                    "llm_calls": ledger,
                    "llm_totals": ledger_total,
                    **({"hypervolume": volume} if volume else {}),
                }
            )
        render.line(f"{run.path}: {totals['candidates']} candidates")
        if elites_only:
            render.line(
                "this run stored only its elites (runner.store=elites): the numbers below are "
                "theirs, not every evaluation's"
            )
        render.line("")
        for key, rows in groups.items():
            names = key.split(",")
            render.table(
                f"by {key.replace(',', ' and ')}",
                [*names, "candidates", "valid", "entered", "mean improvement", "tokens", "cost"],
                [
                    [*(r[b] for b in names), *_numbers(r)]
                    for r in [*rows, {**dict.fromkeys(names, ""), names[0]: "total", **totals}]
                ],
            )
        if volume:
            render.table(
                f"fronts: hypervolume {render.fmt(volume['total'])} in total "
                f"(reference {', '.join(render.fmt(r) for r in volume['reference'])})",
                ["island", "cell", "members", "hypervolume"],
                [[r["island"], r["cell"], r["members"], r["hypervolume"]] for r in volume["cells"]],
            )
        if ledger:
            render.table(
                "model calls (ledger)",
                list(LEDGER),
                [[r[k] for k in LEDGER] for r in [*ledger, {"role": "total", "model": "", **ledger_total}]],
            )
        else:
            render.line("no model calls")


def _hypervolume(run: Any) -> dict[str, Any] | None:
    """A Pareto run's reading (``qd.fronts.Hypervolumes.reading``) with its fronts' rows
    under ``cells``; None for one elite per cell or while every front is empty."""
    read = of_run(run)
    if read is None:
        return None
    state, meter = read
    reading = meter.reading(state)
    return reading and {**reading, "cells": cell_rows(state, meter.cells(state))}


def _numbers(r: dict[str, Any]) -> list[Any]:
    return [
        r["candidates"],
        f"{r['valid']} ({r['valid_rate']:.0%})",
        f"{r['entered']} ({r['entered_rate']:.0%})",
        r["mean_improvement"],
        r["tokens"],
        r["cost"],
    ]


def _totals(rows: list[dict[str, Any]], everyone: list[dict[str, Any]]) -> dict[str, Any]:
    """The groups summed; the mean improvement over every candidate that has one (``everyone``:
    the one row of all candidates; not a mean of means)."""
    n, valid, entered = (sum(r[k] for r in rows) for k in ("candidates", "valid", "entered"))
    return {
        "candidates": n,
        "valid": valid,
        "valid_rate": valid / n if n else 0.0,
        "entered": entered,
        "entered_rate": entered / n if n else 0.0,
        "mean_improvement": everyone[0]["mean_improvement"] if everyone else None,
        "tokens": sum(r["tokens"] for r in rows),
        "cost": sum(r["cost"] for r in rows),
    }
