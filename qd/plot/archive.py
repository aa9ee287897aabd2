"""The archive as figures, one panel per island on a shared colour scale of fitness.

- a grid archive is an image, one pixel per cell (over more than two descriptor
  axes, each pixel of the two chosen axes shows the best elite over the others);
- a 2-D CVT archive is its Voronoi cells, each filled with its elite's fitness;
- a novelty archive (and a CVT over more than two axes, whose cells have no
  picture in two) is a scatter of the elites' descriptors on the two chosen axes;
- :func:`parallel_figure` draws every elite's whole descriptor as a line across the
  axes (parallel axes), for archives of any dimension.

Empty cells are left blank. A grid axis of at most :data:`CATEGORIES` bins is
labelled bin by bin (``[lo, hi)``): few bins are usually categories, or coarse
levels, and their edges are what a reader needs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from qd import history
from qd.rundir import Geometry, RunDir

CATEGORIES = 12  # a grid axis of at most this many bins gets a tick label per bin
PANEL_IN = 3.2  # inches per panel
OUTLINED_CELLS = 2000  # CVT cells are outlined up to this many; more are edged in their own colour
# (no seams between them) and are one raster in an SVG
COLUMNS = 4  # panels per row
CMAP = "viridis"


@dataclasses.dataclass
class ArchivePanels:
    """What :func:`archive_figure` drew.

    Attributes:
        mode: ``image`` (a grid), ``voronoi`` (a 2-D CVT) or ``points`` (novelty, or a
            CVT over more than two axes).
        islands: the islands drawn, one panel each, in this order.
        axes: the descriptor axes on x and y (y is None for a one-axis archive).
        values: per island: ``image`` f32[Y, X], rows along y's bins and columns along
            x's, NaN where empty (over more than two axes, the best over the others);
            ``voronoi`` f32[C], the fitness cell ``k`` is filled with (NaN empty);
            ``points`` f32[N], the elites' fitness, worst first (the best drawn on top).
        points: ``points`` mode: per island f32[N, 2], the elites' descriptors on ``axes``.
        cells: ``voronoi`` mode: cell ``k``'s polygon, f64[V, 2], in cell order.
        limits: the shared colour scale (vmin, vmax).
    """

    mode: str
    islands: list[int]
    axes: tuple[int, int | None]
    values: list[np.ndarray]
    points: list[np.ndarray] = dataclasses.field(default_factory=list)
    cells: list[np.ndarray] = dataclasses.field(default_factory=list)
    limits: tuple[float, float] = (0.0, 1.0)


@dataclasses.dataclass
class ParallelLines:
    """What :func:`parallel_figure` drew.

    Attributes:
        islands: the islands drawn, one panel each.
        lines: per island f32[N, D]: each elite's descriptor scaled to [0, 1] per axis
            (``lower`` to ``upper``; a novelty archive's by the elites' own range), worst first.
        fitness: per island f32[N], in the same order.
        limits: the shared colour scale (vmin, vmax).
    """

    islands: list[int]
    lines: list[np.ndarray]
    fitness: list[np.ndarray]
    limits: tuple[float, float]


def check_axes(axes: tuple[int, ...], dim: int) -> tuple[int, int | None]:
    """``axes`` as two distinct descriptor axes of a ``dim``-axis archive.

    Raises:
        ValueError: not two distinct axes in ``0 .. dim - 1``.
    """
    if len(axes) != 2 or len(set(axes)) != 2 or not all(0 <= a < dim for a in axes):
        raise ValueError(
            f"the run has {dim} descriptor axes (0..{dim - 1}); give two different ones, "
            f"e.g. --axes 0,{min(1, dim - 1)}"
        )
    return axes[0], axes[1]


def _default_axes(g: Geometry) -> tuple[int, int | None]:
    return (0, 1) if g.dim >= 2 else (0, None)


def archive_figure(
    run: RunDir, axes: tuple[int, int | None] | None = None, islands: list[int] | None = None, dpi: int = 100
) -> tuple[Figure, ArchivePanels]:
    """The archive of ``run`` now (its snapshot), one panel per island of ``islands`` (default all).

    ``axes``: the two descriptor axes to show (default the first two; check them with
    :func:`check_axes`).
    """
    g, snap = run.geometry, run.snapshot()
    axes = _default_axes(g) if axes is None else axes
    islands = list(range(g.islands)) if islands is None else list(islands)
    centroids = run.centroids() if g.kind == "cvt" and g.dim == 2 else None
    if g.kind == "grid":
        panels = ArchivePanels(
            "image", islands, axes, [grid_image(snap.fitness[i], g, axes) for i in islands]
        )
    elif centroids is not None:
        box = [[g.lower[a] for a in axes], [g.upper[a] for a in axes]]
        cells = run.memo(f"voronoi{axes}", lambda: voronoi_cells(centroids[:, list(axes)], *box))
        panels = ArchivePanels("voronoi", islands, axes, [snap.fitness[i] for i in islands], cells=cells)
    else:
        values, points = [], []
        for i in islands:
            _, cell = snap.filled(i)
            cell = cell[np.argsort(snap.fitness[i, cell], kind="stable")]
            values.append(snap.fitness[i, cell])
            shown = snap.descriptor[i, cell][:, [axes[0]]]
            points.append(
                np.hstack(
                    [
                        shown,
                        snap.descriptor[i, cell][:, [axes[1]]]
                        if axes[1] is not None
                        else np.zeros_like(shown),
                    ]
                )
            )  # a one-axis archive: on a line
        panels = ArchivePanels("points", islands, axes, values, points=points)
    panels.limits = _limits(panels.values)
    fig, axs = _panel_grid(len(islands), dpi)
    norm = Normalize(*panels.limits)
    for k, (ax, island) in enumerate(zip(axs, islands)):
        _draw_panel(ax, panels, k, g, norm)
        ax.set_title(f"island {island}", fontsize=9)
    if g.kind == "novelty":  # no bounds: one view for every island
        for ax in axs[1:]:
            ax.sharex(axs[0])
            ax.sharey(axs[0])
    fig.colorbar(ScalarMappable(norm, _cmap()), ax=axs, label="fitness", shrink=0.9)
    fig.suptitle(f"{run.name}: {g.kind} archive, {_evaluations(run)} evaluations", fontsize=10)
    return fig, panels


def grid_image(fitness: np.ndarray, g: Geometry, axes: tuple[int, int | None]) -> np.ndarray:
    """One island's grid as an image f32[Y, X] over ``axes`` (x, y): rows along y's bins,
    each pixel the best cell over the other axes (NaN where all are empty)."""
    cube = fitness.reshape(g.bins)  # cells are numbered in C order over the bins
    x, y = axes
    others = tuple(a for a in range(g.dim) if a not in axes)
    best = np.fmax.reduce(cube, axis=others) if others else cube  # fmax skips NaN (empty) cells
    if y is None:
        return best[None, :]
    return best.T if x < y else best  # the kept axes stay in increasing order: rows must be y's


def voronoi_cells(centroids: np.ndarray, lower: Any = None, upper: Any = None) -> list[np.ndarray]:
    """Each 2-D centroid's Voronoi cell inside the archive's bounds (``lower``, ``upper``;
    widened to hold every centroid, and by default the centroids' own box), as a polygon
    (vertices counter-clockwise), in centroid order: the cells tile the whole descriptor
    space the archive covers, not only the part between its outermost centroids.

    The centroids are mirrored across the box's four sides: a point and its mirror
    image are split by the side itself, so every cell is bounded by the box and none
    is infinite (no clipping needed). Cells are convex and hold their centroid, so
    sorting the vertices by angle around it orders them.
    """
    from scipy.spatial import Voronoi

    c = np.asarray(centroids, np.float64)
    span = np.ptp(c, axis=0) + 1.0
    lo, hi = c.min(0) - 1e-3 * span, c.max(0) + 1e-3 * span  # strictly outside: no point meets its mirror
    if lower is not None:
        lo, hi = np.minimum(lo, np.asarray(lower, np.float64)), np.maximum(hi, np.asarray(upper, np.float64))
    mirrors = []
    for d in range(2):
        for side in (lo[d], hi[d]):
            m = c.copy()
            m[:, d] = 2 * side - m[:, d]
            mirrors.append(m)
    vor = Voronoi(np.vstack([c, *mirrors]))
    cells = []
    for k in range(len(c)):
        v = vor.vertices[vor.regions[vor.point_region[k]]]
        cells.append(v[np.argsort(np.arctan2(v[:, 1] - c[k, 1], v[:, 0] - c[k, 0]))])
    return cells


def parallel_figure(
    run: RunDir, islands: list[int] | None = None, dpi: int = 100
) -> tuple[Figure, ParallelLines]:
    """Every elite's descriptor as a line across the descriptor axes, coloured by fitness,
    one panel per island (default all)."""
    g, snap = run.geometry, run.snapshot()
    islands = list(range(g.islands)) if islands is None else list(islands)
    isl, cell = snap.filled()
    if g.kind == "novelty":  # no bounds to speak of: the elites' own range
        found = snap.descriptor[isl, cell]
        lower, upper = (found.min(0), found.max(0)) if len(found) else (np.zeros(g.dim), np.ones(g.dim))
    else:
        lower, upper = np.asarray(g.lower), np.asarray(g.upper)
    width = np.where(upper > lower, upper - lower, 1.0)
    lines, fitness = [], []
    for i in islands:
        _, cell = snap.filled(i)
        cell = cell[np.argsort(snap.fitness[i, cell], kind="stable")]
        lines.append(((snap.descriptor[i, cell] - lower) / width).astype(np.float32))
        fitness.append(snap.fitness[i, cell])
    data = ParallelLines(islands, lines, fitness, _limits(fitness))
    fig, axs = _panel_grid(len(islands), dpi, width_in=max(PANEL_IN, 0.5 * g.dim))
    norm = Normalize(*data.limits)
    at = np.arange(g.dim)
    for ax, island, y, f in zip(axs, islands, lines, fitness):
        segments = np.stack([np.broadcast_to(at, y.shape), y], axis=-1)
        ax.add_collection(
            LineCollection(segments, array=f, cmap=_cmap(), norm=norm, linewidths=0.6, alpha=0.7)
        )
        ax.vlines(at, 0, 1, colors="0.6", linewidths=0.5)
        ax.set_xlim(-0.2, g.dim - 0.8)
        ax.set_ylim(-0.05, 1.05)
        if g.dim <= 20:
            ax.set_xticks(
                at, [f"{n}\n[{lo:.3g}, {hi:.3g}]" for n, lo, hi in zip(g.axes, lower, upper)], fontsize=7
            )
        ax.set_yticks([0, 1], ["lower", "upper"], fontsize=7)
        ax.set_title(f"island {island}", fontsize=9)
    fig.colorbar(ScalarMappable(norm, _cmap()), ax=axs, label="fitness", shrink=0.9)
    fig.suptitle(f"{run.name}: elites' descriptors, {_evaluations(run)} evaluations", fontsize=10)
    return fig, data


def _draw_panel(ax: Any, p: ArchivePanels, k: int, g: Geometry, norm: Normalize) -> None:
    x, y = p.axes
    if p.mode == "image":
        extent = (g.lower[x], g.upper[x], *((g.lower[y], g.upper[y]) if y is not None else (0, 1)))
        ax.imshow(
            p.values[k],
            origin="lower",
            extent=extent,
            aspect="auto",
            cmap=_cmap(),
            norm=norm,
            interpolation="nearest",
        )
        _label_bins(ax, "x", g, x)
        if y is None:
            ax.set_yticks([])
        else:
            _label_bins(ax, "y", g, y)
    elif p.mode == "voronoi":
        outlined = len(p.cells) <= OUTLINED_CELLS
        ax.add_collection(
            PolyCollection(
                p.cells,
                array=np.ma.masked_invalid(p.values[k]),
                cmap=_cmap(),
                norm=norm,
                edgecolors="0.85" if outlined else "face",
                linewidths=0.2 if outlined else 0.3,
                rasterized=not outlined,
            )
        )
        corners = np.concatenate(p.cells)
        ax.set_xlim(corners[:, 0].min(), corners[:, 0].max())
        ax.set_ylim(corners[:, 1].min(), corners[:, 1].max())
    else:
        ax.scatter(
            p.points[k][:, 0],
            p.points[k][:, 1],
            c=p.values[k],
            cmap=_cmap(),
            norm=norm,
            s=6,
            linewidths=0,
            rasterized=len(p.values[k]) > OUTLINED_CELLS,
        )
        if g.kind != "novelty" and y is not None:
            ax.set_xlim(g.lower[x], g.upper[x])
            ax.set_ylim(g.lower[y], g.upper[y])
    ax.set_xlabel(g.axes[x], fontsize=8)
    if y is not None:
        ax.set_ylabel(g.axes[y], fontsize=8)
    ax.tick_params(labelsize=7)


def _label_bins(ax: Any, which: str, g: Geometry, a: int) -> None:
    """A tick per bin labelled ``[lo, hi)`` on a grid axis of few bins (see the module doc)."""
    bins = g.bins[a]
    if bins > CATEGORIES:
        return
    edges = np.linspace(g.lower[a], g.upper[a], bins + 1)
    labels = [f"[{lo:.3g}, {hi:.3g})" for lo, hi in zip(edges[:-1], edges[1:])]
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_ticks((edges[:-1] + edges[1:]) / 2, labels, fontsize=6)
    if which == "x" and bins > 3:
        ax.tick_params(axis="x", labelrotation=90)


def _panel_grid(n: int, dpi: int, width_in: float = PANEL_IN) -> tuple[Figure, list[Any]]:
    """A figure of ``n`` panels, :data:`COLUMNS` to a row, room on the right for a colour bar."""
    cols = min(n, COLUMNS)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width_in * cols + 1.0, PANEL_IN * rows + 0.4), dpi=dpi, layout="constrained")
    axs = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for spare in axs[n:]:
        spare.remove()
    return fig, axs[:n]


def _limits(values: list[np.ndarray]) -> tuple[float, float]:
    """The colour scale over every panel's values (0..1 when all are empty)."""
    finite = np.concatenate([np.ravel(v) for v in values] or [np.zeros(0)])
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def _evaluations(run: RunDir) -> int:
    """Candidates evaluated so far: the last commit's count (a store that keeps only the
    elites holds fewer), else the store's."""
    done = history.curves(run)["evaluations"]
    return done[-1] if done else run.snapshot().evaluations


def _cmap() -> Any:
    import matplotlib

    return matplotlib.colormaps[CMAP].with_extremes(bad=(0, 0, 0, 0))  # empty cells: blank
