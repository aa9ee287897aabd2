"""Novelty archives: k-nearest-neighbour novelty at scale, and a novelty archive kind.

* :func:`novelty` and :func:`novelty_add` score descriptors against a standalone
  ring buffer (:class:`NoveltyState`).
* :class:`NoveltySpec` makes the island archive (:class:`ArchiveState`, C = capacity
  slots) a novelty archive: its entry in :data:`qd.archive.kinds.KINDS` routes
  :func:`~qd.archive.kinds.insert` and :func:`~qd.archive.kinds.rebuild` here, so a
  run is pure novelty search or novelty search with local competition
  (pyribs's ``ProximityArchive``, with the deviations listed on :class:`NoveltySpec`).

The k-NN search never forms a [B, N, D] difference, nor a [B, N] distance matrix
at once: squared distances are ``|q|^2 + |s|^2 - 2 q.s`` (a matmul), computed in
blocks of at most ``_QUERY_BLOCK`` queries x ``_STORED_CHUNK`` stored entries
(32 MiB of float32), each block reduced to its k nearest at once. The coordinates are
centred on the query block's mean first, which keeps the expanded form's rounding
proportional to the data's spread rather than its offset; the k selected distances
are then recomputed from direct differences, so the scores carry no cancellation
error (only neighbours within float32 rounding of each other can be swapped).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qd.archive.cells import InsertResult, padded_batch, unpack_result
from qd.archive.state import ArchiveState, check_thresholds, init

# Block sizes of the k-NN search, measured on XLA:CPU (1,024 queries x 100k x 384-D,
# medians of 3): 4.4 s, as with chunks of 4,096; chunks of 16,384 5.2 s; chunking over
# queries only (blocks of 64 / 128 / 256 queries against all 100k at once) 7.6-11 s.
_QUERY_BLOCK = 1024
_STORED_CHUNK = 8192
# Stored entries per group of the two-stage top-k: XLA:CPU's top_k costs ~12 ns per
# element, a group minimum ~1 ns. The k nearest lie in the k groups with the smallest
# minima, so only those k * _GROUP entries go through the exact top_k (per 1,024 x 8,192
# block: 23 ms instead of 103 ms).
_GROUP = 32
_NO_GROUP = -2  # group of an invalid query: matches no stored entry (empty ones are -1)


# ------------------------------------------------------------------------ k-NN core


def _block_nearest(
    q: jax.Array, q_group: jax.Array, s: jax.Array, s_group: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """The k' = min(k, n) smallest squared distances of each query to a stored block.

    Args:
        q: f32[b, D] centred queries; q_group: i32[b].
        s: f32[n, D] centred stored entries; s_group: i32[n]; an entry counts for a
            query only when their groups are equal.
    Returns:
        f32[b, k'] squared distances (+inf where fewer than k' count), i32[b, k']
        indices into the block (rows beyond ``n`` only where the distance is +inf).
    """
    b, n = q.shape[0], s.shape[0]
    d2 = jnp.sum(q * q, 1)[:, None] + jnp.sum(s * s, 1)[None, :] - 2.0 * (q @ s.T)
    d2 = jnp.where(q_group[:, None] == s_group[None, :], jnp.maximum(d2, 0.0), jnp.inf)
    groups = -(-n // _GROUP)
    if groups <= k:
        neg, index = lax.top_k(-d2, min(k, n))
        return -neg, index
    d2 = jnp.pad(d2, ((0, 0), (0, groups * _GROUP - n)), constant_values=jnp.inf)
    d3 = d2.reshape(b, groups, _GROUP)
    _, group = lax.top_k(-jnp.min(d3, axis=2), k)  # [b, k]
    candidates = d3[jnp.arange(b)[:, None], group].reshape(b, k * _GROUP)
    neg, pick = lax.top_k(-candidates, k)
    index = jnp.take_along_axis(group, pick // _GROUP, axis=1) * _GROUP + pick % _GROUP
    return -neg, index


def _query_block_knn(
    query: jax.Array,
    q_group: jax.Array,
    stored: jax.Array,
    s_group: jax.Array,
    k: int,
    chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """k nearest of b queries f32[b, D] among stored f32[N, D], over stored chunks.

    Returns f32[b, kk] squared distances of the expanded form and i32[b, kk] indices
    in [0, N) (kk = min(k, N)); +inf where fewer than kk entries count.
    """
    num, dim = stored.shape
    weight = (q_group != _NO_GROUP).astype(jnp.float32)
    centre = (weight @ query) / jnp.maximum(jnp.sum(weight), 1.0)
    q = query - centre
    full = num // chunk

    def one_chunk(_, i):
        start = i * chunk
        s = lax.dynamic_slice(stored, (start, 0), (chunk, dim)) - centre
        d2, index = _block_nearest(q, q_group, s, lax.dynamic_slice(s_group, (start,), (chunk,)), k)
        return None, (d2, index + start)

    parts = []
    if full:
        d2, index = lax.scan(one_chunk, None, jnp.arange(full))[1]  # [full, b, k']
        parts.append(
            (
                jnp.moveaxis(d2, 0, 1).reshape(q.shape[0], -1),
                jnp.moveaxis(index, 0, 1).reshape(q.shape[0], -1),
            )
        )
    if num > full * chunk:
        start = full * chunk
        d2, index = _block_nearest(q, q_group, stored[start:] - centre, s_group[start:], k)
        parts.append((d2, index + start))
    d2 = jnp.concatenate([p[0] for p in parts], axis=1)
    index = jnp.concatenate([p[1] for p in parts], axis=1)
    neg, pick = lax.top_k(-d2, min(k, num))
    return -neg, jnp.minimum(jnp.take_along_axis(index, pick, axis=1), num - 1)


def knn(
    query: jax.Array,
    query_group: jax.Array,
    stored: jax.Array,
    stored_group: jax.Array,
    k: int,
    block: int = _QUERY_BLOCK,
    chunk: int = _STORED_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """Exact Euclidean k nearest neighbours with bounded memory (traceable).

    An entry is a neighbour of a query only when their groups match (islands, or
    filled vs empty slots). Peak temporary: ``block x chunk`` float32.

    Args:
        query: f32[B, D], finite. query_group: i32[B]; -2 for a query that should
            match nothing.
        stored: f32[N, D], finite. stored_group: i32[N].
        k: neighbours wanted (static); ``kk = min(k, N)`` are returned.
        block, chunk: queries and stored entries per block (static).
    Returns:
        dist f32[B, kk]: distances from direct differences, not sorted, +inf where
        fewer than kk entries match; index i32[B, kk] into ``stored``.
    """
    num_queries = query.shape[0]
    run = functools.partial(_query_block_knn, stored=stored, s_group=stored_group, k=k, chunk=chunk)
    if num_queries <= block:
        d2, index = run(query, query_group)
    else:
        pad = -num_queries % block
        q = jnp.pad(query, ((0, pad), (0, 0))).reshape(-1, block, query.shape[1])
        g = jnp.pad(query_group, (0, pad), constant_values=_NO_GROUP).reshape(-1, block)
        d2, index = lax.map(lambda x: run(*x), (q, g))
        d2 = d2.reshape(-1, d2.shape[-1])[:num_queries]
        index = index.reshape(-1, index.shape[-1])[:num_queries]
    diff = query[:, None, :] - stored[index]
    dist = jnp.sqrt(jnp.sum(diff * diff, axis=2))
    return jnp.where(jnp.isfinite(d2), dist, jnp.inf), index


def _mean_present(dist: jax.Array) -> jax.Array:
    """f32[B, kk] -> f32[B]: mean of the finite entries, +inf when none is."""
    present = jnp.isfinite(dist)
    num = jnp.sum(present, axis=1)
    total = jnp.sum(jnp.where(present, dist, 0.0), axis=1)
    return jnp.where(num > 0, total / jnp.maximum(num, 1), jnp.inf)


# -------------------------------------------------------------- standalone buffer


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
    descriptor = jnp.asarray(descriptor, jnp.float32)
    group = jnp.where(state.genome_id >= 0, 0, -1)
    dist, _ = knn(descriptor, jnp.zeros(descriptor.shape[0], jnp.int32), state.descriptor, group, k)
    return _mean_present(dist)


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


# ------------------------------------------------------------ the archive kind


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class NoveltySpec:
    """An unstructured archive of ``capacity`` slots per island (static, hashable).

    A candidate's novelty is its mean distance to the ``k`` nearest entries of its
    island's archive as it was before the batch (fewer than k: mean over those
    present; empty: +inf). Candidates with novelty > ``threshold`` are added. With
    ``local_competition``, a candidate that is not novel replaces its nearest
    neighbour (equidistant ones: the lowest slot) if its fitness is higher (per slot
    the best such candidate wins, ties to the lowest batch position), as in Novelty
    Search with Local Competition.

    Deviations from pyribs's ``ProximityArchive``, for a fixed-size JAX state:

    * Fixed capacity. New entries fill empty slots first, then replace the oldest
      entries (lowest genome_id: store ids increase, so no age is stored; a migrant
      keeps its id, hence its age). Slots improved by local competition in the same
      batch are not replaced. If a batch has more novel candidates than slots, the
      last ones in batch order are kept; the others still report status 2.
    * ``> threshold`` where pyribs adds at ``>=``; an empty archive gives +inf
      novelty where pyribs reports the threshold. No threshold decay.
    * Invalid candidates (``valid=False``, NaN/inf fitness or descriptor, negative
      id, island out of range) are masked out instead of raising.
    * CMA-MAE thresholds do not apply: ``learning_rate`` is ignored, ``threshold_min``
      only fills the thresholds of empty slots, and a slot's threshold is its fitness.

    Attributes:
        capacity: slots per island (the archive's C, ``num_cells``).
        descriptor_dim: D.
        k: neighbours in the novelty score.
        threshold: novelty needed to be added.
        local_competition: let non-novel candidates replace a worse nearest neighbour.
        learning_rate, threshold_min: the CMA-MAE settings every spec carries
            (:func:`qd.archive.state.check_thresholds`), unused here (see above).
    """

    kind: ClassVar[str] = "novelty"  # the run directory's name for it (``archive.json``)

    capacity: int
    descriptor_dim: int
    k: int = 15
    threshold: float = 0.0
    local_competition: bool = False
    learning_rate: float = 1.0
    threshold_min: float = -math.inf

    def __post_init__(self) -> None:
        for name in ("capacity", "descriptor_dim", "k"):
            object.__setattr__(self, name, int(getattr(self, name)))
            if getattr(self, name) < 1:
                raise ValueError(f"NoveltySpec.{name} must be >= 1, got {getattr(self, name)}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "local_competition", bool(self.local_competition))
        thresholds = check_thresholds(self.learning_rate, self.threshold_min)
        object.__setattr__(self, "learning_rate", thresholds[0])
        object.__setattr__(self, "threshold_min", thresholds[1])

    @property
    def num_cells(self) -> int:
        return self.capacity


def _placeable(state: ArchiveState, island: jax.Array, descriptor: jax.Array) -> jax.Array:
    """bool[B]: finite descriptor f32[B, D] and island i32[B] in range."""
    return jnp.all(jnp.isfinite(descriptor), axis=1) & (island >= 0) & (island < state.num_islands)


def _archive_knn(spec, state, island, descriptor, ok):
    """k nearest of each candidate in its island: dist f32[B, kk], flat index i32[B, kk]
    into the [I * C] slots."""
    num_islands, capacity = state.genome_id.shape
    stored_group = jnp.where(
        state.genome_id >= 0, jnp.arange(num_islands, dtype=jnp.int32)[:, None], -1
    ).reshape(-1)
    return knn(
        jnp.where(ok[:, None], descriptor, 0.0),
        jnp.where(ok, island, _NO_GROUP).astype(jnp.int32),
        state.descriptor.reshape(num_islands * capacity, -1),
        stored_group,
        spec.k,
    )


@functools.partial(jax.jit, static_argnums=(0,))
def archive_novelty(
    spec: NoveltySpec, state: ArchiveState, island: jax.Array | int, descriptor: jax.Array
) -> jax.Array:
    """f32[B]: novelty of descriptors f32[B, D] against island (i32[B] or scalar) of
    the archive, as :func:`insert` judges it; NaN for a non-finite descriptor or an
    island out of range."""
    descriptor = jnp.asarray(descriptor, jnp.float32)
    island = jnp.broadcast_to(jnp.asarray(island, jnp.int32), descriptor.shape[:1])
    ok = _placeable(state, island, descriptor)
    dist, _ = _archive_knn(spec, state, island, descriptor, ok)
    return jnp.where(ok, _mean_present(dist), jnp.nan)


def novelty_insert_batch(
    spec: NoveltySpec,
    state: ArchiveState,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
) -> tuple[ArchiveState, InsertResult, jax.Array]:
    """The traceable novelty insert (no padding, no donation) of B candidates.

    Returns:
        The new state; an InsertResult (status 2: novel, 1: beat its nearest
        neighbour by local competition, 0: neither; improvement: fitness if novel,
        else fitness minus the nearest neighbour's; cell: the slot written when
        ``is_elite``, else the nearest neighbour's slot (0 if the island was empty);
        displaced_id: the id overwritten, -1 if none); and novelty f32[B] (NaN for
        invalid candidates).
    """
    num_islands, capacity = state.genome_id.shape
    size = fitness.shape[0]
    out_of_bounds = num_islands * capacity
    position = jnp.arange(size, dtype=jnp.int32)

    ok = valid & (genome_id >= 0) & jnp.isfinite(fitness) & _placeable(state, island, descriptor)
    island = jnp.where(ok, island, 0)
    dist, index = _archive_knn(spec, state, island, descriptor, ok)
    score = _mean_present(dist)
    closest = jnp.min(dist, axis=1)
    has_neighbour = jnp.isfinite(closest)
    # The nearest neighbour; equidistant ones go to the lowest slot.
    nearest = jnp.min(jnp.where(dist == closest[:, None], index, out_of_bounds), axis=1)
    nearest = jnp.minimum(nearest, out_of_bounds - 1)
    novel = ok & (score > spec.threshold)

    fitness_flat = state.fitness.reshape(-1)
    id_flat = state.genome_id.reshape(-1)
    neighbour_fitness = jnp.where(has_neighbour, fitness_flat[nearest], 0.0)

    # Local competition: per nearest slot, the best eligible challenger wins.
    eligible = ok & ~novel & has_neighbour & (fitness > neighbour_fitness)
    if not spec.local_competition:
        eligible = jnp.zeros_like(eligible)
    target = jnp.where(eligible, nearest, out_of_bounds)
    best = jnp.full(out_of_bounds, -jnp.inf).at[target].max(fitness, mode="drop")
    first = (
        jnp.full(out_of_bounds, size)
        .at[jnp.where(eligible & (fitness == best[nearest]), nearest, out_of_bounds)]
        .min(position, mode="drop")
    )
    winner = eligible & (first[nearest] == position)
    replaced = (
        jnp.zeros(out_of_bounds, bool)
        .at[jnp.where(winner, nearest, out_of_bounds)]
        .set(True, mode="drop")
        .reshape(num_islands, capacity)
    )

    # Novel candidates take, per island, the empty slots (id -1) and then the oldest
    # (lowest id), never a slot just won by local competition.
    age = jnp.where(replaced, jnp.iinfo(jnp.int32).max, state.genome_id)
    order = lax.top_k(-age, min(size, capacity))[1]  # [I, m] slots, youngest last
    available = capacity - jnp.sum(replaced, axis=1)  # [I]
    mine = novel[:, None] & (island[:, None] == jnp.arange(num_islands)[None, :])
    count = jnp.cumsum(mine.astype(jnp.int32), axis=0)
    rank = jnp.take_along_axis(count, island[:, None], axis=1)[:, 0] - 1
    num_novel = count[-1][island]
    dropped = jnp.maximum(num_novel - available[island], 0)
    kept = novel & (rank >= dropped)
    slot = order[island, jnp.clip(rank - dropped, 0, order.shape[1] - 1)]

    written = jnp.where(kept, island * capacity + slot, jnp.where(winner, nearest, out_of_bounds))
    new_fitness = fitness_flat.at[written].set(fitness, mode="drop").reshape(num_islands, capacity)
    new_state = ArchiveState(
        fitness=new_fitness,
        descriptor=state.descriptor.reshape(out_of_bounds, -1)
        .at[written]
        .set(descriptor, mode="drop")
        .reshape(state.descriptor.shape),
        genome_id=id_flat.at[written].set(genome_id, mode="drop").reshape(num_islands, capacity),
        threshold=new_fitness,
        threshold_min=state.threshold_min,
    )

    is_elite = kept | winner
    status = jnp.where(novel, 2, jnp.where(eligible, 1, 0)).astype(jnp.int32)
    improvement = jnp.where(ok, jnp.where(novel, fitness, fitness - neighbour_fitness), 0.0)
    nearest_slot = jnp.where(has_neighbour, nearest - island * capacity, 0)
    cell = jnp.where(kept, slot, nearest_slot).astype(jnp.int32)
    displaced = jnp.where(is_elite, id_flat[jnp.minimum(written, out_of_bounds - 1)], -1)
    result = InsertResult(status, improvement, cell, displaced, is_elite)
    return new_state, result, jnp.where(ok, score, jnp.nan)


def _insert_and_pack(*args) -> tuple[ArchiveState, jax.Array]:
    """novelty_insert_batch with its results packed into one i32[6, B] array."""
    state, r, score = novelty_insert_batch(*args)
    as_int = functools.partial(lax.bitcast_convert_type, new_dtype=jnp.int32)
    return state, jnp.stack(
        [
            r.status,
            as_int(r.improvement),
            r.cell,
            r.displaced_id,
            r.is_elite.astype(jnp.int32),
            as_int(score),
        ]
    )


_insert_packed = jax.jit(_insert_and_pack, static_argnums=(0,), donate_argnums=(1,))


def novelty_insert(
    spec: NoveltySpec,
    state: ArchiveState,
    island: jax.Array | int,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> tuple[ArchiveState, InsertResult, np.ndarray]:
    """:func:`insert` for a NoveltySpec, also returning the novelty f32[B] (host).

    ``state`` is donated. Batches are padded as for cell archives (few compiles).
    """
    batch = padded_batch(state, island, descriptor, fitness, genome_id, valid)
    new_state, packed = _insert_packed(spec, state, *batch)
    n = np.asarray(fitness).size
    packed = np.asarray(packed)[:, :n]  # one transfer: the result rows and the novelty row
    return new_state, unpack_result(packed, n), packed[5].view(np.float32)


# ------------------------------------------------------------------- rebuild


def novelty_rebuild(
    spec: NoveltySpec,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
    batch_size: int = 1024,
) -> ArchiveState:
    """A fresh novelty archive from all given candidates, replayed in batches of
    ``batch_size`` in genome_id (store) order: unlike a cell archive, the result
    depends on the insertion order."""
    genome_id = np.asarray(genome_id, np.int32).reshape(-1)
    n = genome_id.shape[0]
    order = np.argsort(genome_id, kind="stable")
    genome_id = genome_id[order]
    island = np.broadcast_to(np.asarray(island, np.int32), (n,))[order]
    descriptor = np.asarray(descriptor, np.float32).reshape(n, spec.descriptor_dim)[order]
    fitness = np.asarray(fitness, np.float32).reshape(-1)[order]
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool).reshape(-1)[order]
    state = init(spec, islands)
    for s in range(0, n, batch_size):
        part = slice(s, s + batch_size)
        state = novelty_insert(
            spec, state, island[part], descriptor[part], fitness[part], genome_id[part], valid[part]
        )[0]
    return state
