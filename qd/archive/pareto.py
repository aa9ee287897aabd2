"""A Pareto archive: every cell of a grid or CVT holds a front of at most K elites.

MAP-Elites keeps one elite per cell, the best on one fitness; with several objectives
(held-out error and program size, accuracy and tokens) no single best exists, so each
cell keeps its non-dominated candidates instead (the idea of MOME, Pierrot et al. 2022,
QDax's ``mome_repertoire``). The state carries islands on the leading axis as every
archive does: ``[islands, cells, K, objectives]``.

Objectives arrive maximised: a task's "min" objectives are negated once, where its
metrics become an array (:func:`qd.task.objective_matrix`); nothing here knows about
directions.

The insert rule, applied per (island, cell) to the cell's front before the batch
together with the batch's valid candidates of that cell, in one jitted call:

1. an id already in the pool (the front first, then the batch in order) is dropped, so
   re-inserting an elite (a replay, a migrant coming home) changes nothing;
2. a candidate dominated by another of the pool leaves (equal vectors do not dominate
   each other, so duplicates stay);
3. when more than K remain, the K with the largest crowding distance stay (NSGA-II's:
   per objective, the gap between a member's neighbours over the front's range; the
   two ends infinite), ties going to the earlier (smaller) genome id; neighbours are
   ordered by value, then id, so equal values have a definite order;
4. the survivors fill the cell's slots by ascending id.

With K = 1 and one objective this is the grid insert at ``learning_rate`` 1 whenever
ids grow with batch position (a run's store ids do): the best stays, ties keep the
earlier. Cost: the batch is sorted by cell, and each candidate's cell's front and its
cell's segment of the sorted batch (a window of :data:`WINDOWS` width; the whole batch
only when one cell takes more) are all it is compared with: a member with the segment
([B, K, W] pairs: members never dominate one another), a candidate with the front and
the segment ([B, K + W]); crowding distances ([B * (K + 1), K + W]) only when a front
outgrows K. Each touched cell's slots are rebuilt whole and written back as rows.
Batches are padded to :data:`qd.archive.cells.PAD_SIZES`. ``bench/mome.py`` times it
beside QDax's MOME (``bench/RESULTS.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive.cells import InsertResult, padded_size, unpack_result
from qd.archive.cvt import CVTSpec
from qd.archive.grid import GridSpec
from qd.archive.migration import check_topology, island_targets
from qd.archive.state import EMPTY_ID
from qd.contract import ConfigError

_DROP = dict(mode="drop", wrap_negative_indices=False)


@dataclasses.dataclass(frozen=True)
class ParetoSpec:
    """Cells (a :class:`GridSpec` or :class:`CVTSpec`) that each hold a front.

    A JAX pytree: the cells are its child (a CVT's lookup arrays are traced), the front
    size and objective count are static, so jitted inserts specialise on them.

    Attributes:
        cells: where a descriptor lands.
        front_size: K, the most elites a cell's front keeps.
        num_objectives: M, the length of each candidate's objective vector.
    """

    kind: ClassVar[str] = "pareto"  # the run directory's name for it (``archive.json``)

    cells: GridSpec | CVTSpec
    front_size: int = 4
    num_objectives: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.cells, (GridSpec, CVTSpec)):
            raise ConfigError("cells", f"must be a GridSpec or CVTSpec, got {type(self.cells).__name__}")
        if int(self.front_size) < 1:
            raise ConfigError("front_size", f"must be >= 1, got {self.front_size}")
        if int(self.num_objectives) < 1:
            raise ConfigError(
                "objectives", f"a Pareto archive needs >= 1 objective, got {self.num_objectives}"
            )
        object.__setattr__(self, "front_size", int(self.front_size))
        object.__setattr__(self, "num_objectives", int(self.num_objectives))

    @property
    def num_cells(self) -> int:
        return self.cells.num_cells

    @property
    def descriptor_dim(self) -> int:
        return self.cells.descriptor_dim

    @property
    def learning_rate(self) -> float:
        """Always 1: a front has no soft thresholds (read by code that saves every spec's)."""
        return 1.0

    @property
    def threshold_min(self) -> float:
        return -math.inf

    def index(self, descriptor: jax.Array) -> jax.Array:
        """f32[B, D] -> i32[B]: the cells' index."""
        return self.cells.index(descriptor)


jax.tree_util.register_pytree_with_keys(
    ParetoSpec,
    lambda s: ([(jax.tree_util.GetAttrKey("cells"), s.cells)], (s.front_size, s.num_objectives)),
    lambda aux, children: _unflatten(children[0], *aux),
    lambda s: ([s.cells], (s.front_size, s.num_objectives)),
)


def _unflatten(cells: Any, front_size: int, num_objectives: int) -> ParetoSpec:
    """A spec from its parts without validating: JAX unflattens with tracer leaves."""
    spec = object.__new__(ParetoSpec)
    object.__setattr__(spec, "cells", cells)
    object.__setattr__(spec, "front_size", front_size)
    object.__setattr__(spec, "num_objectives", num_objectives)
    return spec


class ParetoState(NamedTuple):
    """Fronts of I islands over C cells, K slots each, M maximised objectives.

    Attributes:
        objectives: f32[I, C, K, M]; -inf in an empty slot.
        descriptor: f32[I, C, K, D]; 0 in an empty slot.
        genome_id: i32[I, C, K]; -1 in an empty slot. A cell's members fill its first
            slots by ascending id.
    """

    objectives: jax.Array
    descriptor: jax.Array
    genome_id: jax.Array

    @property
    def num_islands(self) -> int:
        return self.genome_id.shape[0]

    @property
    def num_cells(self) -> int:
        return self.genome_id.shape[1]


def init(spec: ParetoSpec, islands: int = 1) -> ParetoState:
    """Empty fronts for ``islands`` islands over the spec's cells."""
    if islands < 1:
        raise ValueError(f"islands must be >= 1, got {islands}")
    shape = (islands, spec.num_cells, spec.front_size)
    return ParetoState(
        objectives=jnp.full((*shape, spec.num_objectives), -jnp.inf, jnp.float32),
        descriptor=jnp.zeros((*shape, spec.descriptor_dim), jnp.float32),
        genome_id=jnp.full(shape, EMPTY_ID, jnp.int32),
    )


@jax.jit
def reset(state: ParetoState, island_mask: jax.Array) -> ParetoState:
    """Empties the islands where ``island_mask`` (bool[I]) is True."""
    keep = ~island_mask[:, None, None]
    return ParetoState(
        objectives=jnp.where(keep[..., None], state.objectives, -jnp.inf),
        descriptor=jnp.where(keep[..., None], state.descriptor, 0.0),
        genome_id=jnp.where(keep, state.genome_id, EMPTY_ID),
    )


def _crowding(
    values: jax.Array, ids: jax.Array, other: jax.Array, other_id: jax.Array, peer: jax.Array
) -> jax.Array:
    """f32[E]: each entry's crowding distance among its peers.

    ``other`` f32[E, N, M] and ``other_id`` i32[E, N] are the entries each one is
    compared with, ``peer`` bool[E, N] the ones on its front (itself included);
    neighbours in (value, id) order, the ends of each objective infinite. Objectives
    are summed in order, so a reference can round alike."""
    own = values[:, None, :]
    earlier_id = (other_id < ids[:, None])[..., None]
    later_id = (other_id > ids[:, None])[..., None]
    peers = peer[..., None]
    below = peers & ((other < own) | ((other == own) & earlier_id))
    above = peers & ((other > own) | ((other == own) & later_id))
    previous = jnp.max(jnp.where(below, other, -jnp.inf), axis=1)
    following = jnp.min(jnp.where(above, other, jnp.inf), axis=1)
    span = jnp.max(jnp.where(peers, other, -jnp.inf), axis=1) - jnp.min(
        jnp.where(peers, other, jnp.inf), axis=1
    )
    inner = jnp.where(span > 0, (following - previous) / jnp.where(span > 0, span, 1.0), 0.0)
    part = jnp.where(jnp.any(below, axis=1) & jnp.any(above, axis=1), inner, jnp.inf)
    crowding = part[:, 0]
    for m in range(1, part.shape[1]):
        crowding = crowding + part[:, m]
    return crowding


class _Sorted(NamedTuple):
    """A batch sorted by flat cell (island * cells + cell; invalid candidates last, batch
    order within a cell) beside its cells' fronts before the batch.

    Attributes:
        flat: i32[B] the flat cell (0 for an invalid candidate); valid: bool[B];
        objectives: f32[B, M]; genome_id: i32[B];
        start: i32[B] where the candidate's cell's segment of the sorted batch starts;
        old_values: f32[B, K, M], old_id: i32[B, K] (-1 if empty or the candidate is
        invalid): the candidate's cell's front.
    """

    flat: jax.Array
    valid: jax.Array
    objectives: jax.Array
    genome_id: jax.Array
    start: jax.Array
    old_values: jax.Array
    old_id: jax.Array


class Payload(NamedTuple):
    """Per-slot data a front's members carry with them, as the descriptor is (a device
    run's genomes and parents): members move between slots on every insert.

    Attributes:
        slots: [I, C, K, ...] the members' values.
        batch: [B, ...] the candidates'.
        empty: the value of an empty slot.
    """

    slots: jax.Array
    batch: jax.Array
    empty: float | int | bool


# The widths of the window of the sorted batch an entry is compared with, narrowest first;
# a batch runs at the narrowest that holds its largest cell segment (the batch size when
# none does). The branches compile together; one runs.
WINDOWS = (16,)


def insert_batch(
    spec: ParetoSpec,
    state: ParetoState,
    island: jax.Array,
    descriptor: jax.Array,
    objectives: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
) -> tuple[ParetoState, InsertResult]:
    """Inserts B candidates (traceable: no padding, no donation); the rule is the module's.
    Args and results as :func:`insert_carrying`, without payloads."""
    new_state, _, result = insert_carrying(spec, state, island, descriptor, objectives, genome_id, valid, ())
    return new_state, result


def insert_carrying(
    spec: ParetoSpec,
    state: ParetoState,
    island: jax.Array,
    descriptor: jax.Array,
    objectives: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
    payloads: tuple[Payload, ...],
) -> tuple[ParetoState, tuple[jax.Array, ...], InsertResult]:
    """:func:`insert_batch` whose members carry ``payloads`` into their new slots
    (returned in order, each [I, C, K, ...]).

    Args:
        island: i32[B]; descriptor: f32[B, D]; objectives: f32[B, M] maximised (f32[B]
            when M = 1); genome_id: i32[B]; valid: bool[B]. Invalid candidates (also
            non-finite values, negative ids, islands out of range) never enter.

    Returns:
        The new state, the payloads' new slots and an :class:`InsertResult`: ``status`` 2 (the cell was empty)
        or 1 when no member of the front before the batch is at least as good in every
        objective, else 0; ``improvement`` the first objective minus the best first
        objective of that front (0 for an empty cell); ``is_elite`` the candidate is
        on the cell's front now; ``displaced_id`` the smallest id of the former members
        it dominates that left the front (-1 if none or not on the front).
    """
    num_islands, num_cells, k, m = state.objectives.shape
    size = genome_id.shape[0]
    objectives = objectives.reshape(size, m).astype(jnp.float32)
    cell = spec.index(descriptor)
    valid = (
        valid
        & (genome_id >= 0)
        & jnp.all(jnp.isfinite(objectives), axis=1)
        & jnp.all(jnp.isfinite(descriptor), axis=1)
        & (island >= 0)
        & (island < num_islands)
    )
    order = jnp.argsort(jnp.where(valid, island * num_cells + cell, num_islands * num_cells), stable=True)
    ok = valid[order]
    flat = jnp.where(ok, (island * num_cells + cell)[order], 0)
    position = jnp.arange(size)
    first = jnp.concatenate([jnp.ones(1, bool), (flat[1:] != flat[:-1]) | (ok[1:] != ok[:-1])])
    start = jax.lax.cummax(jnp.where(first, position, 0))
    old_values = state.objectives.reshape(-1, k, m)[flat]
    old_id = jnp.where(ok[:, None], state.genome_id.reshape(-1, k)[flat], EMPTY_ID)
    payloads = (Payload(state.descriptor, descriptor.astype(jnp.float32), 0.0), *payloads)
    carried = tuple((p.slots.reshape(-1, k, *p.slots.shape[3:])[flat], p.batch[order]) for p in payloads)
    batch = _Sorted(flat, ok, objectives[order], genome_id[order], start, old_values, old_id)
    widths = [w for w in WINDOWS if w < size] + [size]
    longest = jnp.max(jnp.where(ok, position - start + 1, 0))
    branch = sum((longest > w).astype(jnp.int32) for w in widths[:-1])
    # Only the batch's arrays go through the switch: the state's are rewritten after it.
    out = num_islands * num_cells
    keep, target, slot = jax.lax.switch(branch, [functools.partial(_fronts, w, out) for w in widths], batch)
    # Each touched cell's K slots are rebuilt whole, by its first candidate: the entry
    # each slot now holds (index E: none, the empty value) is gathered, and the rows are
    # written back at once (a scatter per slot element was most of an insert's time).
    count = target.shape[0]
    holder = jnp.full((out, k), count, jnp.int32).at[target, slot].set(jnp.arange(count), **_DROP)
    source = holder[flat]  # [B, K]
    written = jnp.where(ok & (start == position), flat, out)

    def rewrite(current: jax.Array, empty: float | int | bool, new: jax.Array) -> jax.Array:
        table = jnp.concatenate([new, jnp.full((1, *new.shape[1:]), empty, new.dtype)])
        rows = current.reshape(out, k, *current.shape[3:])
        return rows.at[written].set(table[source], **_DROP).reshape(current.shape)

    slots = [rewrite(p.slots, p.empty, _entries(*parts)) for p, parts in zip(payloads, carried)]
    values = rewrite(state.objectives, -jnp.inf, _entries(old_values, batch.objectives))
    ids = rewrite(state.genome_id, EMPTY_ID, _entries(old_id, batch.genome_id))

    objectives = batch.objectives
    member = old_id >= 0  # [B, K]
    occupied = jnp.any(member, axis=1)
    covered = jnp.any(member & jnp.all(old_values >= objectives[:, None, :], axis=-1), axis=1)
    status = jnp.where(ok & ~covered, jnp.where(occupied, 1, 2), 0).astype(jnp.int32)
    baseline = jnp.where(occupied, jnp.max(jnp.where(member, old_values[..., 0], -jnp.inf), axis=1), 0.0)
    improvement = jnp.where(ok, objectives[:, 0] - baseline, 0.0)
    is_elite = keep[k * size :]
    left = member & ~keep[: k * size].reshape(size, k)
    dominated = jnp.all(objectives[:, None, :] >= old_values, axis=-1) & jnp.any(
        objectives[:, None, :] > old_values, axis=-1
    )
    gone = jnp.min(jnp.where(left & dominated, old_id, jnp.iinfo(jnp.int32).max), axis=1)
    displaced = jnp.where(is_elite & (gone < jnp.iinfo(jnp.int32).max), gone, EMPTY_ID)

    def unsorted(x: jax.Array) -> jax.Array:
        return jnp.zeros_like(x).at[order].set(x)

    result = InsertResult(
        unsorted(status), unsorted(improvement), cell, unsorted(displaced), unsorted(is_elite)
    )
    return ParetoState(values, slots[0], ids), tuple(slots[1:]), result


def _fronts(width: int, out: int, batch: _Sorted) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The module's rule over a sorted batch, per entry (E = B * (K + 1): every
    candidate's copy of its cell's front, then the candidates): whether it stays
    (bool[E]), and the flat cell and slot it is written to (``out``: not written).

    Each entry is compared with its cell's front (its owner's copy) and the ``width``
    candidates from its cell's segment start, those of its cell among them: an
    [E, K + width, M] temporary, where comparing with the whole batch took
    [E, K + B, M]. ``width`` must hold the batch's largest segment."""
    size, k = batch.old_id.shape
    position = jnp.arange(size)
    reach = batch.start[:, None] + jnp.arange(width)[None, :]
    window = jnp.minimum(reach, size - 1)  # [B, W]: the candidates a candidate's entries see
    neighbour = (
        (reach < size)
        & (batch.flat[window] == batch.flat[:, None])
        & batch.valid[window]
        & batch.valid[:, None]
    )
    owner = jnp.concatenate([jnp.repeat(position, k), position])
    old_id, old_member = batch.old_id, batch.old_id >= 0

    def others(old: jax.Array, new: jax.Array) -> jax.Array:
        """[E, K + W, ...]: a per-entry quantity, given as its [B, K, ...] front part
        and [B, ...] batch part, as seen by each entry."""
        return jnp.concatenate([old[owner], new[window[owner]]], axis=1)

    genome_id = batch.genome_id
    # An id already in the pool (the front, or an earlier candidate) enters once.
    repeated = jnp.any(old_member & (old_id == genome_id[:, None]), axis=1) | jnp.any(
        neighbour & (window < position[:, None]) & (genome_id[window] == genome_id[:, None]), axis=1
    )
    fresh = batch.valid & ~repeated
    values = _entries(batch.old_values, batch.objectives)
    ids = _entries(old_id, genome_id)
    active = _entries(old_member, fresh)
    group = _entries(jnp.broadcast_to(batch.flat[:, None], (size, k)), batch.flat)
    # Dominance: a front's members never dominate one another, so a member is compared
    # with its cell's candidates only, a candidate with its cell's front and candidates.
    rivals = fresh[window] & neighbour  # [B, W]
    rival_values = batch.objectives[window]  # [B, W, M]
    member_out = _dominated(batch.old_values, rival_values, rivals)  # [B, K]
    mine = batch.objectives[:, None]
    candidate_out = (_dominated(mine, batch.old_values, old_member) | _dominated(mine, rival_values, rivals))[
        :, 0
    ]
    front = active & ~_entries(member_out, candidate_out)
    old_front, new_front = _split(front, size, k)
    members = jnp.sum(old_front, axis=1) + jnp.sum(new_front[window] & neighbour, axis=1)

    def crowded_out() -> jax.Array:
        """``front`` less the members crowded out of fronts over K: [E, K + W] pairs."""
        other = others(batch.old_values, batch.objectives)  # [E, K + W, M]
        other_id = others(old_id, genome_id)
        peer = (
            front[:, None]
            & jnp.concatenate([old_member[owner], rivals[owner]], axis=1)
            & others(old_front, new_front)
        )
        crowding = _crowding(values, ids, other, other_id, peer)
        other_crowding = others(*_split(crowding, size, k))
        better = peer & (
            (other_crowding > crowding[:, None])
            | ((other_crowding == crowding[:, None]) & (other_id < ids[:, None]))
        )
        return front & (jnp.sum(better, axis=1) < k)

    # Crowding distances only where a front outgrows K (most batches leave every front
    # within K, the more so the larger K is).
    keep = jax.lax.cond(jnp.any(members > k), crowded_out, lambda: front)

    # Each cell's survivors are written once (the members by the first candidate's copy of
    # the front), to their rank by id among the cell's survivors.
    first_copy = jnp.broadcast_to((batch.start == position)[:, None], (size, k))
    target = jnp.where(keep & _entries(first_copy, jnp.ones(size, bool)), group, out)
    return keep, target, _rank_in_group(target, ids)


def _entries(old: jax.Array, new: jax.Array) -> jax.Array:
    """[E, ...]: a per-entry quantity from its [B, K, ...] front part and [B, ...] batch part."""
    return jnp.concatenate([old.reshape(-1, *old.shape[2:]), new])


def _dominated(mine: jax.Array, theirs: jax.Array, live: jax.Array) -> jax.Array:
    """bool[B, X]: each of ``mine`` f32[B, X, M] is dominated by one of the ``live``
    (bool[B, Y]) of ``theirs`` f32[B, Y, M] (equal vectors do not dominate)."""
    at_least = jnp.all(theirs[:, None] >= mine[:, :, None], axis=-1)
    beats = jnp.any(theirs[:, None] > mine[:, :, None], axis=-1)
    return jnp.any(live[:, None, :] & at_least & beats, axis=-1)


def _rank_in_group(group: jax.Array, ids: jax.Array) -> jax.Array:
    """i32[E]: each entry's rank by id among the entries of its group (ids unique within
    a group), by sorting on (group, id)."""
    by_id = jnp.argsort(ids, stable=True)
    order = by_id[jnp.argsort(group[by_id], stable=True)]
    sorted_group = group[order]
    rank = jnp.arange(group.shape[0])
    first = jnp.concatenate([jnp.ones(1, bool), sorted_group[1:] != sorted_group[:-1]])
    start = jax.lax.cummax(jnp.where(first, rank, 0))
    return jnp.zeros_like(rank).at[order].set(rank - start)


def _split(per_entry: jax.Array, size: int, k: int) -> tuple[jax.Array, jax.Array]:
    """A per-entry array as its front part [B, K, ...] and its batch part [B, ...]."""
    return per_entry[: size * k].reshape(size, k, *per_entry.shape[1:]), per_entry[size * k :]


def _insert_and_pack(*args: Any) -> tuple[ParetoState, jax.Array]:
    """insert_batch with its results packed into one i32[5, B] array (one transfer)."""
    state, r = insert_batch(*args)
    improvement = jax.lax.bitcast_convert_type(r.improvement, jnp.int32)
    return state, jnp.stack([r.status, improvement, r.cell, r.displaced_id, r.is_elite.astype(jnp.int32)])


_insert_packed = jax.jit(_insert_and_pack, donate_argnums=(1,))


def insert(
    spec: ParetoSpec,
    state: ParetoState,
    island: jax.Array | int,
    descriptor: jax.Array,
    objectives: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> tuple[ParetoState, InsertResult]:
    """Inserts a batch from the host; ``state`` is donated. Args as :func:`insert_batch`
    (``island`` may be a scalar, ``valid`` defaults to all True); the batch is padded
    to :func:`qd.archive.cells.padded_size` so batches share compilations. Results are
    host arrays of length B."""
    values = np.asarray(objectives, np.float32).reshape(len(np.atleast_1d(genome_id)), -1)
    n = values.shape[0]
    size = padded_size(n)

    def padded(x: Any, dtype: Any, fill: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
        x = np.broadcast_to(np.asarray(x, dtype), (n, *shape))
        out = np.full((size, *shape), fill, dtype)
        out[:n] = x
        return out

    batch = (
        padded(island, np.int32, 0),
        padded(np.asarray(descriptor, np.float32).reshape(n, -1), np.float32, 0.0, (spec.descriptor_dim,)),
        padded(values, np.float32, -np.inf, (values.shape[1],)),
        padded(genome_id, np.int32, EMPTY_ID),
        padded(True if valid is None else valid, np.bool_, False),
    )
    new_state, packed = _insert_packed(spec, state, *batch)
    return new_state, unpack_result(packed, n)


def rebuild(
    spec: ParetoSpec,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    objectives: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> ParetoState:
    """Fresh fronts holding the given candidates, in one insert (a run read back from
    its store). Without truncation (no front over K) the result does not depend on how
    the candidates were batched; a truncated front equals a single-batch history."""
    return insert(spec, init(spec, islands), island, descriptor, objectives, genome_id, valid)[0]


@functools.partial(jax.jit, static_argnums=(3, 4), donate_argnums=(1,))
def migrate(
    spec: ParetoSpec, state: ParetoState, key: jax.Array, topology: str, k: int
) -> tuple[ParetoState, InsertResult]:
    """Copies each island's ``k`` members with the largest first objective to its targets
    (``qd.archive.TOPOLOGIES``), through the ordinary insert: a migrant joins the front
    of its own cell there, or not. Results ordered source island, target, rank."""
    check_topology(topology)
    num_islands, num_cells, front, _ = state.objectives.shape
    targets = island_targets(key, num_islands, topology)  # [I, T]
    num_targets = targets.shape[1]
    first = jnp.where(state.genome_id >= 0, state.objectives[..., 0], -jnp.inf).reshape(num_islands, -1)
    _, slot = jax.lax.top_k(first, k)  # [I, k] over cells * front
    source = jnp.arange(num_islands)[:, None]

    def fan_out(x: jax.Array) -> jax.Array:
        x = jnp.broadcast_to(x[:, None], (num_islands, num_targets, *x.shape[1:]))
        return x.reshape(-1, *x.shape[3:])

    def pick(x: jax.Array) -> jax.Array:
        return fan_out(x.reshape(num_islands, num_cells * front, *x.shape[3:])[source, slot])

    genome_id = pick(state.genome_id)
    island = jnp.broadcast_to(targets[:, :, None], (num_islands, num_targets, k)).reshape(-1)
    return insert_batch(
        spec,
        state,
        island.astype(jnp.int32),
        pick(state.descriptor),
        pick(state.objectives),
        genome_id,
        genome_id >= 0,
    )
