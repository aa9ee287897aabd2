"""``trace``: one record per child (a stored candidate with a parent), in store order —
what OpenEvolve's evolution trace gives its users: parent and child, their fitness and
metrics, the improvement, the diff, and the prompt and answer that made the child.

It is the raw material for studying operators (which prompts pay off) and for
training on improvements (filter ``improvement > 0``). Founders (no parent) have no
record. The first parent is the parent (a crossover's others are in the store).
The store is read a page at a time and parents looked up a page at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from qd.export import BATCH, batched, fitness, messages
from qd.rundir import RunDir

COLUMNS = {
    "child_id": "int64",
    "parent_id": "int64",  # the first parent
    "island": "int64",
    "operator": "string",
    "model": "string",
    "valid": "bool",
    "error": "string",  # why the child is invalid (null when valid)
    "entered": "bool",  # it beat its cell's elite when stored
    "parent_fitness": "float64",
    "child_fitness": "float64",
    "improvement": "float64",  # child - parent fitness; null unless both are valid
    "parent_metrics": "json",
    "child_metrics": "json",
    "child_text": "string",  # null for vector genomes
    "diff": "string",  # unified diff from the parent's text (null for vectors)
    "prompt": "messages",  # what the operator sent (null for numeric operators)
    "response": "string",  # the model's answer
}
OPTIONS: dict[str, Any] = {}


def rows(run: RunDir, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from qd.history import diff, fates

    f = fates(run)
    entered = dict(zip(f["id"].tolist(), f["entered"].tolist()))
    children = (c for c in run.store.iter(page=BATCH) if c.parent_ids and c.kind in ("text", "vector"))
    for page in batched(children):
        held = {int(c.parent_ids[0]) for c in page} & entered.keys()  # an elites-only store lacks evicted parents
        parents = {p.id: p for p in run.store.get(sorted(held))}
        for c in page:
            p = parents.get(int(c.parent_ids[0]))
            child_fitness = fitness(c.fitness, c.valid)
            parent_fitness = fitness(p.fitness, p.valid) if p is not None else None
            text = c.kind == "text"
            yield {
                "child_id": c.id, "parent_id": int(c.parent_ids[0]), "island": c.island, "operator": c.operator,
                "model": c.model, "valid": c.valid, "error": c.error, "entered": entered.get(c.id, False),
                "parent_fitness": parent_fitness, "child_fitness": child_fitness,
                "improvement": None if None in (child_fitness, parent_fitness) else child_fitness - parent_fitness,
                "parent_metrics": p.metrics if p is not None else None, "child_metrics": c.metrics,
                "child_text": c.text if text else None,
                "diff": diff(p.text or "", c.text or "", f"#{p.id}", f"#{c.id}") if text and p is not None else None,
                "prompt": messages(c.prompt), "response": c.response,
            }
