"""Island dynamics: one-hop migration and FunSearch-style resets of stagnant islands.

Islands keep several lineages apart. Two rules keep them apart:

* a *migrant* (an elite that arrived by migration or reseeding) is never sent
  again, so an elite travels one hop: it cannot bounce back to its home island or
  sweep round the ring and make every island alike;
* when the best fitness over all islands has not improved for ``patience`` offered
  candidates, the weaker half of the islands is emptied and each is reseeded with
  the best elite of a random survivor (FunSearch), so compute moves from islands
  stuck on a poor lineage to copies of the strong ones.

:class:`IslandState` is the bookkeeping kept next to the archive's
:class:`~qd.archive.ArchiveState` (checkpoint both). Every function is pure and
jitted over the island axis and works for any archive kind (grid, CVT, novelty,
Pareto): inserts and resets go through :mod:`qd.archive.kinds`, and elites are read
through :mod:`qd.archive.slots` (a front's members are its cell's slots; an island's
best is its best member's scalar). A migrant marks its whole cell, as it marks a
grid's: no member of a front that a migrant entered is sent on.

History in the store: record migrations and reseeds with ``Store.add_migrations``
and resets with ``Store.add_reset`` (before their reseeds); :func:`replay` applies
``Store.placements`` to a checkpointed or empty state.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive import kinds
from qd.archive.cells import InsertResult
from qd.archive.migration import Migrants, select_migrants
from qd.archive.slots import best_per_cell, slots_of
from qd.archive.state import ArchiveState


class IslandState(NamedTuple):
    """Per-island bookkeeping for I islands over C cells.

    Attributes:
        migrant: bool[I, C]; the cell's elite arrived by migration or reseeding,
            so it is never sent again.
        best: f32[I]; best fitness on each island since its last reset (-inf: none).
        stale: i32[]; candidates offered since the best fitness over all islands
            last improved.
        since_migration: i32[I]; candidates offered to each island since it last
            sent migrants.
    """

    migrant: jax.Array
    best: jax.Array
    stale: jax.Array
    since_migration: jax.Array


def init(num_islands: int, num_cells: int) -> IslandState:
    """Bookkeeping for an empty archive of ``num_islands`` x ``num_cells``."""
    return IslandState(
        migrant=jnp.zeros((num_islands, num_cells), bool),
        best=jnp.full((num_islands,), -jnp.inf, jnp.float32),
        stale=jnp.zeros((), jnp.int32),
        since_migration=jnp.zeros((num_islands,), jnp.int32),
    )


def _mark(
    migrant: jax.Array, island: jax.Array, cell: jax.Array, won: jax.Array, value: jax.Array | bool
) -> jax.Array:
    """``migrant`` bool[I, C] with ``value`` set at (island[b], cell[b]) where won[b]."""
    num_islands, num_cells = migrant.shape
    flat = jnp.where(won, island * num_cells + cell, num_islands * num_cells)
    return migrant.reshape(-1).at[flat].set(value, mode="drop").reshape(migrant.shape)


def _island_best(state: ArchiveState) -> jax.Array:
    """f32[I]: the best elite's fitness per island (-inf when empty)."""
    return jnp.max(best_per_cell(state).fitness, axis=1)


@jax.jit
def record(
    istate: IslandState,
    state: ArchiveState,
    island: jax.Array,
    result: InsertResult,
    offered: jax.Array,
    migrated: jax.Array | None = None,
) -> IslandState:
    """Bookkeeping after an insert of B offers into ``state`` (the new archive).

    Args:
        island: i32[B], the offers' islands.
        result: the insert's InsertResult (length B).
        offered: bool[B]; False for padding rows, which neither count nor mark
            cells. A failed evaluation is an offer: pass True for it. Pad B to a
            few sizes (``qd.archive.padded_size``) to limit recompiles.
        migrated: bool[B]; offers that are copies of elites (migrations, reseeds,
            as in ``Store.placements``): they mark the cells they win as migrants
            and are not counted as candidates. Default: none.
    """
    num_islands = istate.best.shape[0]
    migrated = jnp.zeros_like(offered) if migrated is None else migrated
    fresh = offered & ~migrated
    migrant = _mark(istate.migrant, island, result.cell, offered & result.is_elite, migrated)
    in_range = (island >= 0) & (island < num_islands)
    offers = (
        jnp.zeros(num_islands, jnp.int32)
        .at[jnp.where(in_range, island, num_islands)]
        .add(fresh.astype(jnp.int32), mode="drop")
    )
    best = jnp.maximum(istate.best, _island_best(state))
    improved = jnp.max(best) > jnp.max(istate.best)
    stale = jnp.where(improved, 0, istate.stale + jnp.sum(fresh, dtype=jnp.int32))
    return IslandState(migrant, best, stale, istate.since_migration + offers)


@functools.partial(jax.jit, static_argnames=("topology", "k", "every"), donate_argnums=(1,))
def migrate(
    spec,
    state: ArchiveState,
    istate: IslandState,
    key: jax.Array,
    topology: str,
    k: int,
    every: int,
) -> tuple[ArchiveState, IslandState, Migrants, InsertResult]:
    """Islands offered ``every`` candidates since they last sent send copies of their
    top-``k`` non-migrant elites to their targets (``qd.archive.TOPOLOGIES``).

    Migrants go through the ordinary insert (same cell, replace only a worse elite)
    and the cells they win become migrants; senders' ``since_migration`` restarts.
    ``state`` is donated. With one island nothing moves.

    Returns:
        The new state and bookkeeping; the M = I*T*k Migrants (``valid`` False for
        anything not sent: record the valid ones' ``genome_id`` and ``island`` in
        the store); and their InsertResult (where ``is_elite``, the elite of
        ``(source_island, source_cell)`` now also sits in ``(island, cell)``).
    """
    view = slots_of(state)
    sending = (istate.since_migration >= every) & (view.elites.num_islands >= 2)
    eligible = (view.elites.genome_id >= 0) & ~istate.migrant[:, view.cell]
    m = select_migrants(view.elites, key, topology, k, eligible, sending)
    values = view.values[m.source_island, m.source_cell]
    state, result = kinds.insert_batch(spec, state, m.island, m.descriptor, values, m.genome_id, m.valid)
    m = m._replace(source_cell=view.cell[m.source_cell])
    return (
        state,
        IslandState(
            migrant=_mark(istate.migrant, m.island, result.cell, m.valid & result.is_elite, True),
            best=jnp.maximum(istate.best, _island_best(state)),
            stale=istate.stale,
            since_migration=jnp.where(sending, 0, istate.since_migration),
        ),
        m,
        result,
    )


@functools.partial(jax.jit, donate_argnums=(1,))
def reset_stagnant(
    spec,
    state: ArchiveState,
    istate: IslandState,
    key: jax.Array,
    patience: int | jax.Array,
) -> tuple[ArchiveState, IslandState, jax.Array, Migrants, InsertResult]:
    """Empties the weakest floor(I/2) islands once ``stale >= patience`` (I >= 2).

    Islands are ranked by ``best``; ties count the lower island index as weaker.
    Each emptied island is reseeded with a copy of the best elite of a uniformly
    random surviving island (inserted as usual, so in its own cell, and marked
    migrant); its ``best`` becomes that elite's fitness and ``stale`` restarts.
    Survivors are untouched. Otherwise nothing changes. ``state`` is donated.

    Returns:
        The new state and bookkeeping; reset bool[I]; the I reseeds as Migrants,
        one per target island (``valid`` only for reset islands whose source had an
        elite); and their InsertResult. Record ``Store.add_reset(after_id,
        flatnonzero(reset))`` and then the valid reseeds with ``add_migrations``.
    """
    view = slots_of(state)
    elites = view.elites
    num_islands = elites.num_islands
    num_weak = num_islands // 2
    trigger = (istate.stale >= patience) & (num_islands >= 2)
    ranked = jnp.argsort(istate.best, stable=True)  # weakest first
    rank = jnp.zeros(num_islands, jnp.int32).at[ranked].set(jnp.arange(num_islands, dtype=jnp.int32))
    reset = trigger & (rank < num_weak)
    pick = jax.random.randint(key, (num_islands,), 0, num_islands - num_weak)
    source = ranked[num_weak + pick].astype(jnp.int32)
    slot = jnp.argmax(elites.fitness[source], axis=1).astype(jnp.int32)
    genome_id = elites.genome_id[source, slot]
    m = Migrants(
        source_island=source,
        source_cell=view.cell[slot],
        island=jnp.arange(num_islands, dtype=jnp.int32),
        descriptor=elites.descriptor[source, slot],
        fitness=elites.fitness[source, slot],
        genome_id=genome_id,
        valid=reset & (genome_id >= 0),
    )

    def reseed(state: ArchiveState) -> tuple[ArchiveState, InsertResult]:
        return kinds.insert_batch(
            spec,
            kinds.reset(spec, state, reset),
            m.island,
            m.descriptor,
            view.values[source, slot],
            m.genome_id,
            m.valid,
        )

    def unchanged(state: ArchiveState) -> tuple[ArchiveState, InsertResult]:
        # The result of inserting nothing, without touching the archive.
        zero = jnp.zeros(num_islands, jnp.int32)
        return state, InsertResult(zero, zero.astype(jnp.float32), zero, zero - 1, zero.astype(bool))

    state, result = jax.lax.cond(trigger, reseed, unchanged, state)
    migrant = jnp.where(reset[:, None], False, istate.migrant)
    return (
        state,
        IslandState(
            migrant=_mark(migrant, m.island, result.cell, m.valid & result.is_elite, True),
            best=jnp.where(reset, _island_best(state), istate.best),
            stale=jnp.where(trigger, 0, istate.stale),
            since_migration=istate.since_migration,
        ),
        reset,
        m,
        result,
    )


def replay(
    spec,
    state: ArchiveState,
    istate: IslandState,
    offers: dict[str, np.ndarray],
) -> tuple[ArchiveState, IslandState, InsertResult]:
    """Applies ``Store.placements(after_id)`` to the archive checkpointed at ``after_id``:
    first empties the islands reset in that range, then inserts the remaining offers
    in one batch. From ``qd.archive.init`` and :func:`init` with ``after_id = -1`` it
    rebuilds the archive and the migrant marks from the store alone (the counters
    ``stale`` and ``since_migration`` count the replayed candidates as new offers).
    ``state`` is donated.
    """
    mask = np.zeros(istate.best.shape[0], bool)
    mask[offers["reset"]] = True
    state = kinds.reset(spec, state, mask)
    istate = istate._replace(
        migrant=jnp.where(mask[:, None], False, istate.migrant),
        best=jnp.where(mask, -jnp.inf, istate.best),
    )
    state, result = kinds.insert(
        spec,
        state,
        offers["island"],
        offers["descriptor"],
        offers["fitness"],
        offers["id"],
        offers["valid"],
    )
    istate = record(
        istate, state, offers["island"], result, np.ones(len(offers["id"]), bool), offers["migrated"]
    )
    return state, istate, result
