"""Insert and rebuild for any archive kind: cells (grid, CVT) or novelty.

The engine calls these and never asks which kind of archive it has; jitted code
(island migration and resets) uses the traceable :func:`insert_batch`.
"""

from __future__ import annotations

import jax
import numpy as np

from qd.archive.cells import InsertResult
from qd.archive.cells import insert as cell_insert
from qd.archive.cells import insert_batch as cell_insert_batch
from qd.archive.cells import rebuild as cell_rebuild
from qd.archive.novelty import NoveltySpec, novelty_insert, novelty_insert_batch, novelty_rebuild
from qd.archive.state import ArchiveState


def insert(
    spec,
    state: ArchiveState,
    island: jax.Array | int,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
    learning_rate: float = 1.0,
) -> tuple[ArchiveState, InsertResult]:
    """Inserts a batch: a NoveltySpec goes to :func:`qd.archive.novelty.novelty_insert`
    (``learning_rate`` unused), a cell spec (GridSpec, CVTSpec) to
    :func:`qd.archive.cells.insert`; args and results as there."""
    if isinstance(spec, NoveltySpec):
        return novelty_insert(spec, state, island, descriptor, fitness, genome_id, valid)[:2]
    return cell_insert(spec, state, island, descriptor, fitness, genome_id, valid, learning_rate)


def insert_batch(
    spec,
    state: ArchiveState,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
    learning_rate: float = 1.0,
) -> tuple[ArchiveState, InsertResult]:
    """The traceable :func:`insert` (no padding, no donation), for use inside other
    jitted code: dispatches on the spec's type at trace time."""
    if isinstance(spec, NoveltySpec):
        return novelty_insert_batch(spec, state, island, descriptor, fitness, genome_id, valid)[:2]
    return cell_insert_batch(spec, state, island, descriptor, fitness, genome_id, valid, learning_rate)


def rebuild(
    spec,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
    threshold_min: float = -np.inf,
    learning_rate: float = 1.0,
) -> ArchiveState:
    """A fresh archive holding all given candidates (see :func:`qd.archive.cells.rebuild`
    and :func:`qd.archive.novelty.novelty_rebuild`)."""
    if isinstance(spec, NoveltySpec):
        return novelty_rebuild(spec, islands, island, descriptor, fitness, genome_id, valid, threshold_min)
    return cell_rebuild(
        spec, islands, island, descriptor, fitness, genome_id, valid, threshold_min, learning_rate
    )
