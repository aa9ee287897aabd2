"""Parent and inspiration selection over the archive: jitted, deterministic for a key.

A proposal picks ``n`` parents on one island (:func:`parents`), then, for each
parent, ``m`` inspirations (:func:`inspirations`). Both return (island, cell)
addresses, which is what the loop's host genome table needs.

Parent rules draw with replacement among the island's filled cells, with
weights ``w ** (1 / temperature)`` (temperature -> 0: greedy, -> inf: uniform):

* ``uniform``: w = 1.
* ``fitness``: w = the elite's fitness rank on its island (1 = worst; ties share
  the lower rank). Ranks, not ``fitness - min + eps``: the latter gives the
  worst elite (still the best of its niche) weight ~0, lets one outlier take
  nearly every pick, and changes with the fitness's offset and units; ranks are
  invariant to any increasing transform, so one temperature means the same on
  every task. At temperature 1 the best elite is K times as likely as the worst.
* ``curiosity``: w = exp(score), i.e. a softmax of score / temperature, with
  :class:`Curiosity` scores (Cully & Demiris 2017).
* ``novelty``: w = the elite's mean distance to its ``k`` nearest other elites of
  the island. Exact when the island holds at most ``NOVELTY_POOL`` elites;
  beyond that, sampling-importance-resampling: the picks are drawn by weight from
  ``NOVELTY_POOL`` elites drawn uniformly, so the k-NN search costs
  O(NOVELTY_POOL * C * D) rather than O(C^2 * D) (at C = 10,000 on CPU, tens of
  milliseconds instead of a third of a second). Probabilities are then
  approximately proportional; an elite more novel than ~NOVELTY_POOL times the
  average is damped (it can take no more picks than the pools it is drawn into).
* ``pareto``, ``hypervolume``, ``instance``: by the objectives and per-row scores of the
  elites (``qd.search.criteria``), which they need as ``scores``.

Inspiration rules give each parent ``m`` distinct elites, never the parent
itself; an entry that cannot be filled (too few elites) is (-1, -1):

* ``uniform``: other elites of the parent's island, uniformly.
* ``top``: the island's best elites (fitness order, ties to the lower cell),
  skipping the parent's cell. Needs no randomness.
* ``distant``: other elites of the island drawn proportionally to their
  descriptor distance from the parent, without replacement (successive
  sampling). Proportional rather than the farthest, which would hand every
  parent the same few extreme elites. A parent whose cell is empty gets none.
* ``islands``: elites of the other islands, uniformly; with one island, as
  ``uniform``.
* ``complement``: the elites best where the parent is weak (``qd.search.criteria``).

:func:`wave` draws both for a whole wave of proposals in one jitted dispatch (vmapped
over them): what each proposal gets is exactly what :func:`parents` and
:func:`inspirations` give for its keys, at a fraction of the host's cost per proposal.
:func:`wave_uniform` draws the ``uniform`` rules on the host with numpy instead: the
same distributions, from a numpy generator, at no dispatch at all (a jitted dispatch
costs the loop ~0.1-0.2 ms of CPU; numpy on a few hundred cells, microseconds).

Cost for C cells, I islands, n parents, m inspirations: parents O(C + n log C)
(cumulative weights and a binary search), plus a sort for ``fitness`` and the k-NN
above for ``novelty``; inspirations O(n m^2 + I C) for the uniform rules (Floyd's
sampling of distinct ranks, no [n, C] draw), O(C) for ``top``, and O(n C D) for
``distant`` (one [n, D] x [D, C] product, no [n, C, D] difference).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qd.archive.novelty import _NO_GROUP, _mean_present, knn
from qd.archive.select import _check_island
from qd.archive.state import ArchiveState
from qd.search import criteria
from qd.search.criteria import Scores

PARENT_RULES = ("uniform", "fitness", "curiosity", "novelty", *criteria.PARENT_RULES)
INSPIRATION_RULES = ("uniform", "top", "distant", "islands", *criteria.INSPIRATION_RULES)

NOVELTY_POOL = 256  # elites scored per novelty pick (all of them when fewer)

# Cully & Demiris 2017: a parent's score rises when its child enters the archive.
CURIOSITY_SUCCESS, CURIOSITY_FAILURE = 1.0, -0.5


# -------------------------------------------------------------------- curiosity


class Curiosity(NamedTuple):
    """Curiosity scores of the elites (Cully & Demiris 2017).

    The score belongs to the elite now in the cell, as in the paper where it is
    an individual's: :func:`curiosity_reset` restarts it at 0 whenever a new
    genome takes the cell (improvement, new cell, migrant). Otherwise a cell
    would keep attracting picks for a predecessor's fertility, and cells emptied
    by an island reset would hand stale scores to unrelated newcomers. A parent
    replaced by its own child therefore passes nothing on: its child starts at 0.

    Attributes:
        score: f32[I, C]; meaningless where the cell is empty.
    """

    score: jax.Array


def curiosity_init(num_islands: int, num_cells: int) -> Curiosity:
    """All scores 0: the curiosity rule starts uniform. Also after a rebuild (cells move)."""
    return Curiosity(jnp.zeros((num_islands, num_cells), jnp.float32))


def _flat_cell(score: jax.Array, island: jax.Array, cell: jax.Array, ok: jax.Array) -> jax.Array:
    """i32[B]: island * C + cell, or I * C (dropped by a scatter) where not ``ok``
    or out of range."""
    num_islands, num_cells = score.shape
    ok = ok & (island >= 0) & (island < num_islands) & (cell >= 0) & (cell < num_cells)
    return jnp.where(ok, island * num_cells + cell, num_islands * num_cells)


@jax.jit
def curiosity_update(
    cur: Curiosity, island: jax.Array, cell: jax.Array, added: jax.Array, valid: jax.Array
) -> Curiosity:
    """Credits the parents of a batch of children: +1 to a parent whose child
    entered the archive, -0.5 to one whose child did not.

    Args:
        cur: the scores.
        island, cell: i32[B]; each child's parent (a child with several parents
            appears once per parent). Repeated parents add up.
        added: bool[B]; the child entered the archive (``InsertResult.is_elite``).
        valid: bool[B]; False for padding, and for a parent no longer in its cell
            (compare the cell's genome id with the parent's), whose credit would
            otherwise go to its successor.
    """
    delta = jnp.where(added, CURIOSITY_SUCCESS, CURIOSITY_FAILURE)
    flat = _flat_cell(cur.score, island, cell, valid)
    score = cur.score.reshape(-1).at[flat].add(delta, mode="drop")
    return Curiosity(score.reshape(cur.score.shape))


@jax.jit
def curiosity_reset(cur: Curiosity, island: jax.Array, cell: jax.Array, entered: jax.Array) -> Curiosity:
    """Restarts at 0 the cells a new genome entered (island, cell i32[B]; entered
    bool[B], e.g. ``InsertResult.is_elite``, from inserts and migrations alike).

    Apply after :func:`curiosity_update` for the same batch.
    """
    flat = _flat_cell(cur.score, island, cell, entered)
    score = cur.score.reshape(-1).at[flat].set(0.0, mode="drop")
    return Curiosity(score.reshape(cur.score.shape))


# ---------------------------------------------------------------------- helpers


def _nth(counts: jax.Array, rank: jax.Array) -> jax.Array:
    """Index of the rank-th (0-based) counted entry, given counts = cumsum(mask) i32[N]."""
    index = jnp.searchsorted(counts, rank, side="right")
    return jnp.minimum(index, counts.shape[0] - 1).astype(jnp.int32)


def _draw(
    key: jax.Array, log_weight: jax.Array, valid: jax.Array, n: int, temperature: jax.Array
) -> jax.Array:
    """i32[n]: indices drawn with replacement, P(i) ∝ exp(log_weight[i] / temperature)
    over the ``valid`` entries (bool[N]); meaningless when none is valid.

    O(N + n log N): cumulative weights and a binary search, no [n, N] temporary.
    The binary searches here use the default while-loop: "scan_unrolled" saves
    ~0.1 ms per call at these sizes but takes seconds longer to compile.
    """
    top = jnp.max(jnp.where(valid, log_weight, -jnp.inf))
    weight = jnp.where(valid, jnp.exp((log_weight - top) / temperature), 0.0)
    cum = jnp.cumsum(weight)
    total = cum[-1]
    draw = jax.random.uniform(key, (n,)) * total
    index = jnp.searchsorted(cum, draw, side="right")
    # A draw rounded up to the total would land past the last weighted entry.
    last = jnp.argmax(cum >= total)
    return jnp.minimum(index, last).astype(jnp.int32)


def _distinct(key: jax.Array, count: jax.Array, m: int) -> jax.Array:
    """i32[n, m]: per row, m distinct ranks in [0, count) (count i32[n]), a uniformly
    random subset in random order; when count < m, all of them and then -1s.

    Floyd's algorithm: O(n m^2), whatever the count.
    """
    n = count.shape[0]
    draw_key, shuffle_key = jax.random.split(key)
    uniform = jax.random.uniform(draw_key, (n, m))
    chosen = jnp.full((n, m), -1, jnp.int32)
    for j in range(m):
        # Draw t in [0, hi]; if it was already taken, take hi (new by construction).
        hi = count - m + j
        t = jnp.minimum((uniform[:, j] * (hi + 1)).astype(jnp.int32), hi)
        taken = jnp.any(chosen == t[:, None], axis=1)
        chosen = chosen.at[:, j].set(jnp.where(taken, hi, t))
    slots = jnp.arange(m, dtype=jnp.int32)
    chosen = jnp.where((count >= m)[:, None], chosen, jnp.where(slots < count[:, None], slots, -1))
    shuffle = jnp.where(chosen >= 0, jax.random.uniform(shuffle_key, (n, m)), 2.0)
    return jnp.take_along_axis(chosen, jnp.argsort(shuffle, axis=1), axis=1)


def _parent_rank(filled: jax.Array, counts: jax.Array, parent_cell: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For parent cells i32[n] (any value): bool[n] the parent's cell is filled, and
    i32[n] its rank among the filled cells."""
    cell = jnp.clip(parent_cell, 0, filled.shape[0] - 1)
    has = (parent_cell >= 0) & (parent_cell < filled.shape[0]) & filled[cell]
    return has, counts[cell] - 1


# ---------------------------------------------------------------------- parents


def _rank_log_weight(fitness: jax.Array, filled: jax.Array) -> jax.Array:
    """f32[C]: log of each filled cell's fitness rank among the filled (1 = worst)."""
    fitness = jnp.where(filled, fitness, -jnp.inf)
    empty = fitness.shape[0] - jnp.sum(filled)
    below = jnp.searchsorted(jnp.sort(fitness), fitness, side="left") - empty
    return jnp.log(jnp.maximum(below + 1, 1).astype(jnp.float32))


def _novelty_pool(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array,
    filled: jax.Array,
    counts: jax.Array,
    k: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The novelty rule's candidates: cell i32[P], valid bool[P] and log novelty f32[P].

    P = min(NOVELTY_POOL, C) cells: every filled cell once if they fit, else
    uniform draws with replacement.
    """
    num_cells = state.num_cells
    size = min(NOVELTY_POOL, num_cells)
    total = counts[-1]
    spread = jnp.arange(size, dtype=jnp.int32)
    rank = jnp.where(total <= size, spread, jax.random.randint(key, (size,), 0, jnp.maximum(total, 1)))
    valid = rank < total
    cell = _nth(counts, rank)
    descriptor = state.descriptor[island]
    # k + 1 neighbours, then drop the query's own cell.
    dist, index = knn(
        descriptor[cell],
        jnp.where(valid, 0, _NO_GROUP).astype(jnp.int32),
        descriptor,
        jnp.where(filled, 0, -1).astype(jnp.int32),
        k + 1,
    )
    dist = jnp.sort(jnp.where(index == cell[:, None], jnp.inf, dist), axis=1)[:, :k]
    novelty = _mean_present(dist)
    # A lone elite (+inf) or duplicates (0) keep a positive weight: never -inf/nan.
    novelty = jnp.where(jnp.isfinite(novelty), novelty, 1.0)
    tiny = jnp.finfo(jnp.float32).tiny
    return cell, valid, jnp.log(jnp.maximum(novelty, tiny))


def parents(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array | int,
    n: int,
    rule: str,
    curiosity: Curiosity | None = None,
    temperature: float | jax.Array = 1.0,
    k: int = 15,
    scores: Scores | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Draws ``n`` parents among the filled cells of ``island``, with replacement.

    Args:
        rule: one of PARENT_RULES (see the module docstring); ``curiosity`` needs
            ``curiosity``, the rules of ``qd.search.criteria`` its ``scores``.
        temperature: > 0; weights are raised to 1 / temperature (no effect on
            ``uniform``).
        k: neighbours in the ``novelty`` rule's score.
    Returns:
        genome_id i32[n] and cell i32[n]; both -1 everywhere if the island is empty.
    """
    _check_island(state, island)
    _check_parent_rule(rule, curiosity, temperature, k, scores)
    score = curiosity.score if rule == "curiosity" else None
    return _parents(state, key, island, n, rule, score, jnp.float32(temperature), k, scores)


def _check_parent_rule(
    rule: str, curiosity: Curiosity | None, temperature: float | jax.Array, k: int, scores: Scores | None
) -> None:
    if rule not in PARENT_RULES:
        raise ValueError(f"parent rule {rule!r} is not one of {PARENT_RULES}")
    if rule == "curiosity" and curiosity is None:
        raise ValueError("the curiosity rule needs a Curiosity state")
    if rule in criteria.PARENT_RULES and scores is None:
        raise ValueError(f"the {rule} rule needs the elites' Scores (qd.search.criteria.scores_of)")
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


@functools.partial(jax.jit, static_argnames=("n", "rule", "k"))
def _parents(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array | int,
    n: int,
    rule: str,
    score: jax.Array | None,
    temperature: jax.Array,
    k: int,
    scores: Scores | None = None,
) -> tuple[jax.Array, jax.Array]:
    filled = state.genome_id[island] >= 0
    pool_key, draw_key = jax.random.split(key)
    if rule in criteria.PARENT_RULES:
        log_weight, eligible = criteria.parent_weights(rule, scores, island, filled)
        cell = _draw(draw_key, log_weight, eligible, n, temperature)
    elif rule == "novelty":
        counts = jnp.cumsum(filled.astype(jnp.int32))
        pool, valid, log_weight = _novelty_pool(state, pool_key, island, filled, counts, k)
        cell = pool[_draw(draw_key, log_weight, valid, n, temperature)]
    else:
        if rule == "uniform":
            log_weight = jnp.zeros(filled.shape, jnp.float32)
        elif rule == "fitness":
            log_weight = _rank_log_weight(state.fitness[island], filled)
        else:
            log_weight = score[island]
        cell = _draw(draw_key, log_weight, filled, n, temperature)
    any_filled = jnp.any(filled)
    cell = jnp.where(any_filled, cell, -1)
    genome_id = jnp.where(any_filled, state.genome_id[island, jnp.maximum(cell, 0)], -1)
    return genome_id, cell


# ----------------------------------------------------------------- inspirations


def inspirations(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array | int,
    parent_cell: jax.Array,
    m: int,
    rule: str,
    scores: Scores | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``m`` distinct inspirations for each of ``n`` parents of ``island``.

    Args:
        parent_cell: i32[n], the parents' cells on ``island`` (-1: no parent; then
            nothing is excluded, and ``distant`` and ``complement`` give none).
        rule: one of INSPIRATION_RULES (see the module docstring); ``complement``
            needs ``scores``.
    Returns:
        island i32[n, m] and cell i32[n, m]; both -1 where there are not enough
        elites. Never the parent itself; the filled entries come first.
    """
    _check_island(state, island)
    _check_inspiration_rule(rule, scores)
    return _inspirations(state, key, island, jnp.asarray(parent_cell, jnp.int32), m, rule, scores)


def _check_inspiration_rule(rule: str, scores: Scores | None) -> None:
    if rule not in INSPIRATION_RULES:
        raise ValueError(f"inspiration rule {rule!r} is not one of {INSPIRATION_RULES}")
    if rule in criteria.INSPIRATION_RULES and scores is None:
        raise ValueError(f"the {rule} rule needs the elites' Scores (qd.search.criteria.scores_of)")


@functools.partial(jax.jit, static_argnames=("m", "rule"))
def _inspirations(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array | int,
    parent_cell: jax.Array,
    m: int,
    rule: str,
    scores: Scores | None = None,
) -> tuple[jax.Array, jax.Array]:
    n = parent_cell.shape[0]
    num_islands, num_cells = state.genome_id.shape
    filled = state.genome_id[island] >= 0
    counts = jnp.cumsum(filled.astype(jnp.int32))
    has_parent, parent_rank = _parent_rank(filled, counts, parent_cell)
    if rule == "islands" and num_islands > 1:
        other = (state.genome_id >= 0) & (jnp.arange(num_islands)[:, None] != island)
        flat_counts = jnp.cumsum(other.reshape(-1).astype(jnp.int32))
        rank = _distinct(key, jnp.broadcast_to(flat_counts[-1], (n,)), m)
        flat = _nth(flat_counts, rank)
        ok = rank >= 0
        return jnp.where(ok, flat // num_cells, -1), jnp.where(ok, flat % num_cells, -1)
    if rule in ("uniform", "islands"):
        rank = _distinct(key, counts[-1] - has_parent.astype(jnp.int32), m)
        skip = has_parent[:, None] & (rank >= parent_rank[:, None])  # ranks past the parent's
        rank = rank + skip.astype(jnp.int32)
        cell = jnp.where(rank >= 0, _nth(counts, rank), -1)
    elif rule == "complement":
        cell = criteria.complement(scores, island, filled, parent_cell, m)
    elif rule == "top":
        size = min(m + 1, num_cells)
        _, best = lax.top_k(jnp.where(filled, state.fitness[island], -jnp.inf), size)
        is_parent = best[None, :] == parent_cell[:, None]  # [n, size]
        at = jnp.where(jnp.any(is_parent, axis=1), jnp.argmax(is_parent, axis=1), size)
        source = jnp.arange(m)[None, :]
        source = source + (source >= at[:, None]).astype(jnp.int32)  # [n, m], skipping the parent
        pick = best[jnp.minimum(source, size - 1)]
        cell = jnp.where((source < size) & filled[pick], pick, -1)
    else:  # distant
        cell = _distant(state, key, island, filled, has_parent, parent_cell, m)
    cell = cell.astype(jnp.int32)
    return jnp.where(cell >= 0, jnp.asarray(island, jnp.int32), -1), cell


def _distant(
    state: ArchiveState,
    key: jax.Array,
    island: jax.Array | int,
    filled: jax.Array,
    has_parent: jax.Array,
    parent_cell: jax.Array,
    m: int,
) -> jax.Array:
    """i32[n, m]: cells drawn ∝ distance from each parent, without replacement
    (Gumbel top-m over [n, C]); -1 beyond the available elites."""
    num_cells = state.num_cells
    descriptor = state.descriptor[island]  # [C, D]
    # Centred on the elites' mean, so the expanded |p - s|^2 rounds with their spread.
    centre = (filled.astype(jnp.float32) @ descriptor) / jnp.maximum(jnp.sum(filled), 1)
    s = jnp.where(filled[:, None], descriptor - centre, 0.0)
    p = s[jnp.clip(parent_cell, 0, num_cells - 1)]  # [n, D]
    d2 = jnp.sum(p * p, 1)[:, None] + jnp.sum(s * s, 1)[None, :] - 2.0 * (p @ s.T)  # [n, C]
    # Zero distance: a tiny weight, in practice drawn after every farther elite.
    log_weight = 0.5 * jnp.log(jnp.maximum(d2, jnp.finfo(jnp.float32).tiny))
    available = (
        filled[None, :] & has_parent[:, None] & (jnp.arange(num_cells)[None, :] != parent_cell[:, None])
    )
    race = jnp.where(available, log_weight + jax.random.gumbel(key, d2.shape), -jnp.inf)
    _, pick = lax.top_k(race, min(m, num_cells))
    cell = jnp.where(jnp.take_along_axis(available, pick, axis=1), pick, -1)
    return jnp.pad(cell, ((0, 0), (0, m - cell.shape[1])), constant_values=-1)


# ------------------------------------------------------------------------- waves


class Picks(NamedTuple):
    """Parents and inspirations of R proposals of up to ``children`` children each.

    Attributes:
        genome_id, cell: i32[R, children * max_parents]; the parents (-1 on an empty island).
        source, spot: i32[R, children, m]; island and cell of each child's inspirations
            (those of its first parent; -1 where none).
    """

    genome_id: jax.Array
    cell: jax.Array
    source: jax.Array
    spot: jax.Array


def wave(
    state: ArchiveState,
    parent_key: jax.Array,
    inspire_key: jax.Array,
    island: jax.Array,
    num_parents: jax.Array,
    children: int,
    max_parents: int,
    rule: str,
    curiosity: Curiosity | None = None,
    temperature: float = 1.0,
    k: int = 15,
    m: int = 0,
    inspiration_rule: str = "uniform",
    scores: Scores | None = None,
) -> Picks:
    """:func:`parents` and :func:`inspirations` for R proposals in one dispatch.

    Row r is proposal r's: ``children * max_parents`` parents drawn with
    ``parent_key[r]`` on ``island[r]`` (a proposal whose operator takes
    ``num_parents[r] < max_parents`` uses the first ``children * num_parents[r]``:
    draws with replacement, so a prefix is a draw of its own), then ``m``
    inspirations per child, drawn with ``inspire_key[r]`` for the child's first
    parent, ``cell[r, j * num_parents[r]]`` (an operator that shows fewer uses the
    first ones: they come in random order, or best first for ``top``). Each row
    equals the unbatched call with its keys (but for ``complement``, which also gives
    each child's later parents: the complements of its first, crossover's partner):
    which rows share a wave never matters.

    Args:
        parent_key, inspire_key: keys [R]; island, num_parents: i32[R].
        Others as in :func:`parents` and :func:`inspirations` (``m`` = 0: none).
    """
    islands = np.asarray(island)
    if islands.size and not (0 <= islands.min() and islands.max() < state.num_islands):
        raise ValueError(f"islands {islands.tolist()} are out of range for {state.num_islands} islands")
    if m or (max_parents > 1 and inspiration_rule in criteria.INSPIRATION_RULES):
        _check_inspiration_rule(inspiration_rule, scores)
    _check_parent_rule(rule, curiosity, temperature, k, scores)
    return _wave(
        state,
        parent_key,
        inspire_key,
        islands.astype(np.int32),
        np.asarray(num_parents, np.int32),
        curiosity.score if rule == "curiosity" else None,
        np.float32(temperature),
        children,
        max_parents,
        rule,
        k,
        m,
        inspiration_rule,
        scores,
    )


@functools.partial(jax.jit, static_argnames=("children", "max_parents", "rule", "k", "m", "inspiration_rule"))
def _wave(
    state: ArchiveState,
    parent_key: jax.Array,
    inspire_key: jax.Array,
    island: jax.Array,
    num_parents: jax.Array,
    score: jax.Array | None,
    temperature: jax.Array,
    children: int,
    max_parents: int,
    rule: str,
    k: int,
    m: int,
    inspiration_rule: str,
    scores: Scores | None,
) -> Picks:
    def one(
        parent_key: jax.Array, inspire_key: jax.Array, island: jax.Array, num_parents: jax.Array
    ) -> Picks:
        genome_id, cell = _parents(
            state, parent_key, island, children * max_parents, rule, score, temperature, k, scores
        )
        if inspiration_rule in criteria.INSPIRATION_RULES and max_parents > 1:
            slot_ids = state.genome_id[island]
            genome_id, cell = criteria.with_partners(
                scores, island, genome_id, cell, slot_ids, num_parents, children
            )
        first = cell[jnp.arange(children) * num_parents]
        if m:
            source, spot = _inspirations(state, inspire_key, island, first, m, inspiration_rule, scores)
        else:
            source = spot = jnp.zeros((children, 0), jnp.int32)
        return Picks(genome_id, cell, source, spot)

    return jax.vmap(one)(parent_key, inspire_key, island, num_parents)


def wave_uniform(
    genome_id: np.ndarray,
    rng: np.random.Generator,
    island: np.ndarray,
    num_parents: np.ndarray,
    children: int,
    max_parents: int,
    m: int,
) -> Picks:
    """:func:`wave` for the ``uniform`` parent and inspiration rules, on the host.

    Same shapes and distributions as :func:`wave` (parents uniform with replacement
    among the island's filled cells; ``m`` distinct other elites of the island per
    child, in random order, -1 beyond those there are), drawn from ``rng`` island by
    island, so a wave is a pure function of the generator and ``genome_id`` (i64[I, C],
    the archive's, read on the host).
    """
    rows, n = len(island), children * max_parents
    cell, ids = np.full((rows, n), -1, np.int64), np.full((rows, n), -1, np.int64)
    source, spot = np.full((rows, children, m), -1, np.int64), np.full((rows, children, m), -1, np.int64)
    for i in sorted(set(island.tolist())):
        at, pool = np.flatnonzero(island == i), np.flatnonzero(genome_id[i] >= 0)
        if not len(pool):
            continue
        cell[at] = pool[rng.integers(len(pool), size=(len(at), n))]
        ids[at] = genome_id[i, cell[at]]
        for r in at if m else ():
            step = num_parents[r]
            for j, first in enumerate(cell[r, : children * step : step]):
                others = pool[pool != first]
                picked = rng.choice(others, min(m, len(others)), replace=False)
                source[r, j, : len(picked)], spot[r, j, : len(picked)] = i, picked
    return Picks(ids, cell, source, spot)
