"""``elites``: the archive, one row per filled cell, best first.

The archive is the run's answer: the best genome found in each niche. A row is the
elite as the store holds it (text or vector, fitness, descriptor, metrics, how it
was made) with where it sits now and its lineage, so a dataset of elites can be
studied or reused without the run directory. Order: archive fitness, best first,
then island and cell.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from qd.export.rows import candidates, fitness
from qd.rundir import RunDir

COLUMNS = {
    "island": "int64",  # where the elite sits now (a migrant sits on another island than it was made on)
    "cell": "int64",
    "id": "int64",  # store id
    "fitness": "float64",
    "descriptor": "list<float64>",
    "genome": "string",  # the genome kind: program, agent, prompt, ... or vector
    "text": "string",  # null for vector genomes
    "vector": "list<float64>",  # null for text genomes
    "metrics": "json",
    "operator": "string",
    "model": "string",
    "parent_ids": "list<int64>",
    "born_island": "int64",  # the island it was made on
    "lineage": "list<int64>",  # its first parents' chain, oldest first (the last is its first parent)
}
OPTIONS: dict[str, Any] = {"min_fitness": None}


def rows(run: RunDir, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from qd.history import first_parents

    snap = run.snapshot()
    isl, cell = snap.filled()
    keep = (
        np.ones(len(isl), bool)
        if options["min_fitness"] is None
        else snap.fitness[isl, cell] >= float(options["min_fitness"])
    )
    isl, cell = isl[keep], cell[keep]
    order = np.lexsort((cell, isl, -snap.fitness[isl, cell]))  # the last key sorts first
    isl, cell = isl[order].tolist(), cell[order].tolist()
    parents = first_parents(run)
    for i, k, c in zip(isl, cell, candidates(run, snap.genome_id[isl, cell].tolist())):
        yield {
            "island": i,
            "cell": k,
            "id": c.id,
            "fitness": fitness(c.fitness, c.valid),
            "descriptor": None if c.descriptor is None else c.descriptor.tolist(),
            "genome": c.genome,
            "text": c.text if c.kind == "text" else None,
            "vector": c.vector.tolist() if c.kind == "vector" else None,
            "metrics": c.metrics,
            "operator": c.operator,
            "model": c.model,
            "parent_ids": list(c.parent_ids),
            "born_island": c.island,
            "lineage": _lineage(parents, c.id),
        }


def _lineage(parents: Any, candidate_id: int) -> list[int]:
    """Its first parents' chain, oldest first: an ancestor the store does not hold (an
    elites-only store) ends the chain, and is its first id."""
    from qd.history import ancestors

    chain, missing = ancestors(parents, candidate_id)
    return ([missing] if missing >= 0 else []) + chain[:0:-1]
