"""Island migration: copy each island's top-k elites to other islands, jitted.

Migrants are inserted with the ordinary insert rule, so they land in the same
cell (same descriptor) and only replace a worse elite there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qd.archive.insert import InsertResult, insert_batch
from qd.archive.state import ArchiveState, CellSpec

TOPOLOGIES = ("ring", "random", "complete")


def _targets(key: jax.Array, num_islands: int, topology: str) -> jax.Array:
    """i32[I, T]: the islands each island sends to."""
    source = jnp.arange(num_islands)
    if topology == "ring":
        return ((source + 1) % num_islands)[:, None]
    if topology == "random":
        # A uniformly random *other* island for each source.
        shift = jax.random.randint(key, (num_islands,), 1, max(num_islands, 2))
        return ((source + shift) % num_islands)[:, None]
    if topology == "complete":
        shift = jnp.arange(1, num_islands)
        return (source[:, None] + shift[None, :]) % num_islands
    raise ValueError(
        f"islands.topology={topology!r} is not one of {TOPOLOGIES}"
    )


@functools.partial(jax.jit, static_argnums=(0, 3, 4), donate_argnums=(1,))
def migrate(
    spec: CellSpec, state: ArchiveState, key: jax.Array, topology: str, k: int
) -> tuple[ArchiveState, InsertResult]:
    """Copies the ``k`` best elites of every island to its targets.

    Returns the new state and the InsertResult of the I*T*k migrants (source
    island-major, then target, then rank).
    """
    num_islands = state.num_islands
    if topology not in TOPOLOGIES:
        raise ValueError(f"islands.topology={topology!r} is not one of {TOPOLOGIES}")
    if num_islands < 2:
        empty = jnp.zeros((0,), jnp.int32)
        return state, InsertResult(empty, empty.astype(jnp.float32), empty, empty)
    top_fitness, top_cell = jax.lax.top_k(state.fitness, k)  # [I, k]
    targets = _targets(key, num_islands, topology)  # [I, T]
    num_targets = targets.shape[1]
    source = jnp.arange(num_islands)[:, None]

    def per_target(x: jax.Array) -> jax.Array:
        return jnp.broadcast_to(x[:, None], (num_islands, num_targets, *x.shape[1:]))

    descriptor = state.descriptor[source, top_cell]  # [I, k, D]
    genome_id = state.genome_id[source, top_cell]
    island = jnp.broadcast_to(targets[:, :, None], (num_islands, num_targets, k))
    dim = state.descriptor.shape[-1]
    return insert_batch(
        spec,
        state,
        island.reshape(-1),
        per_target(descriptor).reshape(-1, dim),
        per_target(top_fitness).reshape(-1),
        per_target(genome_id).reshape(-1),
        (per_target(genome_id) >= 0).reshape(-1),
    )
