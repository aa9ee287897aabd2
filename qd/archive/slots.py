"""What readers see of any archive: its elites as slots, and the best elite of each cell.

An archive of one elite per cell (grid, CVT, novelty) is its own view: a slot is a cell.
A Pareto archive (:mod:`qd.archive.pareto`) keeps a front of up to K elites in each of
its C cells; its slots are the C*K places of those fronts. Readers that draw or list
elites (parent and inspiration selection, the elite table, migration, resets) take
:func:`slots_of`; readers that count cells (statistics: coverage is cells with at least one
member; the report; an island's best) take :func:`best_per_cell`. Both are plain
:class:`ArchiveState` values, so those readers never ask which kind they read.

A front member's scalar is its first objective, maximised: a task lists first the
objective its fitness follows (function_fit: held-out error, its fitness minus the
error), so the scalar is the candidate's fitness there. The QD score of a Pareto run is
the sum, over cells, of the scalar of each cell's best member.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from qd.archive.pareto import ParetoState
from qd.archive.state import ArchiveState


class Slots(NamedTuple):
    """An archive's elites, one per slot.

    Attributes:
        elites: an ArchiveState over I islands x S slots (S = C for one elite per cell,
            C*K for fronts); ``fitness`` is each slot's scalar (-inf where empty).
        cell: i32[S], the cell of each slot.
        values: what the archive's insert takes for each slot's elite: ``fitness`` [I, S],
            or a front's objectives f32[I, S, M].
    """

    elites: ArchiveState
    cell: jax.Array
    values: jax.Array


def slots_of(state: ArchiveState | ParetoState) -> Slots:
    """``state``'s elites as slots (traceable)."""
    if not isinstance(state, ParetoState):
        return Slots(state, jnp.arange(state.num_cells, dtype=jnp.int32), state.fitness)
    return _front_slots(state)


@jax.jit
def _front_slots(state: ParetoState) -> Slots:
    num_islands, num_cells, k, m = state.objectives.shape
    genome_id = state.genome_id.reshape(num_islands, num_cells * k)
    values = state.objectives.reshape(num_islands, num_cells * k, m)
    fitness = jnp.where(genome_id >= 0, values[..., 0], -jnp.inf)
    descriptor = state.descriptor.reshape(num_islands, num_cells * k, -1)
    cell = jnp.repeat(jnp.arange(num_cells, dtype=jnp.int32), k)
    return Slots(_elites(fitness, descriptor, genome_id), cell, values)


def best_per_cell(state: ArchiveState | ParetoState) -> ArchiveState:
    """``state`` as one elite per cell: a front's member with the largest scalar (the
    smallest id among equals), -1 where the front is empty (traceable)."""
    return state if not isinstance(state, ParetoState) else _front_best(state)


@jax.jit
def _front_best(state: ParetoState) -> ArchiveState:
    member = state.genome_id >= 0
    first = jnp.where(member, state.objectives[..., 0], -jnp.inf)
    best = jnp.argmax(first, axis=2)[..., None]  # slots fill by ascending id: ties keep the smaller
    genome_id = jnp.where(jnp.any(member, axis=2), jnp.take_along_axis(state.genome_id, best, 2)[..., 0], -1)
    fitness = jnp.take_along_axis(first, best, 2)[..., 0]
    descriptor = jnp.take_along_axis(state.descriptor, best[..., None], 2)[:, :, 0]
    return _elites(fitness, descriptor, genome_id)


def _elites(fitness: jax.Array, descriptor: jax.Array, genome_id: jax.Array) -> ArchiveState:
    """An ArchiveState of hard thresholds (a front has none) over these elites."""
    return ArchiveState(fitness, descriptor, genome_id, fitness, jnp.asarray(-jnp.inf, jnp.float32))
