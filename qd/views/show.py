"""``qd show RUN_DIR``: the elites, best first (``--top``, ``--island``, ``--cell``), or one
stored candidate in full (``--id``), under a one-line summary of the run.

A listing shows each elite's first line of text so a screen holds many; ``--full``
prints every elite's whole text under its row, since a truncated genome is the
usual complaint about listings. ``--id`` answers "what is this candidate": its
evaluation, where it sits now, how it was made (prompt, answer, diff from its
parent) and, for agents, the model calls its evaluation made.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from qd import history
from qd.rundir import RunDir
from qd.views import render
from qd.views.summary import header, summary

PROG = "qd show"
FIRST_LINE = 60  # characters of an elite's first line of text in a listing


def main(argv: list[str]) -> None:
    ap = render.parser(PROG, "The elites of a run, best first, or one stored candidate in full.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--top", type=render.positive, default=10, help="elites to list (default 10)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--cell", type=int, help="the elite(s) of this cell, on every island unless --island")
    which.add_argument("--id", type=int, help="one stored candidate (elite or not), in full")
    ap.add_argument("--island", type=int, help="only this island's elites")
    ap.add_argument("--full", action="store_true", help="untruncated: each elite's whole text under its row")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    with render.open_run(PROG, args.run_dir) as run:
        g = run.geometry
        render.in_range(PROG, "--island", args.island, g.islands, "islands")
        if g.kind != "novelty":
            render.in_range(PROG, "--cell", args.cell, g.cells, "cells per island")
        head = summary(run)
        if args.id is not None:
            return candidate(run, args.id, head, args.json)
        rows = run.elites(island=args.island)
        if args.cell is not None:
            rows = [r for r in rows if r["cell"] == args.cell]
        else:
            rows = rows[: args.top]
        for rank, r in enumerate(rows, 1):
            r["rank"] = rank
        if args.json:
            return render.dump({"run": head, "elites": rows})
        render.line(header(head))
        listing(rows, args.full, g.axes)


def listing(rows: list[dict[str, Any]], full: bool, axes: tuple[str, ...]) -> None:
    """The elites as a table; with ``full``, each one's row and whole genome as a block."""
    if not rows:
        return render.line("no elites here yet")
    columns = [
        "rank",
        "id",
        "island",
        "cell",
        "fitness",
        f"descriptor ({', '.join(axes)})",
        "operator",
        "model",
        "genome",
    ]
    if not full:
        render.line("")
        return render.table(None, [*columns, "text"], [[*_cells(r), _first_line(r)] for r in rows])
    for r in rows:
        title = "  ".join(f"{c.split(' ')[0]} {render.fmt(v)}" for c, v in zip(columns, _cells(r)))
        render.block(title, r["text"] if "text" in r else _vector(r["vector"]))


def _cells(r: dict[str, Any]) -> list[Any]:
    return [
        r["rank"],
        r["id"],
        r["island"],
        r["cell"],
        r["fitness"],
        r["descriptor"],
        r["operator"],
        r["model"],
        r["genome"],
    ]


def _first_line(r: dict[str, Any]) -> str:
    if "text" in r:
        lines = [s for s in r["text"].splitlines() if s.strip()]
        text = lines[0].strip() if lines else ""
    else:
        text = render.fmt(r["vector"])
    return text if len(text) <= FIRST_LINE else text[: FIRST_LINE - 3] + "..."


def _vector(v: list[float]) -> str:
    """A vector genome whole: every float32 value to its full precision."""
    return "[" + ", ".join(f"{x:.9g}" for x in v) + "]"


def candidate(run: RunDir, candidate_id: int, head: dict[str, Any], as_json: bool) -> None:
    """One candidate in full (``--id``)."""
    try:
        (c,) = run.store.get([candidate_id])
    except KeyError:
        render.no_candidate(PROG, "--id", candidate_id, run)
    snap = run.snapshot()
    elite = [[int(i), int(k)] for i, k in np.argwhere(snap.genome_id == c.id)]
    out = {
        "id": c.id,
        "genome": c.genome,
        "island": c.island,
        "parent_ids": list(c.parent_ids),
        "operator": c.operator,
        "model": c.model,
        "instruction": c.instruction,
        "fitness": c.fitness,
        "valid": c.valid,
        "error": c.error,
        "descriptor": None if c.descriptor is None else c.descriptor.tolist(),
        "elite": elite,
        "eval_seconds": c.eval_seconds,
        "tokens_in": c.tokens_in,
        "tokens_out": c.tokens_out,
        "cost": c.cost,
        "created": c.created,
        "metrics": c.metrics or {},
        "artifacts": c.artifacts or {},
        "prompt": _messages(c.prompt),
        "response": c.response,
        "text": c.text,
        "vector": None if c.vector is None else c.vector.tolist(),
        "diff": history.parent_diff(run, c),
        "trace": run.store.traces.of(c.id),
    }
    if as_json:
        return render.dump({"run": head, "candidate": out})
    render.line(header(head))
    render.line("")
    where = ", ".join(f"island {i} cell {k}" for i, k in elite) or "not an elite now"
    fields = [
        ("id", c.id),
        ("genome", c.genome),
        ("fitness", c.fitness),
        ("valid", c.valid),
        ("error", c.error),
        ("elite", where),
        ("descriptor", out["descriptor"]),
        ("born on island", c.island),
        ("parents", ", ".join(f"#{p}" for p in c.parent_ids) or "none"),
        ("operator", c.operator),
        ("model", c.model),
        ("instruction", c.instruction),
        ("tokens in / out", f"{c.tokens_in} / {c.tokens_out}"),
        ("cost", c.cost),
        ("eval seconds", c.eval_seconds),
        *((f"metric {k}", v) for k, v in (c.metrics or {}).items()),
    ]
    render.table(None, ["field", "value"], [[k, render.fmt(v)] for k, v in fields])
    for k, v in (c.artifacts or {}).items():
        render.block(f"evaluator feedback: {k}", v if isinstance(v, str) else json.dumps(v, indent=1))
    render.block(
        "text" if c.text is not None else "vector", c.text if c.text is not None else _vector(out["vector"])
    )
    if out["diff"]:
        render.block(f"diff from parent #{c.parent_ids[0]}", out["diff"], syntax="diff")
    for m in out["prompt"] or []:
        render.block(f"prompt: {m.get('role', '?')}", str(m.get("content", "")))
    if c.response is not None:
        render.block("model's answer", c.response)
    for call in out["trace"]:
        said = call["text"] if "text" in call else f"error: {call.get('error')}"
        render.block(
            f"evaluation's model call {call.get('n')} ({call.get('model')})",
            "\n".join(
                [
                    *(f"[{m.get('role')}] {m.get('content')}" for m in call.get("messages", [])),
                    f"[answer] {said}",
                ]
            ),
        )


def _messages(prompt: str | None) -> list[dict[str, Any]] | None:
    """The stored prompt (JSON of the messages sent) as messages; a prompt that is not JSON as one."""
    if prompt is None:
        return None
    try:
        messages = json.loads(prompt)
    except json.JSONDecodeError:
        return [{"role": "user", "content": prompt}]
    return messages if isinstance(messages, list) else [{"role": "user", "content": prompt}]
