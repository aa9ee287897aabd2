"""Batched MAP-Elites insertion: one jitted call per batch, all islands at once.

Semantics follow pyribs's ``add`` (see ``tests/qd/archive/test_parity_pyribs.py``):
every candidate is judged against the archive as it was *before* the batch; per
(island, cell) the best eligible candidate wins and ties go to the lowest batch
position; a candidate is eligible only if its fitness beats the cell's threshold.
Unlike pyribs, invalid candidates (``valid=False``, NaN/inf fitness or descriptor,
island out of range) are masked out instead of raising, and never block others.

Cost is O(B) per call apart from the cell lookup: no temporary as large as the
archive. The per-cell reductions run over "batch-local" segment ids: each
candidate learns the lowest batch position that shares its cell by a scatter-min
of negative codes into the donated ``genome_id`` buffer (every cell that receives
a code also receives a winner, so the codes are always overwritten).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive.state import ArchiveState, CellSpec, init

PAD_SIZES = (64, 256, 1024, 4096, 16384)

NOT_ADDED, IMPROVED, NEW_CELL = 0, 1, 2


class InsertResult(NamedTuple):
    """Per-candidate outcome of an insert.

    Attributes:
        status: i32[B]; 0 not added, 1 improved an existing elite, 2 filled a new
            cell (pyribs's codes).
        improvement: f32[B]; fitness minus the cell's previous threshold (minus 0
            for a new cell when ``threshold_min = -inf``), as pyribs's ``value``.
            0 for invalid candidates.
        cell: i32[B]; the cell index in ``[0, C)`` (meaningless when invalid).
        displaced_id: i32[B]; genome id of the elite this candidate replaced, -1
            if it did not win or the cell was empty.
        is_elite: bool[B]; the candidate is now the cell's elite (it won its cell).
            Several candidates of one cell can have status > 0 (judged against
            the archive before the batch) but only one becomes the elite.
    """

    status: jax.Array
    improvement: jax.Array
    cell: jax.Array
    displaced_id: jax.Array
    is_elite: jax.Array


def padded_size(n: int) -> int:
    """The fixed batch size a batch of ``n`` is padded to (limits recompiles)."""
    for size in PAD_SIZES:
        if n <= size:
            return size
    top = PAD_SIZES[-1]
    return -(-n // top) * top


def insert(
    spec: CellSpec,
    state: ArchiveState,
    island: jax.Array | int,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
    learning_rate: float = 1.0,
) -> tuple[ArchiveState, InsertResult]:
    """Inserts a batch of B candidates; ``state`` is donated (do not reuse it).

    Args:
        spec: the cell tessellation (GridSpec or CVTSpec).
        state: archive with I islands and C cells.
        island: i32[B] (or a scalar for all) target island of each candidate.
        descriptor: f32[B, D].
        fitness: f32[B].
        genome_id: i32[B], the candidates' store ids.
        valid: bool[B]; False for failed evaluations. Defaults to all True.
        learning_rate: CMA-MAE threshold learning rate; used only when the
            archive's ``threshold_min`` is finite (pyribs's rule).
    Returns:
        The new state (on device) and an InsertResult of host (numpy) arrays of
        length B. Inside other jitted code use :func:`insert_batch` instead.
    """
    batch = padded_batch(state, island, descriptor, fitness, genome_id, valid)
    new_state, packed = _insert_packed(spec, state, *batch, float(learning_rate))
    return new_state, unpack_result(packed, np.asarray(fitness).size)


def padded_batch(
    state: ArchiveState,
    island: jax.Array | int,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None,
) -> tuple[np.ndarray, ...]:
    """Host arrays (island, descriptor, fitness, genome_id, valid) padded to
    :func:`padded_size`; padding rows are invalid, so they never enter."""
    fitness = np.asarray(fitness, np.float32).reshape(-1)
    n = fitness.shape[0]
    size = padded_size(n)

    def padded(x, dtype, fill):
        x = np.asarray(x, dtype)
        if x.ndim == 0:
            return np.full(size, x, dtype)
        if size == n:
            return x
        out = np.full((size, *x.shape[1:]), fill, dtype)
        out[:n] = x
        return out

    dim = state.descriptor.shape[-1]
    return (
        padded(island, np.int32, 0),
        padded(np.asarray(descriptor, np.float32).reshape(n, dim), np.float32, 0.0),
        padded(fitness, np.float32, -np.inf),
        padded(genome_id, np.int32, -1),
        padded(True if valid is None else valid, np.bool_, False),
    )


def unpack_result(packed: jax.Array, n: int) -> InsertResult:
    """The InsertResult of the first ``n`` candidates from the packed i32[>=5, B] rows.

    One device->host transfer for all arrays (each transfer costs ~35 us on CPU);
    slicing on the host is free, while device slices would each dispatch.
    """
    packed = np.asarray(packed)[:, :n]
    return InsertResult(
        status=packed[0],
        improvement=packed[1].view(np.float32),
        cell=packed[2],
        displaced_id=packed[3],
        is_elite=packed[4].astype(bool),
    )


def insert_batch(
    spec: CellSpec,
    state: ArchiveState,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
    learning_rate: float = 1.0,
) -> tuple[ArchiveState, InsertResult]:
    """The traceable insert (no padding, no donation): use inside other jitted code."""
    num_islands, num_cells = state.fitness.shape
    size = fitness.shape[0]
    dim = state.descriptor.shape[-1]
    out_of_bounds = num_islands * num_cells

    cell = spec.index(descriptor)
    valid = (
        valid
        & (genome_id >= 0)  # a negative id would read as an empty cell
        & jnp.isfinite(fitness)
        & jnp.all(jnp.isfinite(descriptor), axis=1)
        & (island >= 0)
        & (island < num_islands)
    )
    flat = jnp.where(valid, island * num_cells + cell, 0)

    fitness_flat = state.fitness.reshape(-1)
    threshold_flat = state.threshold.reshape(-1)
    id_flat = state.genome_id.reshape(-1)
    descriptor_flat = state.descriptor.reshape(-1, dim)

    old_threshold = threshold_flat[flat]
    old_id = id_flat[flat]
    occupied = old_id >= 0
    eligible = valid & (fitness > old_threshold)

    # Batch-local segment id: lowest batch position sharing the (island, cell).
    position = jnp.arange(size, dtype=jnp.int32)
    code = position - (size + 2)  # always < -1, so never mistaken for an id
    # ``old_id > -2`` always holds: it makes the scatter depend on the gather of
    # ``old_id`` so XLA orders them and updates the donated buffer in place
    # (without it, XLA copies the whole genome_id array to keep the gather safe).
    scratch_id = id_flat.at[jnp.where(eligible & (old_id > -2), flat, out_of_bounds)].min(
        code, mode="drop"
    )
    segment = jnp.where(eligible, scratch_id[flat] + size + 2, size)
    num_segments = size + 1

    eligible_fitness = jnp.where(eligible, fitness, -jnp.inf)
    best = jax.ops.segment_max(eligible_fitness, segment, num_segments)
    is_best = eligible & (fitness == best[segment])
    winner_position = jax.ops.segment_min(
        jnp.where(is_best, position, size), segment, num_segments
    )
    winner = eligible & (position == winner_position[segment])

    # Count and sum of accepted fitness per cell, in one scatter.
    sums = jax.ops.segment_sum(
        jnp.stack([eligible.astype(jnp.float32), jnp.where(eligible, fitness, 0.0)], 1),
        segment,
        num_segments,
    )[segment]
    count, total = sums[:, 0], sums[:, 1]
    ratio = jnp.float32(1.0 - learning_rate) ** count
    soft_threshold = ratio * old_threshold + (1.0 - ratio) * (total / count)
    new_threshold = jnp.where(
        jnp.isfinite(state.threshold_min), soft_threshold, best[segment]
    )

    target = jnp.where(winner, flat, out_of_bounds)
    new_state = ArchiveState(
        fitness=fitness_flat.at[target].set(fitness, mode="drop").reshape(
            state.fitness.shape
        ),
        descriptor=descriptor_flat.at[target]
        .set(descriptor, mode="drop")
        .reshape(state.descriptor.shape),
        genome_id=scratch_id.at[target].set(genome_id, mode="drop").reshape(
            state.genome_id.shape
        ),
        threshold=threshold_flat.at[target].set(new_threshold, mode="drop").reshape(
            state.threshold.shape
        ),
        threshold_min=state.threshold_min,
    )

    status = jnp.where(eligible, jnp.where(occupied, 1, 2), 0).astype(jnp.int32)
    baseline = jnp.where(~occupied & jnp.isneginf(old_threshold), 0.0, old_threshold)
    improvement = jnp.where(valid, fitness - baseline, 0.0)
    displaced = jnp.where(winner & occupied, old_id, -1)
    return new_state, InsertResult(status, improvement, cell, displaced, winner)


def _insert_and_pack(*args) -> tuple[ArchiveState, jax.Array]:
    """insert_batch with its results packed into one i32[5, B] array."""
    state, r = insert_batch(*args)
    improvement = jax.lax.bitcast_convert_type(r.improvement, jnp.int32)
    return state, jnp.stack(
        [r.status, improvement, r.cell, r.displaced_id, r.is_elite.astype(jnp.int32)]
    )


insert_device = jax.jit(insert_batch, static_argnums=(7,), donate_argnums=(1,))
insert_device.__doc__ = """Jitted :func:`insert_batch` with ``state`` donated, for batches already on
the device (e.g. GPU): no padding, no host transfer; results stay on device.
Args as :func:`insert_batch` (``learning_rate`` positional, static)."""
_insert_packed = jax.jit(_insert_and_pack, static_argnums=(7,), donate_argnums=(1,))


def rebuild(
    spec: CellSpec,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
    threshold_min: float = -np.inf,
    learning_rate: float = 1.0,
) -> ArchiveState:
    """A fresh archive holding the elites of all given candidates, in one insert.

    Used when descriptors change (a refit projection) and to check a resumed run
    against its store. With ``threshold_min = -inf`` the result does not depend on
    how the candidates were batched originally; with soft thresholds it equals a
    single-batch history.

    Args: as :func:`insert`, arrays of length N.
    """
    state = init(spec, islands, spec.descriptor_dim, threshold_min)
    return insert(
        spec, state, island, descriptor, fitness, genome_id, valid, learning_rate
    )[0]
