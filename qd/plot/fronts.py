"""A Pareto run's figure: its hypervolume over evaluations, then the fronts of its cells.

The first panel is the total hypervolume of the commit events (``qd.fronts``: every
point against the run's one reference, so the curve is comparable from start to end).
Then a panel per front, the largest hypervolume first (at most :data:`MAX_FRONTS`),
its members drawn in the first two objectives' own units (the task's, directions
as declared), joined as the staircase they dominate, the reference marked.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from matplotlib.figure import Figure

from qd import fronts, history
from qd.plot.curves import PANEL_IN
from qd.rundir import RunDir

MAX_FRONTS = 8  # fronts drawn, the largest hypervolume first
COLUMNS = 3


@dataclasses.dataclass
class FrontPanels:
    """What :func:`fronts_figure` drew.

    Attributes:
        evaluations, hypervolume: f64[N], the curve (NaN: an event without a reading).
        cells: [island, cell] of each front drawn, in order.
        points: each drawn front's members, f64[n, 2] in the objectives' own units.
        hypervolumes: each drawn front's hypervolume.
    """

    evaluations: np.ndarray
    hypervolume: np.ndarray
    cells: list[list[int]]
    points: list[np.ndarray]
    hypervolumes: list[float]


def fronts_figure(run: RunDir, dpi: int = 100) -> tuple[Figure, FrontPanels]:
    """The hypervolume curve and the largest fronts of a Pareto run (``run.geometry.pareto``)."""
    state, meter = fronts.of_run(run)
    c = history.curves(run)
    volumes = meter.cells(state)
    rows = [] if volumes is None else fronts.cell_rows(state, volumes)[:MAX_FRONTS]
    names = [name for name, _ in meter.objectives][:2]
    data = FrontPanels(
        np.asarray(c["evaluations"], np.float64),
        np.asarray([np.nan if v is None else v for v in c.get("hypervolume", [])], np.float64),
        [[r["island"], r["cell"]] for r in rows],
        [_own(meter, [v for _, v in fronts.front(state, r["island"], r["cell"])]) for r in rows],
        [r["hypervolume"] for r in rows],
    )
    panels = 1 + len(rows)
    cols = min(panels, COLUMNS)
    fig = Figure(
        figsize=(PANEL_IN[0] * cols, PANEL_IN[1] * -(-panels // cols) + 0.3), dpi=dpi, layout="constrained"
    )
    axs = list(fig.subplots(-(-panels // cols), cols, squeeze=False).ravel())
    for spare in axs[panels:]:
        spare.remove()
    curve = axs[0]
    if len(data.hypervolume) == len(data.evaluations):
        curve.plot(data.evaluations, data.hypervolume, color="black", marker=".")
    curve.set_title("hypervolume (total)", fontsize=9)
    curve.set_xlabel("evaluations", fontsize=8)
    reference = None if meter.reference is None else _own(meter, [meter.reference])[0]
    for ax, (island, cell), points, volume in zip(axs[1:], data.cells, data.points, data.hypervolumes):
        order = np.argsort(points[:, 0])
        ax.step(points[order, 0], points[order, 1], where="post", color="0.6", linewidth=0.8)
        ax.scatter(points[:, 0], points[:, 1], s=18, color="tab:blue", zorder=3)
        if reference is not None:
            ax.scatter([reference[0]], [reference[1]], marker="x", color="tab:red", s=20, label="reference")
        ax.set_title(f"island {island}, cell {cell}: hypervolume {volume:.4g}", fontsize=8)
        ax.set_xlabel(names[0], fontsize=8)
        ax.set_ylabel(names[1] if len(names) > 1 else "", fontsize=8)
    for ax in axs[:panels]:
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{run.name}: fronts of {len(rows)} cells", fontsize=10)
    return fig, data


def _own(meter: fronts.Hypervolumes, values: list[np.ndarray]) -> np.ndarray:
    """Maximised vectors as f64[n, 2] in their own units (one objective: a zero second axis)."""
    own = fronts.own_units(meter.objectives, np.asarray(values, np.float64).reshape(len(values), -1))
    return own[:, :2] if own.shape[1] > 1 else np.column_stack([own[:, 0], np.zeros(len(own))])
