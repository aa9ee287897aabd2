"""``trajectory``: what each evolved agent did with the model while it was evaluated, in
the Agent Data Protocol's trajectory shape (an ``id``, ``content``: the steps, and
``details``), for training or studying agents on the runs that made them.

The store keeps every model call of an agent's evaluation (``Store.trace``) but not
which task item a call served (agents call ``llm`` freely; the sandbox only counts
and records), so a row is one agent candidate, all its calls in order, and
``details.item`` is null. Steps, with the model as the acting agent:

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

from qd.export import candidates
from qd.rundir import RunDir

COLUMNS = {"id": "string", "content": "json", "details": "json"}
OPTIONS: dict[str, Any] = {}
SCHEMA = Path(__file__).resolve().parent / "schemas" / "trajectory.schema.json"

_STEP = {"system": ("observation", "environment"), "user": ("message", "user"), "assistant": ("message", "agent")}


def rows(run: RunDir, options: dict) -> Iterator[dict]:
    """One row per agent candidate that made model calls, in id order.

    Raises:
        ValueError: the run evolved no agents (one line, for the command line).
    """
    agents = [i for i, genome in run.store.columns(("id", "genome"), kinds=("text",)) if genome == "agent"]
    if not agents:
        raise ValueError(f"trajectory: {run.path} has no agent genomes (only runs with genome=agent, "
                         "e.g. experiment=agent_design, record agents' model calls)")
    for c in candidates(run, agents):
        calls = run.store.trace(c.id)
        if not calls:
            continue
        yield {
            "id": f"{run.name}/{c.id}",
            "content": steps(calls),
            "details": {
                "run": run.name, "candidate": c.id, "item": None,
                "models": sorted({call["model"] for call in calls if call.get("model")}),
                "calls": sum("text" in call for call in calls), "failed": sum("error" in call for call in calls),
                "tokens_in": sum(call.get("tokens_in", 0) for call in calls),
                "tokens_out": sum(call.get("tokens_out", 0) for call in calls),
                "fitness": c.fitness, "valid": c.valid,
            },
        }


def steps(calls: list[dict]) -> list[dict[str, str]]:
    """A trace's calls as ADP steps (see the module doc)."""
    out: list[dict[str, str]] = []
    said: list[dict] = []  # the conversation so far: the last call's messages and answer
    for call in calls:
        sent = call["messages"] or []  # None: a refused call whose messages were malformed or too long to keep
        new = sent[len(said):] if said and sent[:len(said)] == said else sent
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
