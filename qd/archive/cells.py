"""Batched MAP-Elites insertion: one jitted call per batch, all islands at once.

Semantics follow pyribs's ``add`` (see ``tests/qd/archive/test_parity_pyribs.py``):
every candidate is judged against the archive as it was *before* the batch; per
(island, cell) the best eligible candidate wins and ties go to the lowest batch
position; a candidate is eligible only if its fitness beats the cell's threshold.
Unlike pyribs, invalid candidates (``valid=False``, NaN/inf fitness or descriptor,
island out of range) are masked out instead of raising, and never block others.

Cost is O(B) per call apart from the cell lookup: no temporary as large as the
archive. The donated archive buffers double as per-cell scratch, updated in place:
a scatter-max of the eligible fitness into the thresholds gives each cell's best
(every eligible fitness beats its threshold), a scatter-min of negative position
codes into the genome ids breaks ties to the lowest position (each cell that
receives a code also receives its winner's id). Written this way the compiled
insert is about 15 XLA kernels (see ``test_grid_insert_compiles_to_few_kernels``);
at small batches the per-kernel dispatch is most of the cost.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive.state import ArchiveState, CellSpec, init

PAD_SIZES = (64, 256, 1024, 4096, 16384)

NOT_ADDED, IMPROVED, NEW_CELL = 0, 1, 2

# Scatter options: indices past the end are dropped (that is how a candidate
# stays out), and indices are never negative, so XLA skips wrapping them (the
# wrap-around would be one more kernel per index array).
_DROP = dict(mode="drop", wrap_negative_indices=False)


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
    The spec's ``learning_rate`` is used only when the archive's ``threshold_min`` is
    finite (pyribs's CMA-MAE rule).

    Returns:
        The new state (on device) and an InsertResult of host (numpy) arrays of
        length B. Inside other jitted code use :func:`insert_batch` instead.
    """
    batch = padded_batch(state, island, descriptor, fitness, genome_id, valid)
    new_state, packed = _insert_packed(spec, state, *batch)
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
    # Invalid candidates point past the end, where the scatters below drop them
    # (XLA's gathers clamp them to the last cell, a value never used): ``flat`` is
    # the one array that carries validity, so XLA need not materialize ``valid``.
    flat = jnp.where(valid, island * num_cells + cell, out_of_bounds)
    valid = flat < out_of_bounds

    def gather(values: jax.Array) -> jax.Array:
        return values.at[flat].get(mode="promise_in_bounds", wrap_negative_indices=False)

    threshold_flat = state.threshold.reshape(-1)
    id_flat = state.genome_id.reshape(-1)
    old_threshold = gather(threshold_flat)
    old_id = gather(id_flat)
    occupied = old_id >= 0

    # Best eligible fitness per cell, scatter-maxed into the threshold buffer in
    # place: every eligible fitness beats its cell's threshold, so the maximum is
    # the best candidate's (and, with hard thresholds, already the new threshold).
    # Masks are read back from the scatter indices (``< out_of_bounds``) so that
    # XLA keeps one array, not two, per step.
    best_index = jnp.where(valid & (fitness > old_threshold), flat, out_of_bounds)
    eligible = best_index < out_of_bounds
    best_threshold = threshold_flat.at[best_index].max(fitness, **_DROP)
    # Ties go to the lowest batch position: a scatter-min of negative codes into
    # the genome_id buffer (every cell that receives a code also receives its
    # winner's id below). ``old_id > -2`` always holds where eligible: it makes
    # the scatter depend on the gather of ``old_id`` so XLA orders them and updates
    # the donated buffer in place (without it, XLA copies the whole genome_id
    # array). The codes are always < -1, so never mistaken for an id; they are a
    # constant, not a kernel per call.
    code = jnp.asarray(np.arange(size, dtype=np.int32) - (size + 2))
    tie_index = jnp.where(eligible & (fitness == gather(best_threshold)) & (old_id > -2), flat, out_of_bounds)
    scratch_id = id_flat.at[tie_index].min(code, **_DROP)
    # The winner finds its own code (a loser or an invalid candidate, whose ``flat``
    # is clamped to the last cell, finds another's or an id).
    first = gather(scratch_id)
    target = jnp.where(first == code, flat, out_of_bounds)
    winner = target < out_of_bounds

    # The soft branch gets a fresh ``best_index < out_of_bounds``: handing it the
    # shared ``eligible`` makes XLA materialize that mask in one more kernel.
    threshold = jax.lax.cond(
        jnp.isfinite(state.threshold_min),
        lambda: _soft_thresholds(
            best_threshold,
            target,
            best_index < out_of_bounds,
            first + size + 2,
            fitness,
            old_threshold,
            spec.learning_rate,
        ),
        lambda: best_threshold,
    )
    new_state = ArchiveState(
        fitness=state.fitness.reshape(-1).at[target].set(fitness, **_DROP).reshape(state.fitness.shape),
        descriptor=state.descriptor.reshape(-1, dim)
        .at[target]
        .set(descriptor, **_DROP)
        .reshape(state.descriptor.shape),
        genome_id=scratch_id.at[target].set(genome_id, **_DROP).reshape(state.genome_id.shape),
        threshold=threshold.reshape(state.threshold.shape),
        threshold_min=state.threshold_min,
    )

    status = jnp.where(eligible, jnp.where(occupied, 1, 2), 0).astype(jnp.int32)
    baseline = jnp.where(~occupied & jnp.isneginf(old_threshold), 0.0, old_threshold)
    improvement = jnp.where(valid, fitness - baseline, 0.0)
    displaced = jnp.where(winner & occupied, old_id, -1)
    return new_state, InsertResult(status, improvement, cell, displaced, winner)


def _soft_thresholds(
    threshold: jax.Array,
    target: jax.Array,
    eligible: jax.Array,
    winner_position: jax.Array,
    fitness: jax.Array,
    old_threshold: jax.Array,
    learning_rate: float,
) -> jax.Array:
    """CMA-MAE thresholds (pyribs's batch rule) written at the winners' cells.

    ``winner_position`` (the batch position of the candidate's cell winner, read
    where ``eligible``) is a batch-local cell id for the per-cell count and sum of
    accepted fitness, so that no temporary is as large as the archive. Run only
    when ``threshold_min`` is finite: hard thresholds are the best fitness,
    which ``threshold`` already holds.
    """
    size = fitness.shape[0]
    segment = jnp.where(eligible, winner_position, size)
    sums = jax.ops.segment_sum(
        jnp.stack([eligible.astype(jnp.float32), jnp.where(eligible, fitness, 0.0)], 1),
        segment,
        size + 1,
    )[segment]
    count, total = sums[:, 0], sums[:, 1]
    ratio = jnp.float32(1.0 - learning_rate) ** count
    soft = ratio * old_threshold + (1.0 - ratio) * (total / count)
    return threshold.at[target].set(soft, **_DROP)


def _insert_and_pack(*args) -> tuple[ArchiveState, jax.Array]:
    """insert_batch with its results packed into one i32[5, B] array."""
    state, r = insert_batch(*args)
    improvement = jax.lax.bitcast_convert_type(r.improvement, jnp.int32)
    return state, jnp.stack([r.status, improvement, r.cell, r.displaced_id, r.is_elite.astype(jnp.int32)])


insert_device = jax.jit(insert_batch, donate_argnums=(1,))
insert_device.__doc__ = """Jitted :func:`insert_batch` with ``state`` donated, for batches already on
the device (e.g. GPU): no padding, no host transfer; results stay on device.
Args as :func:`insert_batch`."""
_insert_packed = jax.jit(_insert_and_pack, donate_argnums=(1,))


def rebuild(
    spec: CellSpec,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> ArchiveState:
    """A fresh archive holding the elites of all given candidates, in one insert.

    Used when descriptors change (a refit projection) and to check a resumed run
    against its store. With ``threshold_min = -inf`` the result does not depend on
    how the candidates were batched originally; with soft thresholds (the spec's
    ``threshold_min`` finite) it equals a single-batch history.

    Args: as :func:`insert`, arrays of length N.
    """
    return insert(spec, init(spec, islands), island, descriptor, fitness, genome_id, valid)[0]
