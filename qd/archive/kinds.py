"""Insert and rebuild for any archive kind, through one table chosen per spec.

A kind is an :class:`ArchiveKind`, a NamedTuple of pure functions (as optax's
``GradientTransformation`` is a pair of them); :data:`KINDS` maps each spec type to
its kind, and :func:`kind_of` is the one lookup. The engine, islands and resume call
:func:`insert`, :func:`insert_batch` and :func:`rebuild` here and never ask which kind
of archive they have; a new kind is one entry in :data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from qd.archive import cells, novelty, pareto
from qd.archive import state as cell_state
from qd.archive.cells import InsertResult
from qd.archive.cvt import CVTSpec
from qd.archive.grid import GridSpec
from qd.archive.novelty import NoveltySpec
from qd.archive.pareto import ParetoSpec
from qd.archive.state import ArchiveState

Insert = Callable[..., tuple[ArchiveState, InsertResult]]


class ArchiveKind(NamedTuple):
    """The functions of one kind of archive; each takes the spec first.

    Attributes:
        insert: ``(spec, state, island, descriptor, fitness, genome_id, valid)`` ->
            ``(state, InsertResult)`` on the host: pads the batch, donates ``state``,
            returns host arrays (see :func:`qd.archive.cells.insert`).
        insert_batch: the same, traceable, for use inside other jitted code (no
            padding, no donation, ``valid`` required). A Pareto archive takes the
            maximised objectives f32[B, M] where the others take fitness f32[B].
        rebuild: ``(spec, islands, island, descriptor, fitness, genome_id, valid)`` ->
            a fresh state holding all given candidates.
        has_cells: a cell index names the same niche on every island (grid, CVT), so
            islands can be merged cell by cell (:func:`qd.archive.union_stats`) and a
            cell can be drawn; False for slots of an unstructured archive (novelty).
        init: ``(spec, islands)`` -> an empty state.
        reset: ``(state, island_mask)`` -> ``state`` with the masked islands emptied (jitted).
        objectives: the inserts take each candidate's maximised objectives f32[B, M]
            (``qd.task.objective_matrix``) in place of its fitness.
    """

    insert: Insert
    insert_batch: Insert
    rebuild: Callable[..., ArchiveState]
    has_cells: bool
    init: Callable[..., Any] = cell_state.init
    reset: Callable[..., Any] = cell_state.reset
    objectives: bool = False


CELLS = ArchiveKind(cells.insert, cells.insert_batch, cells.rebuild, has_cells=True)


def _novelty_insert(*args: Any) -> tuple[ArchiveState, InsertResult]:
    """:func:`qd.archive.novelty.novelty_insert` without its novelty scores."""
    return novelty.novelty_insert(*args)[:2]


def _novelty_insert_batch(*args: Any) -> tuple[ArchiveState, InsertResult]:
    """:func:`qd.archive.novelty.novelty_insert_batch` without its novelty scores."""
    return novelty.novelty_insert_batch(*args)[:2]


NOVELTY = ArchiveKind(_novelty_insert, _novelty_insert_batch, novelty.novelty_rebuild, has_cells=False)

PARETO = ArchiveKind(
    pareto.insert, pareto.insert_batch, pareto.rebuild, True, pareto.init, pareto.reset, objectives=True
)

# The kind of each spec type; a spec's kind is found by its type (or a base class's).
KINDS: dict[type, ArchiveKind] = {GridSpec: CELLS, CVTSpec: CELLS, NoveltySpec: NOVELTY, ParetoSpec: PARETO}


def kind_of(spec: Any) -> ArchiveKind:
    """The :class:`ArchiveKind` of ``spec``: its type's entry in :data:`KINDS`."""
    for cls in type(spec).__mro__:
        if cls in KINDS:
            return KINDS[cls]
    raise TypeError(f"{type(spec).__name__} is not an archive spec: no entry in qd.archive.kinds.KINDS")


def has_cells(spec: Any) -> bool:
    """Whether ``spec``'s cells are niches shared by all islands (see :class:`ArchiveKind`)."""
    return kind_of(spec).has_cells


def init(spec: Any, islands: int) -> Any:
    """An empty archive of ``spec``'s kind for ``islands`` islands."""
    return kind_of(spec).init(spec, islands)


def reset(spec: Any, state: Any, island_mask: Any) -> Any:
    """``state`` with the islands where ``island_mask`` (bool[I]) is True emptied."""
    return kind_of(spec).reset(state, island_mask)


def takes_objectives(spec: Any) -> bool:
    """Whether ``spec``'s inserts take objective vectors, not a fitness (see :class:`ArchiveKind`)."""
    return kind_of(spec).objectives


def insert(
    spec: Any,
    state: ArchiveState,
    island: jax.Array | int,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> tuple[ArchiveState, InsertResult]:
    """Inserts a batch into an archive of any kind; ``state`` is donated. Args and
    results as :func:`qd.archive.cells.insert`; CMA-MAE settings come from the spec."""
    return kind_of(spec).insert(spec, state, island, descriptor, fitness, genome_id, valid)


def insert_batch(
    spec: Any,
    state: ArchiveState,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array,
) -> tuple[ArchiveState, InsertResult]:
    """The traceable :func:`insert` (no padding, no donation), for use inside other
    jitted code: the kind is chosen at trace time."""
    return kind_of(spec).insert_batch(spec, state, island, descriptor, fitness, genome_id, valid)


def rebuild(
    spec: Any,
    islands: int,
    island: jax.Array,
    descriptor: jax.Array,
    fitness: jax.Array,
    genome_id: jax.Array,
    valid: jax.Array | None = None,
) -> ArchiveState:
    """A fresh archive holding all given candidates (see :func:`qd.archive.cells.rebuild`
    and :func:`qd.archive.novelty.novelty_rebuild`), its empty cells at the spec's
    ``threshold_min``."""
    return kind_of(spec).rebuild(spec, islands, island, descriptor, fitness, genome_id, valid)
