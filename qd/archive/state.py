"""The archive state: a pytree of per-(island, cell) arrays, islands on the leading axis."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

from qd.contract import ConfigError

EMPTY_ID = -1


class CellSpec(Protocol):
    """What the archive needs from a tessellation (GridSpec, CVTSpec)."""

    @property
    def num_cells(self) -> int: ...

    @property
    def descriptor_dim(self) -> int: ...

    def index(self, descriptor: jax.Array) -> jax.Array:
        """f32[B, D] -> i32[B] cell index."""
        ...


class ArchiveState(NamedTuple):
    """Elites of I islands over C cells with D-dimensional descriptors.

    Attributes:
        fitness: f32[I, C]; -inf where the cell is empty.
        descriptor: f32[I, C, D]; the elite's descriptor (0 where empty).
        genome_id: i32[I, C]; the elite's store id, -1 where empty.
        threshold: f32[I, C]; acceptance threshold (CMA-MAE). With the default
            ``threshold_min = -inf`` it equals ``fitness``.
        threshold_min: f32[]; threshold of an empty cell. When finite, thresholds
            follow pyribs's CMA-MAE batch rule with the insert's learning rate.
    """

    fitness: jax.Array
    descriptor: jax.Array
    genome_id: jax.Array
    threshold: jax.Array
    threshold_min: jax.Array

    @property
    def num_islands(self) -> int:
        return self.fitness.shape[0]

    @property
    def num_cells(self) -> int:
        return self.fitness.shape[1]


def init(
    spec: CellSpec,
    islands: int = 1,
    descriptor_dim: int | None = None,
    threshold_min: float = -jnp.inf,
) -> ArchiveState:
    """An empty archive for ``islands`` islands over the cells of ``spec``."""
    dim = spec.descriptor_dim if descriptor_dim is None else descriptor_dim
    if dim != spec.descriptor_dim:
        raise ConfigError(
            "descriptor_dim",
            f"is {dim} but the spec has {spec.descriptor_dim} dimensions",
            "pass the spec's dimension, or none",
        )
    if islands < 1:
        raise ValueError(f"islands must be >= 1, got {islands}")
    shape = (islands, spec.num_cells)
    return ArchiveState(
        fitness=jnp.full(shape, -jnp.inf, jnp.float32),
        descriptor=jnp.zeros((*shape, dim), jnp.float32),
        genome_id=jnp.full(shape, EMPTY_ID, jnp.int32),
        threshold=jnp.full(shape, threshold_min, jnp.float32),
        threshold_min=jnp.asarray(threshold_min, jnp.float32),
    )


@jax.jit
def reset(state: ArchiveState, island_mask: jax.Array) -> ArchiveState:
    """Empties the islands where ``island_mask`` (bool[I]) is True (FunSearch-style)."""
    keep = ~island_mask[:, None]
    return ArchiveState(
        fitness=jnp.where(keep, state.fitness, -jnp.inf),
        descriptor=jnp.where(keep[..., None], state.descriptor, 0.0),
        genome_id=jnp.where(keep, state.genome_id, EMPTY_ID),
        threshold=jnp.where(keep, state.threshold, state.threshold_min),
        threshold_min=state.threshold_min,
    )
