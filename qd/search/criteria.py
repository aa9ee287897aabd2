"""Selection by many criteria: the parent rules ``pareto``, ``hypervolume`` and ``instance``
and the inspiration rule ``complement`` (``qd.search.select`` draws with them).

One fitness ranks elites on one axis; these rules read what a candidate reports beside it,
as :class:`Scores`, one entry per archive *slot*: a cell of a grid or CVT archive holds one
slot, a cell of a Pareto archive (``qd.archive.pareto``) a front of K, so the slots of an
island are ``[C, K]`` and a flat slot index is ``cell * K + k``.

* ``pareto``: uniform over the union of the island's fronts: every filled slot that no
  other slot of its cell dominates (a Pareto archive keeps only those; with one slot per
  cell, every elite).
* ``hypervolume``: weighted by each member's exclusive hypervolume contribution to its
  cell's front (the volume only it dominates, above the reference point), so members in
  sparse, extreme parts of a front are drawn more often than crowded ones.
* ``instance``: GEPA's rule (Agrawal et al. 2025). A candidate is eligible iff it is best,
  ties included, on at least one validation row among the island's elites, weighted by how
  many such rows; so an elite that alone solves a few rows survives as a parent beside the
  best on average, and complementary candidates stay available to merge.
* ``complement`` (inspirations): for each parent, the elites best where it is weak: with
  per-row scores, the largest sum over validation rows of ``max(0, other - parent)``;
  without, the largest value on the objective where the parent is worst (each objective
  scaled to its range on the island). Ties go to the lower slot.

A rule whose eligible set is empty on an island (no elite with per-row scores, every
contribution zero) draws uniformly among its elites, so a run never stalls for lack of
scores. :func:`scores_of` builds the scores on the host from the archive and the elites'
stored metrics (``validation_scores``, the task's objectives); the draws are jitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qd.archive.hypervolume import contributions, derived_reference
from qd.archive.slots import Slots
from qd.task import objective_matrix

PARENT_RULES = ("pareto", "hypervolume", "instance")
INSPIRATION_RULES = ("complement",)
ROWS = "validation_scores"  # the metric holding a candidate's score per validation row


class Scores(NamedTuple):
    """What the rules of this module read, per slot (see the module doc).

    Attributes:
        objectives: f32[I, C, K, M], maximised (``qd.task.objective_matrix``); NaN where empty.
        contribution: f32[I, C, K], each member's exclusive hypervolume contribution to its
            cell's front (0 where empty, or not needed).
        rows: f32[I, C, K, R], the score on each validation row; NaN where unknown (R may be 0).
    """

    objectives: jax.Array
    contribution: jax.Array
    rows: jax.Array


def needs_scores(parents: str, inspirations: str) -> bool:
    """Whether a draw with these rules reads :class:`Scores`."""
    return parents in PARENT_RULES or inspirations in INSPIRATION_RULES


# ------------------------------------------------------------------------- jitted


def parent_weights(
    rule: str, scores: Scores, island: jax.Array, filled: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The log weight f32[S] and eligibility bool[S] of each slot of ``island`` under ``rule``
    (``filled`` bool[S]: the slots holding an elite); every filled slot, uniformly, where the
    rule leaves none eligible."""
    objectives = scores.objectives[island]  # [C, K, M]
    cells, size = objectives.shape[:2]
    if rule == "pareto":
        mine = filled.reshape(cells, size)
        at_least = jnp.all(objectives[:, :, None] >= objectives[:, None, :], axis=-1)  # [C, K(t), K(s)]
        above = jnp.any(objectives[:, :, None] > objectives[:, None, :], axis=-1)
        dominated = jnp.any(mine[:, :, None] & at_least & above, axis=1).reshape(-1)
        weight, eligible = jnp.ones_like(dominated, jnp.float32), filled & ~dominated
    elif rule == "hypervolume":
        weight = scores.contribution[island].reshape(-1)
        eligible = filled & (weight > 0)
    else:  # instance
        weight = _rows_won(scores.rows[island].reshape(cells * size, -1), filled)
        eligible = weight > 0
    none = ~jnp.any(eligible)
    tiny = jnp.finfo(jnp.float32).tiny
    log_weight = jnp.where(none, 0.0, jnp.log(jnp.maximum(weight, tiny)))
    return log_weight, jnp.where(none, filled, eligible)


def _rows_won(rows: jax.Array, filled: jax.Array) -> jax.Array:
    """f32[S]: on how many rows (columns of f32[S, R]) each filled slot is best among the
    filled, ties included; rows nobody scored count for nobody."""
    known = filled[:, None] & jnp.isfinite(rows)
    best = jnp.max(jnp.where(known, rows, -jnp.inf), axis=0)
    return jnp.sum(known & (rows >= best[None, :]), axis=1).astype(jnp.float32)


def complement(
    scores: Scores, island: jax.Array, filled: jax.Array, parent_slot: jax.Array, m: int
) -> jax.Array:
    """i32[n, m]: for each parent slot (i32[n]; -1: none, then no partner), the ``m`` other
    filled slots best where it is weak (see the module doc), best first; -1 beyond them."""
    objectives = scores.objectives[island]
    num_slots = filled.shape[0]
    rows = scores.rows[island].reshape(num_slots, -1)  # [S, R]
    has_parent = (parent_slot >= 0) & (parent_slot < num_slots)
    parent = jnp.clip(parent_slot, 0, num_slots - 1)
    own = rows[parent]  # [n, R]
    by_rows = jnp.sum(jnp.maximum(jnp.nan_to_num(rows[None] - own[:, None], nan=0.0), 0.0), axis=2)
    value = objectives.reshape(num_slots, -1)  # [S, M]
    known = filled[:, None] & jnp.isfinite(value)
    lo = jnp.min(jnp.where(known, value, jnp.inf), axis=0)
    span = jnp.max(jnp.where(known, value, -jnp.inf), axis=0) - lo
    scaled = jnp.where(known, (value - lo) / jnp.where(span > 0, span, 1.0), 0.0)
    weakest = jnp.argmin(jnp.where(known[parent], scaled[parent], jnp.inf), axis=1)  # [n]
    by_objective = scaled[:, weakest].T - scaled[parent, weakest][:, None]  # [n, S]
    gain = jnp.where(jnp.any(jnp.isfinite(own), axis=1)[:, None], by_rows, by_objective)
    available = (
        filled[None, :] & has_parent[:, None] & (jnp.arange(num_slots)[None, :] != parent_slot[:, None])
    )
    _, pick = lax.top_k(jnp.where(available, gain, -jnp.inf), min(m, num_slots))
    slot = jnp.where(jnp.take_along_axis(available, pick, axis=1), pick, -1)
    return jnp.pad(slot, ((0, 0), (0, m - slot.shape[1])), constant_values=-1).astype(jnp.int32)


def with_partners(
    scores: Scores,
    island: jax.Array,
    genome_id: jax.Array,
    cell: jax.Array,
    slot_ids: jax.Array,
    num_parents: jax.Array,
    children: int,
) -> tuple[jax.Array, jax.Array]:
    """A wave row's parents (genome_id, cell i32[children * max_parents]; child j's are the
    ``num_parents`` from ``j * num_parents``) with each child's later parents replaced by the
    complements of its first (:func:`complement`, best first): crossover's second parent is the
    elite best where the first is weak. Where there is none (a lone elite), the drawn one stays.
    ``slot_ids`` i32[S]: the island's genome id per slot."""
    width = cell.shape[0] // children
    filled = slot_ids >= 0
    position = jnp.arange(cell.shape[0])
    child, rank = position // num_parents, position % num_parents
    first = cell[jnp.minimum(child, children - 1) * num_parents]
    partner = complement(scores, island, filled, first, max(width - 1, 1))  # [n, width - 1]
    pick = partner[position, jnp.maximum(rank - 1, 0)]
    use = (rank >= 1) & (child < children) & (pick >= 0)
    return jnp.where(use, slot_ids[jnp.maximum(pick, 0)], genome_id), jnp.where(use, pick, cell)


# --------------------------------------------------------------------------- host


def scores_of(
    slots: Slots,
    elites: np.ndarray | None,
    objectives: Sequence[tuple[str, str]],
    reference: Sequence[float] | None,
    rule: str,
) -> Scores:
    """The :class:`Scores` of an archive, on the host.

    Args:
        slots: the archive's elites by slot (``qd.archive.slots_of``): a Pareto archive's
            carry their objectives, a cell archive's (one slot per cell) their fitness.
        elites: object[I, S] of the elites' stored candidates (``qd.elite_table``'s table
            of a text run), for their metrics; None for a numeric run.
        objectives: the task's named objectives (``qd.task.objectives_of``): a cell archive's
            elites are scored on them from their metrics; none: on their fitness alone.
        reference: the hypervolume reference point, each objective in its own units as the
            task reports it (None: derived from the elites, ``qd.archive.hypervolume``).
        rule: the parent rule drawn with (contributions are computed only for ``hypervolume``).
    """
    genome_id, cell = np.asarray(slots.elites.genome_id), np.asarray(slots.cell)
    num_cells = int(cell[-1]) + 1  # a cell's slots are consecutive, K of them
    filled = (genome_id >= 0).reshape(len(genome_id), num_cells, -1)  # [I, C, K]
    metrics = _metrics(elites, filled.size)
    if np.ndim(slots.values) == 3:  # a front's objectives
        values = np.asarray(slots.values, np.float32)
    elif objectives and elites is not None:
        values = objective_matrix(tuple(objectives), metrics)
    else:
        values = np.asarray(slots.values, np.float32)[..., None]
    values = values.reshape(*filled.shape, -1)
    values = np.where(filled[..., None], values, np.nan)
    contribution = np.zeros(filled.shape, np.float32)
    if rule == "hypervolume" and np.isfinite(values).all(axis=-1).any():
        signs = np.asarray([1.0 if d == "max" else -1.0 for _, d in objectives] or [1.0], np.float32)
        point = derived_reference(values) if reference is None else np.asarray(reference) * signs
        contribution = _contributions(values, point)
    rows = _rows(metrics, filled.shape) if elites is not None else np.zeros((*filled.shape, 0), np.float32)
    return Scores(jnp.asarray(values), jnp.asarray(contribution), jnp.asarray(rows))


def _contributions(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """f32[I, C, K]: each member's exclusive contribution to its cell's front."""
    out = np.zeros(values.shape[:-1], np.float32)
    for i, c in zip(*np.nonzero(np.any(np.all(np.isfinite(values), axis=-1), axis=-1))):
        members = np.flatnonzero(np.all(np.isfinite(values[i, c]), axis=-1))
        out[i, c, members] = contributions(values[i, c, members], reference)
    return out


def _metrics(elites: np.ndarray | None, size: int) -> list[dict | None]:
    """The elites' metrics, flat in slot order (None where empty or numeric)."""
    if elites is None or elites.dtype != object:
        return [None] * size
    return [getattr(e, "metrics", None) for e in elites.reshape(-1)]


def _rows(metrics: list[dict | None], shape: tuple[int, ...]) -> np.ndarray:
    """f32[I, C, K, R]: each elite's ``validation_scores`` (NaN where it has none)."""
    found = [m.get(ROWS) if isinstance(m, dict) else None for m in metrics]
    width = max((len(r) for r in found if isinstance(r, list)), default=0)
    rows = np.full((len(found), width), np.nan, np.float32)
    for j, r in enumerate(found):
        if isinstance(r, list) and len(r) == width:
            rows[j] = r
    return rows.reshape(*shape, width)
