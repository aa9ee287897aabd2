"""Curves over evaluations: QD score, coverage and best fitness (``qd.history.curves``).

:func:`curves_figure` draws one run: a line per island, the global archive, and the
islands merged cell by cell (``union``) where the run reports it.
:func:`compare_figure` draws several runs grouped by setting (their overrides less
``seed=``): the median over a group's runs and the shaded min–max range. The runs
of a group are compared on a common grid, the union of their evaluation points from
where every one has started; between its points a run's curve holds its last value
(the archive does not change between waves), so every run has a value at every point.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from qd import history
from qd.rundir import RunDir, setting

STATS = {"qd_score": "QD score", "coverage": "coverage", "max_fitness": "best fitness"}
PANEL_IN = (3.6, 2.8)  # inches per panel
MARKED_POINTS = 20  # curves of at most this many points get a dot at each
LABEL_CHARS = 70  # a setting's label in the legend is cut to this many characters


@dataclasses.dataclass
class CurveLines:
    """What :func:`curves_figure` drew.

    Attributes:
        evaluations: f64[N], one point per wave.
        lines: label (``global``, ``union``, ``island 0``, ...) -> stat -> f64[N] (NaN: missing).
    """

    evaluations: np.ndarray
    lines: dict[str, dict[str, np.ndarray]]


@dataclasses.dataclass
class Group:
    """One setting's runs as :func:`compare_figure` drew them.

    Attributes:
        label: the setting (its overrides less the seed; a run without overrides: its name).
        runs: the runs' names, in the order of ``values``' rows.
        evaluations: f64[N], the common grid.
        values: stat -> f64[R, N], each run's global curve held at the grid points.
        median, low, high: stat -> f64[N], over the runs at each grid point.
    """

    label: str
    runs: list[str]
    evaluations: np.ndarray
    values: dict[str, np.ndarray]
    median: dict[str, np.ndarray]
    low: dict[str, np.ndarray]
    high: dict[str, np.ndarray]


def curves_figure(run: RunDir, islands: list[int] | None = None, dpi: int = 100) -> tuple[Figure, CurveLines]:
    """One run's curves: a panel per stat of :data:`STATS`, a line per island of ``islands``
    (default all) plus the global archive and the union."""
    c = history.curves(run)
    data = CurveLines(np.asarray(c["evaluations"], np.float64), {"global": _arrays(c["global"])})
    if "union" in c:
        data.lines["union"] = _arrays(c["union"])
    for i in range(len(c["islands"])) if islands is None else islands:
        if i < len(c["islands"]):
            data.lines[f"island {i}"] = _arrays(c["islands"][i])
    fig, axs = _panels(dpi)
    for ax, stat in zip(axs, STATS):
        for label, ys in data.lines.items():
            wide = label in ("global", "union")
            ax.plot(
                data.evaluations,
                ys[stat],
                label=label,
                marker=_marker(data.evaluations),
                linewidth=1.6 if wide else 0.9,
                color={"global": "black", "union": "0.45"}.get(label),
                linestyle="--" if label == "union" else "-",
            )
    fig.legend(*axs[0].get_legend_handles_labels(), loc="outside right upper", fontsize=7)
    fig.suptitle(f"{run.name}: {len(data.evaluations)} waves", fontsize=10)
    return fig, data


def settings(runs: dict[str, RunDir]) -> dict[str, list[str]]:
    """The runs (by name) grouped by setting: label -> names, in first-seen order.

    A run's setting is its overrides less the seed (and Hydra's own); the label shows
    the overrides that differ between the runs (those all share would only repeat),
    else the shared ones, else ``defaults``. A run without Hydra's files is a setting
    of its own, labelled with its name.
    """
    given = {name: setting(run.path) for name, run in runs.items()}
    kept = {name: g for name, g in given.items() if g is not None}
    shared = set.intersection(*map(set, kept.values())) if kept else set()
    groups: dict[str, list[str]] = {}
    for name in runs:
        if name not in kept:
            label = name
        else:
            label = " ".join(o for o in kept[name] if o not in shared) or " ".join(kept[name]) or "defaults"
        groups.setdefault(label, []).append(name)
    return groups


def compare_figure(runs: dict[str, RunDir], dpi: int = 100) -> tuple[Figure, list[Group]]:
    """Several runs (name -> run) on one figure, grouped by :func:`settings`: per group the
    median global curve and the min–max range over its runs. Runs with no wave yet are left out."""
    curves = {name: history.curves(run) for name, run in runs.items()}
    groups = []
    for label, names in settings(runs).items():
        names = [n for n in names if curves[n]["evaluations"]]
        if not names:
            continue
        xs = [np.asarray(curves[n]["evaluations"], np.float64) for n in names]
        grid = np.unique(np.concatenate(xs))
        grid = grid[grid >= max(x[0] for x in xs)]
        values = {
            s: np.stack([held(x, _arrays(curves[n]["global"])[s], grid) for x, n in zip(xs, names)])
            for s in STATS
        }
        groups.append(
            Group(
                label,
                names,
                grid,
                values,
                {s: np.median(v, 0) for s, v in values.items()},
                {s: v.min(0) for s, v in values.items()},
                {s: v.max(0) for s, v in values.items()},
            )
        )
    fig, axs = _panels(dpi)
    for k, g in enumerate(groups):
        color = f"C{k % 10}"
        for ax, stat in zip(axs, STATS):
            ax.fill_between(g.evaluations, g.low[stat], g.high[stat], color=color, alpha=0.2, linewidth=0)
            ax.plot(
                g.evaluations,
                g.median[stat],
                color=color,
                marker=_marker(g.evaluations),
                label=f"{textwrap.shorten(g.label, LABEL_CHARS)} (n={len(g.runs)})",
            )
    if groups:
        fig.legend(
            *axs[0].get_legend_handles_labels(),
            loc="outside lower center",
            fontsize=7,
            ncols=max(1, min(len(groups), 3)),
        )
    fig.suptitle(f"{len(runs)} runs, {len(groups)} settings: median and min–max over seeds", fontsize=10)
    return fig, groups


def held(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The step curve through (``x``, ``y``) at each ``grid`` point (all at or after ``x[0]``):
    the value of the last point at or before it."""
    return y[np.searchsorted(x, grid, side="right") - 1]


def _marker(x: np.ndarray) -> str | None:
    """Dots on a curve of few points (a device-loop run logs one per checkpoint: one point is no line)."""
    return "." if len(x) <= MARKED_POINTS else None


def _arrays(stats: dict[str, list]) -> dict[str, np.ndarray]:
    return {s: np.asarray([np.nan if v is None else v for v in stats[s]], np.float64) for s in STATS}


def _panels(dpi: int) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(PANEL_IN[0] * len(STATS), PANEL_IN[1]), dpi=dpi, layout="constrained")
    axs = list(fig.subplots(1, len(STATS)))
    for ax, title in zip(axs, STATS.values()):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("evaluations", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return fig, axs
