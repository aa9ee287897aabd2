"""``qd lineage RUN_DIR ID``: how a candidate came to be, oldest ancestor first.

A table of the steps (operator, model, fitness, where each is an elite now), then
each step's diff from its parent: the chain of edits that made the candidate.
Ancestors evicted from the archive are shown all the same (marked "not an elite
now"): a lineage is mostly stepping stones the archive has since replaced.
"""

from __future__ import annotations

from typing import Any

from qd import history
from qd.views import render

PROG = "qd lineage"


def main(argv: list[str]) -> None:
    ap = render.parser(PROG, "The ancestor chain of a candidate, with a diff at each step.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("id", metavar="ID", type=int, help="a stored candidate's id (qd show lists elites' ids)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    with render.open_run(PROG, args.run_dir) as run:
        try:
            steps = history.lineage(run, args.id)
            if not steps:  # a negative id: lineage walks nothing
                raise KeyError(args.id)
        except KeyError:
            render.no_candidate(PROG, "ID", args.id, run)
        if args.json:
            return render.dump({"run": str(run.path), "id": args.id, "steps": steps})
        render.line(f"{run.path}: lineage of #{args.id}, {len(steps)} steps, oldest first")
        render.line("")
        render.table(
            None,
            ["step", "id", "operator", "model", "fitness", "valid", "island", "parents", "now"],
            [_row(k, s) for k, s in enumerate(steps)],
        )
        for k, s in enumerate(steps):
            if s.get("diff"):
                render.block(
                    f"step {k}: #{s['id']} ({s['operator']}, {s['model'] or '-'}), "
                    f"fitness {render.fmt(s['fitness'])}",
                    s["diff"],
                    syntax="diff",
                )


def _row(k: int, s: dict[str, Any]) -> list[Any]:
    if s.get("missing"):
        return [k, s["id"], "-", "-", None, None, None, "-", "missing (not in the store)"]
    now = (
        f"elite: island {s['elite'][0]} cell {s['elite'][1]}"
        if s["elite"] is not None
        else "not an elite now"
    )
    if s["error"]:
        now += f"; error: {s['error']}"
    return [
        k,
        s["id"],
        s["operator"] or "-",
        s["model"] or "-",
        s["fitness"],
        s["valid"],
        s["island"],
        ", ".join(f"#{p}" for p in s["parent_ids"]) or "-",
        now,
    ]
