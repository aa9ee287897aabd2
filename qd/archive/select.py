"""Reading elites out of the archive: uniform sampling (jitted) and host-side listing."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive.state import ArchiveState


class Elites(NamedTuple):
    """Elites of one island, as host arrays of length K (filled cells only).

    Attributes:
        cell: i64[K]; fitness: f32[K]; descriptor: f32[K, D]; genome_id: i64[K];
        threshold: f32[K].
    """

    cell: np.ndarray
    fitness: np.ndarray
    descriptor: np.ndarray
    genome_id: np.ndarray
    threshold: np.ndarray


def _check_island(state: ArchiveState, island: object) -> None:
    if isinstance(island, (int, np.integer)) and not 0 <= island < state.num_islands:
        raise ValueError(f"island {island} is out of range for {state.num_islands} islands")


def sample(
    state: ArchiveState, key: jax.Array, island: jax.Array | int, n: int
) -> tuple[jax.Array, jax.Array]:
    """Samples ``n`` elites of ``island`` uniformly, with replacement.

    O(C + n log C): a cumulative count of filled cells and a binary search, so no
    [n, C] temporary as a categorical draw would need.

    Returns:
        genome_id i32[n] (-1 everywhere if the island is empty) and cell i32[n].
    """
    _check_island(state, island)
    return _sample(state, key, island, n)


@functools.partial(jax.jit, static_argnums=(3,))
def _sample(
    state: ArchiveState, key: jax.Array, island: jax.Array | int, n: int
) -> tuple[jax.Array, jax.Array]:
    filled = state.genome_id[island] >= 0
    counts = jnp.cumsum(filled.astype(jnp.int32))
    total = counts[-1]
    draw = jax.random.randint(key, (n,), 0, jnp.maximum(total, 1))
    # The unrolled binary search is ~8x faster on XLA:CPU than the default while-loop.
    cell = jnp.searchsorted(counts, draw, side="right", method="scan_unrolled").astype(jnp.int32)
    cell = jnp.minimum(cell, state.num_cells - 1)
    ids = jnp.where(total > 0, state.genome_id[island, cell], -1)
    return ids, cell


def elites(state: ArchiveState, island: int | None = None) -> Elites:
    """The filled cells of ``island`` (or of all islands stacked, cell = i*C + c)."""
    if island is not None:
        _check_island(state, island)
    fitness = np.asarray(state.fitness)
    ids = np.asarray(state.genome_id)
    descriptor = np.asarray(state.descriptor)
    threshold = np.asarray(state.threshold)
    if island is not None:
        fitness, ids, descriptor, threshold = (
            x[island : island + 1] for x in (fitness, ids, descriptor, threshold)
        )
    flat_ids = ids.reshape(-1)
    cell = np.flatnonzero(flat_ids >= 0)
    return Elites(
        cell=cell,
        fitness=fitness.reshape(-1)[cell],
        descriptor=descriptor.reshape(-1, descriptor.shape[-1])[cell],
        genome_id=flat_ids[cell],
        threshold=threshold.reshape(-1)[cell],
    )
