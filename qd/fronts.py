"""Reading a Pareto run's fronts: the hypervolume reference, each cell's front, their hypervolumes.

A Pareto archive (:mod:`qd.archive.pareto`) holds a front of up to K elites per cell and
no single fitness, so a run is read by hypervolume (:mod:`qd.archive.hypervolume`): per
cell, per island and in total (the sum over cells, MOME's "MOQD score"). Every place a
run is read -- the commit events, the end of a run, ``qd show``/``compare``'s summary,
``qd stats``, ``qd plot``, ``qd explore`` -- measures against the same reference, so
their numbers agree and the curve of one run is comparable from its first point to its
last.

The reference: the run's declared ``archive.reference`` (in each objective's own units,
as the task reports it; turned into the archive's maximised space by
:func:`qd.task.objective_matrix`, the one place directions are read), else derived once,
from the first fronts that hold a member (``derived_reference``: per objective, the
worst member minus a tenth of the range), and recorded in every commit event, where a
reader and a resumed run take it from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from qd.archive.hypervolume import derived_reference, front_hypervolumes
from qd.task import objective_matrix

EVENT_FIELD = "hypervolume"  # the commit events' field (``qd.events``)


def own_units(objectives: tuple[tuple[str, str], ...], values: Any) -> np.ndarray:
    """f64[..., M] maximised values in each objective's own units, or own units maximised:
    the sign flip of :func:`qd.task.objective_matrix` is its own inverse."""
    values = np.asarray(values, np.float64)
    names = [name for name, _ in objectives]
    flat = values.reshape(-1, len(names))
    signs = objective_matrix(objectives, [dict.fromkeys(names, 1.0)])[0].astype(np.float64)
    return (flat * signs).reshape(values.shape)


class Hypervolumes:
    """One run's hypervolume meter: the reference, fixed once, and readings of its fronts.

    Args:
        objectives: the task's (name, direction) pairs (``Geometry.objectives``).
        reference: the reference in the objectives' own units (declared, or the one an
            earlier reading recorded), or None to derive it from the first fronts read.
    """

    def __init__(self, objectives: tuple[tuple[str, str], ...], reference: Any = None):
        self.objectives = tuple(tuple(o) for o in objectives)
        self.reference = None if reference is None else own_units(self.objectives, reference)

    @classmethod
    def of_run(cls, objectives: tuple, declared: Any, events: list[dict[str, Any]]) -> Hypervolumes:
        """The meter of a run: its declared reference, else the one its commit events recorded."""
        if declared is None:
            declared = next(
                (e[EVENT_FIELD]["reference"] for e in events if e.get(EVENT_FIELD)),
                None,
            )
        return cls(objectives, declared)

    def cells(self, state: Any) -> np.ndarray | None:
        """f64[I, C]: each front's hypervolume (None while no front holds a member and no
        reference is declared); the first call with a member fixes a derived reference."""
        if self.reference is None:
            members = np.asarray(state.genome_id) >= 0
            if not members.any():
                return None
            self.reference = derived_reference(np.asarray(state.objectives)[members])
        return front_hypervolumes(state, self.reference)

    def reading(self, state: Any) -> dict[str, Any] | None:
        """The commit events' ``hypervolume`` field: ``total`` (summed over islands and
        cells), ``islands`` (per island), ``best`` and ``best_cell`` ([island, cell] of the
        largest front's hypervolume, the earlier on ties), ``front`` (that front's members:
        ``id`` and each objective's value by name, in own units) and ``reference`` (own units)."""
        volumes = self.cells(state)
        if volumes is None:
            return None
        island, cell = np.unravel_index(int(np.argmax(volumes)), volumes.shape)
        names = [name for name, _ in self.objectives]
        return {
            "total": float(volumes.sum()),
            "islands": [float(v) for v in volumes.sum(axis=1)],
            "best": float(volumes[island, cell]),
            "best_cell": [int(island), int(cell)],
            "front": [
                {"id": genome_id, **dict(zip(names, map(float, own_units(self.objectives, values))))}
                for genome_id, values in front(state, island, cell)
            ],
            "reference": [float(r) for r in own_units(self.objectives, self.reference)],
        }


def meter_in(run_dir: Path, objectives: tuple[tuple[str, str], ...]) -> Hypervolumes | None:
    """The meter of the run a build is starting or resuming in ``run_dir`` (None: its archive
    has no objectives): the reference its ``archive.json`` declares, else the one its events
    recorded before a resume, else derived from its first fronts."""
    if not objectives:
        return None
    from qd import events
    from qd.rundir.layout import EVENTS, GEOMETRY, Geometry

    g = Geometry.load(run_dir) if (run_dir / GEOMETRY).is_file() else None
    declared = (g.pareto or {}).get("reference") if g is not None else None
    written = events.read(run_dir / EVENTS) if (run_dir / EVENTS).is_file() else []
    return Hypervolumes.of_run(objectives, declared, written)


def of_run(run: Any) -> tuple[Any, Hypervolumes] | None:
    """A run directory's fronts now (``RunDir.fronts``) and its meter; None for an archive of
    one elite per cell."""
    g = run.geometry
    if g.pareto is None:
        return None
    return run.fronts(), Hypervolumes.of_run(g.objectives, g.pareto.get("reference"), run.events())


def reading_of(run: Any) -> dict[str, Any] | None:
    """:meth:`Hypervolumes.reading` of a run directory's fronts now, against the run's
    reference (None: one elite per cell, or no front holds a member yet)."""
    read = of_run(run)
    return None if read is None else read[1].reading(read[0])


def cell_rows(state: Any, volumes: np.ndarray) -> list[dict[str, Any]]:
    """Every front that holds a member, the largest hypervolume first (ties by island, cell):
    ``island``, ``cell``, ``members``, ``hypervolume`` (``qd stats``' table)."""
    members = (np.asarray(state.genome_id) >= 0).sum(axis=-1)
    island, cell = np.nonzero(members)
    order = np.lexsort((cell, island, -volumes[island, cell]))
    return [
        {
            "island": int(island[k]),
            "cell": int(cell[k]),
            "members": int(members[island[k], cell[k]]),
            "hypervolume": float(volumes[island[k], cell[k]]),
        }
        for k in order
    ]


class Members(NamedTuple):
    """Every front member of a ``ParetoState``, by island, cell and slot.

    Attributes:
        island, cell, id: i64[N] where each sits and its genome id.
        objectives: f64[N, M] maximised.
        descriptor: f32[N, D].
    """

    island: np.ndarray
    cell: np.ndarray
    id: np.ndarray
    objectives: np.ndarray
    descriptor: np.ndarray


def members(state: Any) -> Members:
    """The union of the fronts: what ``qd committee`` draws from on a Pareto run."""
    ids = np.asarray(state.genome_id, np.int64)
    island, cell, slot = np.nonzero(ids >= 0)
    return Members(
        island,
        cell,
        ids[island, cell, slot],
        np.asarray(state.objectives, np.float64)[island, cell, slot],
        np.asarray(state.descriptor, np.float32)[island, cell, slot],
    )


def front(state: Any, island: int, cell: int) -> list[tuple[int, np.ndarray]]:
    """The members of one front: (genome id, maximised objectives) in slot order (ascending id)."""
    ids = np.asarray(state.genome_id[island, cell])
    values = np.asarray(state.objectives[island, cell], np.float64)
    return [(int(ids[k]), values[k]) for k in np.flatnonzero(ids >= 0)]


def front_lines(summary: dict[str, Any]) -> list[str]:
    """The end of a Pareto run (its summary's ``hypervolume``): the total, then the front of
    the cell with the largest hypervolume, a line per member with its objectives in their
    own units (none for a run without fronts, or while every front is empty)."""
    reading = summary.get(EVENT_FIELD)
    if not reading:
        return []
    island, cell = reading["best_cell"]
    lines = [
        f"hypervolume {reading['total']:.6g} in total; the largest front, island {island}, cell {cell} "
        f"(hypervolume {reading['best']:.6g}):"
    ]
    for member in reading["front"]:
        shown = ", ".join(f"{name} {value:.6g}" for name, value in member.items() if name != "id")
        lines.append(f"  #{member['id']}: {shown}")
    return lines
