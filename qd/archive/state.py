"""The archive state: a pytree of per-(island, cell) arrays, islands on the leading axis."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

from qd.contract import ConfigError

EMPTY_ID = -1


def check_thresholds(learning_rate: float, threshold_min: float) -> tuple[float, float]:
    """A spec's CMA-MAE settings as floats, validated once when the spec is made.

    Every spec carries them (so inserts, rebuilds, migration and resume read one value,
    the spec's): ``learning_rate`` in [0, 1] (1: MAP-Elites) and ``threshold_min``, the
    threshold of an empty cell (-inf: hard thresholds, the learning rate unused).
    """
    learning_rate, threshold_min = float(learning_rate), float(threshold_min)
    if not 0.0 <= learning_rate <= 1.0:
        raise ConfigError("learning_rate", f"must be in [0, 1], got {learning_rate}")
    if math.isnan(threshold_min) or threshold_min == math.inf:
        raise ConfigError("threshold_min", f"must be a number below +inf, got {threshold_min}")
    return learning_rate, threshold_min


CMA_MAE = ("learning_rate", "threshold_min")  # the settings every spec carries besides its cells


def thresholds(spec: CellSpec) -> dict[str, float]:
    """``spec``'s CMA-MAE settings by name: what a run directory saves beside its cells, so
    a reader rebuilds the same spec (``GridSpec(..., **thresholds(spec))``)."""
    return {name: float(getattr(spec, name)) for name in CMA_MAE}


def with_thresholds(spec: CellSpec, source: CellSpec) -> CellSpec:
    """``spec`` with ``source``'s CMA-MAE settings: for cells a run adopts mid-run (a
    CycleQD phase's grid, a describer's fitted CVT), which keep the run's settings. A
    Pareto ``source`` (no thresholds: fronts) puts its fronts on the adopted cells; a
    Pareto ``spec`` has no thresholds to take and stays as it is."""
    if spec.kind == "pareto":
        return spec
    if source.kind == "pareto":
        return dataclasses.replace(source, cells=spec)
    return dataclasses.replace(spec, learning_rate=source.learning_rate, threshold_min=source.threshold_min)


class CellSpec(Protocol):
    """What the archive needs from a spec (GridSpec, CVTSpec, NoveltySpec)."""

    @property
    def num_cells(self) -> int: ...

    @property
    def learning_rate(self) -> float:
        """CMA-MAE threshold learning rate (1: MAP-Elites); see :func:`check_thresholds`."""
        ...

    @property
    def threshold_min(self) -> float:
        """Threshold of an empty cell (-inf: hard thresholds)."""
        ...

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
        threshold_min: f32[]; threshold of an empty cell, the spec's ``threshold_min``
            (kept in the state so jitted resets and checkpoints carry it). When finite,
            thresholds follow pyribs's CMA-MAE batch rule with the spec's learning rate.
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


def init(spec: CellSpec, islands: int = 1, descriptor_dim: int | None = None) -> ArchiveState:
    """An empty archive for ``islands`` islands over the cells of ``spec``, its empty
    cells at the spec's ``threshold_min``."""
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
    threshold_min = spec.threshold_min
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
