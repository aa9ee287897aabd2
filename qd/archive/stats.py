"""Archive statistics, one convention (pyribs's), per island and over all islands.

A Pareto archive counts as its best member per cell (:func:`qd.archive.slots.best_per_cell`):
coverage is the share of cells with at least one member, the QD score sums each cell's best.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from qd.archive.pareto import ParetoState
from qd.archive.slots import best_per_cell
from qd.archive.state import ArchiveState


class ArchiveStats(NamedTuple):
    """Each field is f32[I + 1]: one entry per island, then the global value.

    The global entry treats the islands as one archive of I*C cells.

    Attributes:
        num_elites: filled cells.
        coverage: filled cells / cells (a fraction in [0, 1], not a percentage).
        qd_score: sum over filled cells of (fitness - offset) — pyribs's convention
            (QDax adds the offset instead).
        norm_qd_score: qd_score / cells.
        max_fitness: best elite fitness (-inf when empty).
        mean_fitness: mean elite fitness (NaN when empty).
    """

    num_elites: jax.Array
    coverage: jax.Array
    qd_score: jax.Array
    norm_qd_score: jax.Array
    max_fitness: jax.Array
    mean_fitness: jax.Array


@jax.jit
def stats(state: ArchiveState | ParetoState, offset: float | jax.Array = 0.0) -> ArchiveStats:
    """Statistics of ``state``; ``offset`` is subtracted from each elite's fitness."""
    state = best_per_cell(state)
    filled = state.genome_id >= 0
    cells = jnp.float32(state.num_cells)
    fitness_sum = jnp.sum(jnp.where(filled, state.fitness, 0.0), axis=1)
    num = jnp.sum(filled, axis=1).astype(jnp.float32)
    best = jnp.max(state.fitness, axis=1)

    def with_global(per_island: jax.Array, reduce) -> jax.Array:
        return jnp.concatenate([per_island, reduce(per_island)[None]])

    num = with_global(num, jnp.sum)
    fitness_sum = with_global(fitness_sum, jnp.sum)
    best = with_global(best, jnp.max)
    cells = jnp.concatenate([jnp.full((state.num_islands,), cells), cells[None] * state.num_islands])
    qd_score = fitness_sum - num * offset
    return ArchiveStats(
        num_elites=num,
        coverage=num / cells,
        qd_score=qd_score,
        norm_qd_score=qd_score / cells,
        max_fitness=best,
        mean_fitness=fitness_sum / num,
    )


@jax.jit
def union_stats(state: ArchiveState | ParetoState, offset: float | jax.Array = 0.0) -> ArchiveStats:
    """Statistics of the islands merged cell by cell (each cell keeps its best elite
    over all islands): what the whole run found. Each field is f32[1].

    The global entry of :func:`stats` counts a cell once per island that holds it,
    so it grows with copies (migrants) and with the island count; this does not.
    Meaningful for cell archives (grid, CVT, Pareto), where a cell index is the same
    niche on every island.
    """
    state = best_per_cell(state)
    filled = state.genome_id >= 0
    best = jnp.max(jnp.where(filled, state.fitness, -jnp.inf), axis=0)
    merged = ArchiveState(
        fitness=best[None],
        descriptor=state.descriptor[:1],
        genome_id=jnp.where(jnp.any(filled, axis=0), 0, -1)[None].astype(state.genome_id.dtype),
        threshold=best[None],
        threshold_min=state.threshold_min,
    )
    return jax.tree_util.tree_map(lambda x: x[-1:], stats(merged, offset))
