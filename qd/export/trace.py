"""``trace``: one record per child (a stored candidate with a parent), in store order —
what OpenEvolve's evolution trace gives its users: parent and child, their fitness and
metrics, the improvement, the diff, and the prompt and answer that made the child.

It is the raw material for studying operators (which prompts pay off) and for
training on improvements (filter ``improvement > 0``). Founders (no parent) have no
record. The first parent is the parent (a crossover's others are in the store).
The store is read a page at a time (``history.pages``) and parents looked up a page at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from qd.export.rows import BATCH, fitness, messages
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
    "diff": "string",  # unified diff from the parent's text (null for vectors and children with no text)
    "prompt": "messages",  # what the operator sent (null for numeric operators)
    "response": "string",  # the model's answer
}
OPTIONS: dict[str, Any] = {}


def rows(run: RunDir, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from qd.history import diff, pages

    for page in pages(run, page=BATCH):
        kids = np.flatnonzero(page["parent"] >= 0)
        entered = dict(zip(page["id"][kids].tolist(), page["entered"][kids].tolist()))
        # An elites-only store lacks evicted parents: their records have no parent fields.
        parents = {
            p.id: p for p in run.store.get(sorted(set(page["parent"][kids].tolist())), missing_ok=True)
        }
        for c in run.store.get(page["id"][kids].tolist()):
            p = parents.get(int(c.parent_ids[0]))
            child_fitness = fitness(c.fitness, c.valid)
            parent_fitness = fitness(p.fitness, p.valid) if p is not None else None
            text = c.kind == "text" and c.text is not None  # (an answer with no program has no text)
            yield {
                "child_id": c.id,
                "parent_id": int(c.parent_ids[0]),
                "island": c.island,
                "operator": c.operator,
                "model": c.model,
                "valid": c.valid,
                "error": c.error,
                "entered": entered[c.id],
                "parent_fitness": parent_fitness,
                "child_fitness": child_fitness,
                "improvement": None
                if None in (child_fitness, parent_fitness)
                else child_fitness - parent_fitness,
                "parent_metrics": p.metrics if p is not None else None,
                "child_metrics": c.metrics,
                "child_text": c.text if text else None,
                "diff": diff(p.text or "", c.text, f"#{p.id}", f"#{c.id}")
                if text and p is not None
                else None,
                "prompt": messages(c.prompt),
                "response": c.response,
            }
