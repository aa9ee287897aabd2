"""Island migration: copy each island's top-k elites to other islands, jitted.

Migrants are inserted with the ordinary insert rule, so they land in the same
cell (same descriptor) and only replace a worse elite there.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from qd.archive.cells import InsertResult, insert_batch
from qd.archive.state import ArchiveState, CellSpec
from qd.contract import ConfigError

TOPOLOGIES = ("ring", "random", "complete")


class Migrants(NamedTuple):
    """The M = I*T*k migrants (source island-major, then target, then rank).

    Attributes:
        source_island, source_cell, island (target): i32[M]; descriptor f32[M, D];
        fitness f32[M]; genome_id i32[M]; valid bool[M] (False for empty, ineligible
        or non-sending sources).
    """

    source_island: jax.Array
    source_cell: jax.Array
    island: jax.Array
    descriptor: jax.Array
    fitness: jax.Array
    genome_id: jax.Array
    valid: jax.Array


def check_topology(topology: str) -> None:
    """Raises a ConfigError naming ``topology`` unless it is one of :data:`TOPOLOGIES`."""
    if topology not in TOPOLOGIES:
        raise ConfigError("topology", f"unknown topology {topology!r}", f"use one of {list(TOPOLOGIES)}")


def island_targets(key: jax.Array, num_islands: int, topology: str) -> jax.Array:
    """i32[I, T]: the islands each island sends to."""
    source = jnp.arange(num_islands)
    if topology == "ring":
        return ((source + 1) % num_islands)[:, None]
    if topology == "random":
        # A uniformly random *other* island for each source.
        shift = jax.random.randint(key, (num_islands,), 1, max(num_islands, 2))
        return ((source + shift) % num_islands)[:, None]
    shift = jnp.arange(1, num_islands)  # complete: every other island
    return (source[:, None] + shift[None, :]) % num_islands


@functools.partial(jax.jit, static_argnums=(2, 3))
def select_migrants(
    state: ArchiveState,
    key: jax.Array,
    topology: str,
    k: int,
    eligible: jax.Array | None = None,
    sending: jax.Array | None = None,
) -> Migrants:
    """The top-``k`` elites of every island, addressed to its targets.

    Args:
        eligible: bool[I, C]; only these cells' elites may be sent (default all),
            so an island can keep received migrants from travelling on.
        sending: bool[I]; islands that send this time (default all). The others'
            migrants are in the result with ``valid`` False.
    """
    check_topology(topology)
    num_islands = state.num_islands
    fitness = state.fitness if eligible is None else jnp.where(eligible, state.fitness, -jnp.inf)
    _, top_cell = jax.lax.top_k(fitness, k)  # [I, k]
    targets = island_targets(key, num_islands, topology)  # [I, T]
    num_targets = targets.shape[1]
    source = jnp.arange(num_islands, dtype=jnp.int32)[:, None]

    def fan_out(x: jax.Array) -> jax.Array:
        x = jnp.broadcast_to(x[:, None], (num_islands, num_targets, *x.shape[1:]))
        return x.reshape(-1, *x.shape[3:])

    genome_id = state.genome_id[source, top_cell]
    valid = genome_id >= 0
    if eligible is not None:
        valid &= eligible[source, top_cell]
    if sending is not None:
        valid &= sending[:, None]
    return Migrants(
        source_island=fan_out(jnp.broadcast_to(source, top_cell.shape)),
        source_cell=fan_out(top_cell.astype(jnp.int32)),
        island=jnp.broadcast_to(targets[:, :, None], (num_islands, num_targets, k))
        .reshape(-1)
        .astype(jnp.int32),
        descriptor=fan_out(state.descriptor[source, top_cell]),
        fitness=fan_out(state.fitness[source, top_cell]),
        genome_id=fan_out(genome_id),
        valid=fan_out(valid),
    )


@functools.partial(jax.jit, static_argnums=(3, 4), donate_argnums=(1,))
def migrate(
    spec: CellSpec, state: ArchiveState, key: jax.Array, topology: str, k: int
) -> tuple[ArchiveState, InsertResult]:
    """Copies the ``k`` best elites of every island to its targets.

    Returns the new state and the InsertResult of the migrants, ordered as in
    :class:`Migrants`. With a single island nothing moves.
    """
    check_topology(topology)
    if state.num_islands < 2:
        empty = jnp.zeros((0,), jnp.int32)
        return state, InsertResult(empty, empty.astype(jnp.float32), empty, empty, empty.astype(bool))
    m = select_migrants(state, key, topology, k)
    return insert_batch(spec, state, m.island, m.descriptor, m.fitness, m.genome_id, m.valid)
