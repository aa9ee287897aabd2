"""``trajectory``: what each evolved agent did with the model while it was evaluated, in
the Agent Data Protocol's trajectory shape (an ``id``, ``content``: the steps, and
``details``), for training or studying agents on the runs that made them.

The store keeps every model call of an agent's evaluation (``Store.trace``), each with
the task item it served when the task's entry said so (``llm.item``, set by
agent_design's and agent_team's entries before each question): a row is one agent
candidate on one item, its calls in order, ``details.item`` the item's index in the
evaluation's list. Calls the entry did not tag (older runs, tasks that do not say) make
one row per candidate with ``details.item`` null. Steps, with the model as the acting agent:

- a prompt's system message: an ``observation`` from the ``environment`` (the frame
  the evolved program set), a user message a ``message`` from the ``user``, an
  assistant message (a conversation the program replayed) a ``message`` from the ``agent``;
- the model's answer: a ``message`` from the ``agent``;
- a failed or refused call: an ``observation`` from the ``environment`` with the reason.

A call that continues the previous one (its messages are the previous messages plus
the answer, then more) adds only its new messages, so a multi-turn agent reads as one
conversation. ``schemas/trajectory.schema.json`` is the row's shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qd.export.rows import BATCH
from qd.rundir import RunDir

COLUMNS = {"id": "string", "content": "json", "details": "json"}
OPTIONS: dict[str, Any] = {}
GENOMES = ("agent", "team")  # genomes whose evaluation has agents call the model
SCHEMA = Path(__file__).resolve().parent / "schemas" / "trajectory.schema.json"

_STEP = {
    "system": ("observation", "environment"),
    "user": ("message", "user"),
    "assistant": ("message", "agent"),
}


def rows(run: RunDir, options: dict) -> Iterator[dict]:
    """One row per (agent candidate, task item) with model calls, in id order, then item order.

    Raises:
        ValueError: the run evolved no agents (one line, for the command line).
    """
    agents = 0
    for page in run.store.columns(("id", "genome"), kinds=("text",), page=BATCH):
        ids = [i for i, genome in page if genome in GENOMES]
        agents += len(ids)
        for c in run.store.get(ids):
            calls = run.store.traces.of(c.id)
            items = dict.fromkeys(call.get("item") for call in calls)  # in the order first called
            for item in sorted(items, key=lambda i: (i is None, str(type(i)), i if i is not None else 0)):
                yield _row(run, c, item, [call for call in calls if call.get("item") == item])
    if not agents:
        raise ValueError(
            f"trajectory: {run.path} has no agent genomes (only runs with genome=agent or team, "
            "e.g. experiment=agent_design, record agents' model calls)"
        )


def _row(run: RunDir, c: Any, item: int | str | None, calls: list[dict]) -> dict:
    return {
        "id": f"{run.name}/{c.id}" + ("" if item is None else f"/{item}"),
        "content": steps(calls),
        "details": {
            "run": run.name,
            "candidate": c.id,
            "item": item,
            "models": sorted({call["model"] for call in calls if call.get("model")}),
            "calls": sum("text" in call for call in calls),
            "failed": sum("error" in call for call in calls),
            "tokens_in": sum(call.get("tokens_in", 0) for call in calls),
            "tokens_out": sum(call.get("tokens_out", 0) for call in calls),
            "fitness": c.fitness,
            "valid": c.valid,
        },
    }


def steps(calls: list[dict]) -> list[dict[str, str]]:
    """A trace's calls as ADP steps (see the module doc)."""
    out: list[dict[str, str]] = []
    said: list[dict] = []  # the conversation so far: the last call's messages and answer
    for call in calls:
        sent = (
            call["messages"] or []
        )  # None: a refused call whose messages were malformed or too long to keep
        new = sent[len(said) :] if said and sent[: len(said)] == said else sent
        out += [_step(*_STEP[m["role"]], m["content"]) for m in new]
        if "text" in call:
            out.append(_step("message", "agent", call["text"]))
            said = [*sent, {"role": "assistant", "content": call["text"]}]
        else:
            out.append(_step("observation", "environment", call["error"]))
            said = []
    return out


def _step(kind: str, source: str, content: str) -> dict[str, str]:
    return {"type": kind, "source": source, "content": content}
