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

from typing import Any

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
        largest front's hypervolume, the earlier on ties) and ``reference`` (own units)."""
        volumes = self.cells(state)
        if volumes is None:
            return None
        island, cell = np.unravel_index(int(np.argmax(volumes)), volumes.shape)
        return {
            "total": float(volumes.sum()),
            "islands": [float(v) for v in volumes.sum(axis=1)],
            "best": float(volumes[island, cell]),
            "best_cell": [int(island), int(cell)],
            "reference": [float(r) for r in own_units(self.objectives, self.reference)],
        }


def front(state: Any, island: int, cell: int) -> list[tuple[int, np.ndarray]]:
    """The members of one front: (genome id, maximised objectives) in slot order (ascending id)."""
    ids = np.asarray(state.genome_id[island, cell])
    values = np.asarray(state.objectives[island, cell], np.float64)
    return [(int(ids[k]), values[k]) for k in np.flatnonzero(ids >= 0)]


def front_lines(state: Any, meter: Hypervolumes) -> list[str]:
    """The end of a Pareto run: the front of the cell with the largest hypervolume, a line
    per member with its objectives in their own units (none while every front is empty)."""
    reading = meter.reading(state)
    if reading is None:
        return []
    island, cell = reading["best_cell"]
    names = [name for name, _ in meter.objectives]
    lines = [f"front of island {island}, cell {cell} (hypervolume {reading['best']:.6g}):"]
    for genome_id, values in front(state, island, cell):
        shown = ", ".join(f"{n} {v:.6g}" for n, v in zip(names, own_units(meter.objectives, values)))
        lines.append(f"  #{genome_id}: {shown}")
    return lines
