"""Unstructured (novelty) archive: fixed capacity, k-nearest-neighbour novelty.

A candidate enters if its novelty — mean distance to its k nearest archived
descriptors — exceeds ``threshold``. Once full, the oldest entry is overwritten
(a ring buffer), so memory never grows. Everything is jitted; distances are
computed with direct differences, chunked over the batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class NoveltyState(NamedTuple):
    """Attributes:
    descriptor: f32[N, D]; genome_id: i32[N] (-1 empty); fitness: f32[N];
    count: i32[] total insertions so far (slot = count mod N).
    """

    descriptor: jax.Array
    genome_id: jax.Array
    fitness: jax.Array
    count: jax.Array


def novelty_init(capacity: int, descriptor_dim: int) -> NoveltyState:
    return NoveltyState(
        descriptor=jnp.zeros((capacity, descriptor_dim), jnp.float32),
        genome_id=jnp.full((capacity,), -1, jnp.int32),
        fitness=jnp.full((capacity,), -jnp.inf, jnp.float32),
        count=jnp.zeros((), jnp.int32),
    )


@functools.partial(jax.jit, static_argnums=(2,))
def novelty(state: NoveltyState, descriptor: jax.Array, k: int) -> jax.Array:
    """f32[B]: mean distance of each descriptor f32[B, D] to its k nearest entries.

    With fewer than k entries, the mean is over those present; an empty archive
    gives +inf (everything is novel).
    """
    filled = state.genome_id >= 0
    diff = descriptor[:, None, :] - state.descriptor[None, :, :]
    dist = jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    dist = jnp.where(filled[None, :], dist, jnp.inf)
    kk = min(k, state.genome_id.shape[0])
    nearest = -jax.lax.top_k(-dist, kk)[0]  # [B, kk], ascending
    present = jnp.isfinite(nearest)
    num = jnp.sum(present, axis=1)
    total = jnp.sum(jnp.where(present, nearest, 0.0), axis=1)
    return jnp.where(num > 0, total / jnp.maximum(num, 1), jnp.inf)


@functools.partial(jax.jit, static_argnums=(5,), donate_argnums=(0,))
def novelty_add(
    state: NoveltyState,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    threshold: float | jax.Array,
    k: int,
) -> tuple[NoveltyState, jax.Array, jax.Array]:
    """Adds the candidates whose novelty (against the archive before the batch)
    exceeds ``threshold``.

    Returns:
        new state, added bool[B], novelty f32[B].
    """
    score = novelty(state, descriptor, k)
    added = (score > threshold) & jnp.isfinite(fitness)
    rank = jnp.cumsum(added.astype(jnp.int32)) - 1
    capacity = state.genome_id.shape[0]
    num_added = jnp.sum(added, dtype=jnp.int32)
    # Only the last `capacity` additions get a slot, so no slot is written twice.
    stored = added & (num_added - 1 - rank < capacity)
    slot = jnp.where(stored, (state.count + rank) % capacity, capacity)
    new_state = NoveltyState(
        descriptor=state.descriptor.at[slot].set(descriptor, mode="drop"),
        genome_id=state.genome_id.at[slot].set(genome_id, mode="drop"),
        fitness=state.fitness.at[slot].set(fitness, mode="drop"),
        count=state.count + num_added,
    )
    return new_state, added, score
