"""What the web explorer's ``/api/`` endpoints answer, computed from ``qd.rundir`` and ``qd.history``.

Everything here reads; nothing writes to the run directory. The numbers the page
shows are the readers' own (``RunDir.snapshot``, ``history.curves``,
``history.operator_stats``, ``history.lineage``), so the explorer and ``qd show`` /
``qd stats`` / ``qd lineage`` never disagree. What is dear to compute is memoized
on the ``RunDir`` until the run changes (``RunDir.memo``), and nothing sends a whole
archive as JSON: a heatmap is a raster of at most ``MAX_SIDE`` x ``MAX_SIDE``
float32 values, and every listing is paged, so a page stays quick on a run with a
million cells and a hundred thousand candidates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np

from qd import fronts, history
from qd.llm.ledger import USAGE_FIELDS
from qd.rundir import RunDir

MAX_SIDE = 512  # a raster's widest side: a finer grid is shown max-pooled to it
CVT_SIDE = 256  # the nearest-centroid raster of a 2-D CVT archive: CVT_SIDE x CVT_SIDE points
# A CVT with more cells than a quarter of its raster's points would lose cells in it: its elites
# are scattered by descriptor instead, each pixel showing the best elite falling in it.
CVT_RASTER_CELLS = CVT_SIDE * CVT_SIDE // 4
PAGE_LIMIT = 200  # the most rows one search page returns


class NotFound(LookupError):
    """A run, island, cell or candidate that is not there (answered 404 with the message)."""


class BadRequest(ValueError):
    """A query value the explorer cannot use (answered 400 with the message)."""


def jsonable(x: Any) -> Any:
    """``x`` with numpy values made plain and NaN or infinite floats made None: JSON
    has no NaN, and browsers refuse the ``NaN`` token Python's json writes."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def version_tag(run: RunDir) -> str:
    """A short tag of ``RunDir.version()``: it changes whenever the run writes."""
    return hashlib.sha1(repr(run.version()).encode()).hexdigest()[:12]


# ----- the heatmap ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Raster:
    """How a heatmap's pixels relate to cells, for one pair of descriptor axes.

    Attributes:
        width, height: pixels; row 0 is the top (the y axis's upper end).
        x, y: the descriptor axes drawn (``y`` is None for a 1-D archive: one row).
        cell_map: i64[height * width], the cell each pixel shows (grids that fit, a
            2-D CVT's nearest centroids); None where elites are scattered instead:
            each pixel shows the best elite whose place falls in it (finer grids,
            more than two axes, which takes the best over the other axes, large CVTs,
            novelty archives).
    """

    width: int
    height: int
    x: int
    y: int | None
    cell_map: np.ndarray | None


def axes(run: RunDir, x: int | None, y: int | None) -> tuple[int, int | None]:
    """The axis pair to draw (defaults: the first two), checked against the run's dimensions."""
    dim = run.geometry.dim
    x = 0 if x is None else x
    y = (1 if dim > 1 else None) if y is None else y
    for name, a in (("x", x), ("y", y)):
        if a is not None and not 0 <= a < dim:
            raise BadRequest(f"{name}={a}: the run has descriptor axes 0..{dim - 1}")
    if dim > 1 and x == y:
        raise BadRequest(f"x and y are both axis {x}; pick two different axes")
    return x, y


def raster(run: RunDir, rasters: dict, x: int, y: int | None) -> Raster:
    """The raster of axes (x, y), built once per run and kept in ``rasters``: it depends
    only on the geometry and the tessellation, which a reader never sees change."""
    if (x, y) not in rasters:
        rasters[x, y] = _raster(run, x, y)
    return rasters[x, y]


def _raster(run: RunDir, x: int, y: int | None) -> Raster:
    g, spec = run.geometry, run.spec()
    if g.kind == "grid":
        width = min(g.bins[x], MAX_SIDE)
        height = 1 if y is None else min(g.bins[y], MAX_SIDE)
        if g.dim > 2 or width < g.bins[x] or (y is not None and height < g.bins[y]):
            return Raster(width, height, x, y, None)
        cols, rows = np.meshgrid(np.arange(width), np.arange(height)[::-1])
        coords = [cols.ravel()] if y is None else [None, None]
        if y is not None:
            coords[x], coords[y] = cols.ravel(), rows.ravel()
        return Raster(width, height, x, y, np.ravel_multi_index(coords, g.bins).astype(np.int64))
    height = 1 if y is None else CVT_SIDE
    if g.kind != "cvt" or g.dim != 2 or spec is None or g.cells > CVT_RASTER_CELLS:
        return Raster(CVT_SIDE, height, x, y, None)
    import jax

    xs = g.lower[x] + (np.arange(CVT_SIDE) + 0.5) / CVT_SIDE * (g.upper[x] - g.lower[x])
    ys = g.lower[y] + (np.arange(CVT_SIDE)[::-1] + 0.5) / CVT_SIDE * (g.upper[y] - g.lower[y])
    points = np.zeros((CVT_SIDE * CVT_SIDE, 2), np.float32)
    points[:, x], points[:, y] = np.tile(xs, CVT_SIDE), np.repeat(ys, CVT_SIDE)
    return Raster(CVT_SIDE, CVT_SIDE, x, y, np.asarray(jax.jit(spec.index)(points), np.int64))


def island_of(run: RunDir, island: int) -> int:
    if not 0 <= island < run.geometry.islands:
        raise NotFound(f"island {island}: the run has islands 0..{run.geometry.islands - 1}")
    return island


def heatmap(run: RunDir, r: Raster, island: int) -> tuple[np.ndarray, np.ndarray]:
    """(f32[H*W] fitness, NaN where empty; i32[H*W] the cell each pixel shows, -1 where
    empty) of ``island`` now; memoized until the run changes."""
    island_of(run, island)
    return run.memo(f"heatmap/{island}/{r.x}/{r.y}", lambda: _heatmap(run, r, island))


def _heatmap(run: RunDir, r: Raster, island: int) -> tuple[np.ndarray, np.ndarray]:
    snap = run.snapshot()
    fitness = snap.fitness[island]
    if r.cell_map is not None:
        values = fitness[r.cell_map]
        return values, np.where(np.isnan(values), -1, r.cell_map).astype(np.int32)
    cells = np.flatnonzero(snap.genome_id[island] >= 0)
    pixel = _pixels(run, r, cells, snap.descriptor[island, cells])
    order = np.lexsort((-fitness[cells], pixel))  # by pixel, best first within each
    pixel, cells = pixel[order], cells[order]
    first = np.r_[True, pixel[1:] != pixel[:-1]] if len(pixel) else np.zeros(0, bool)
    values = np.full(r.width * r.height, np.nan, np.float32)
    shown = np.full(r.width * r.height, -1, np.int32)
    values[pixel[first]], shown[pixel[first]] = fitness[cells[first]], cells[first]
    return values, shown


def _pixels(run: RunDir, r: Raster, cells: np.ndarray, descriptor: np.ndarray) -> np.ndarray:
    """The pixel of each elite: a grid cell's coordinates scaled to the raster, else its
    descriptor's place in the archive's box."""
    g = run.geometry

    def place(a: int, side: int) -> np.ndarray:
        if g.kind == "grid":
            return np.unravel_index(cells, g.bins)[a] * side // g.bins[a]
        span = (g.upper[a] - g.lower[a]) or 1.0
        return np.clip(np.floor((descriptor[:, a] - g.lower[a]) / span * side), 0, side - 1).astype(np.int64)

    col = place(r.x, r.width)
    row = np.zeros_like(col) if r.y is None else r.height - 1 - place(r.y, r.height)
    return row * r.width + col


def fitness_range(run: RunDir) -> tuple[float | None, float | None]:
    """The lowest and highest elite fitness over every island: one colour scale for all."""

    def compute() -> tuple[float | None, float | None]:
        f = run.snapshot().fitness
        f = f[np.isfinite(f)]
        return (float(f.min()), float(f.max())) if len(f) else (None, None)

    return run.memo("range", compute)


# ----- candidates -----------------------------------------------------------------------


def cell(run: RunDir, island: int, cell_id: int) -> dict[str, Any]:
    """The elite of ``cell_id`` on ``island``: :func:`candidate` plus the archive's fitness
    and descriptor for the cell."""
    snap = run.snapshot()
    island_of(run, island)
    if not 0 <= cell_id < run.geometry.cells:
        raise NotFound(f"cell {cell_id}: the archive has cells 0..{run.geometry.cells - 1}")
    genome_id = int(snap.genome_id[island, cell_id])
    if genome_id < 0:
        raise NotFound(f"island {island} cell {cell_id} is empty")
    return {
        **candidate(run, genome_id),
        "cell": {
            "island": island,
            "cell": cell_id,
            "fitness": snap.fitness[island, cell_id],
            "descriptor": snap.descriptor[island, cell_id],
        },
    }


def front(run: RunDir, island: int, cell_id: int) -> dict[str, Any]:
    """A Pareto run's front in ``cell_id`` on ``island``: ``objectives`` (the task's [name,
    direction] pairs), its ``hypervolume`` against the run's ``reference`` (own units), and
    its ``members`` (``id`` and ``values``, in the objectives' own units), ascending ids."""
    read = fronts.of_run(run)
    if read is None:
        raise NotFound(f"run {run.name} keeps one elite per cell, no fronts (archive=pareto has them)")
    island_of(run, island)
    if not 0 <= cell_id < run.geometry.cells:
        raise NotFound(f"cell {cell_id}: the archive has cells 0..{run.geometry.cells - 1}")
    state, meter = read
    volumes = meter.cells(state)
    return {
        "island": island,
        "cell": cell_id,
        "objectives": [list(o) for o in meter.objectives],
        "hypervolume": None if volumes is None else volumes[island, cell_id],
        "reference": None if meter.reference is None else fronts.own_units(meter.objectives, meter.reference),
        "members": [
            {"id": genome_id, "values": fronts.own_units(meter.objectives, values)}
            for genome_id, values in fronts.front(state, island, cell_id)
        ],
    }


def candidate(run: RunDir, candidate_id: int) -> dict[str, Any]:
    """Everything stored about one candidate, its text and its diff from its first parent
    highlighted, where it is an elite now, and the model calls its evaluation made."""
    try:
        (c,) = run.store.get([candidate_id])
    except KeyError:
        raise NotFound(f"no candidate {candidate_id} in run {run.name}") from None
    snap = run.snapshot()
    isl, cells = np.nonzero(snap.genome_id == c.id)
    diff = history.parent_diff(run, c)
    out = {
        k: getattr(c, k)
        for k in (
            "id",
            "kind",
            "genome",
            "island",
            "operator",
            "model",
            "instruction",
            "valid",
            "fitness",
            "metrics",
            "artifacts",
            "error",
            "eval_seconds",
            "tokens_in",
            "tokens_out",
            "cost",
            "created",
            "response",
        )
    }
    out.update(
        parent_ids=list(c.parent_ids),
        descriptor=c.descriptor,
        prompt=_messages(c.prompt),
        elite=[[int(i), int(k)] for i, k in zip(isl, cells)],
        trace=run.store.traces.of(c.id),
        diff=diff,
        diff_html=highlight(diff, "diff") if diff else None,
    )
    if c.kind == "text":
        out.update(text=c.text or "", html=highlight(c.text or "", language(c.genome)))
    else:
        out["vector"] = c.vector
    return out


def _messages(prompt: str | None) -> Any:
    """A stored prompt as its list of chat messages (it is their JSON), else the text as stored."""
    if prompt is None:
        return None
    try:
        return json.loads(prompt)
    except json.JSONDecodeError:
        return prompt


def language(genome: str | None) -> str:
    """The Pygments lexer name for a genome kind: its fence language (``text`` if unknown)."""
    import genomes

    try:
        return genomes.get(genome).language
    except (ValueError, TypeError):  # a kind registered by a task module not imported here
        return "text"


def highlight(text: str, lexer: str) -> str:
    """``text`` as highlighted HTML spans (class names from :func:`highlight_css`); Pygments
    escapes the text, so the page may insert it as HTML."""
    from pygments import highlight as render
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import TextLexer, get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lex = get_lexer_by_name(lexer, stripnl=False, ensurenl=False)
    except ClassNotFound:
        lex = TextLexer()
    return render(text, lex, HtmlFormatter(nowrap=True))


def highlight_css() -> str:
    """The CSS for :func:`highlight`'s classes, under ``.hl`` (generated by Pygments, BSD-2)."""
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".hl")


def lineage(run: RunDir, candidate_id: int) -> list[dict[str, Any]]:
    """``history.lineage`` without each step's text, diff and vector: the page lists the
    ancestors and fetches the one it shows (highlighted) from :func:`candidate`, so a
    long lineage of long programs is not sent whole."""
    try:
        steps = history.lineage(run, candidate_id)
    except KeyError:
        raise NotFound(f"no candidate {candidate_id} in run {run.name}") from None
    return [{k: v for k, v in s.items() if k not in ("text", "diff", "vector")} for s in steps]


# ----- the run ----------------------------------------------------------------------------


def summary(run: RunDir) -> dict[str, Any]:
    """The run at a glance: geometry, evaluations, elites and best per island, the best
    elite, the spend, and the operators seen (the search page's filter)."""

    def compute() -> dict[str, Any]:
        snap, g = run.snapshot(), run.geometry
        filled = snap.genome_id >= 0
        best = None
        if filled.any():
            i, k = np.unravel_index(np.nanargmax(snap.fitness), snap.fitness.shape)
            best = {
                "id": int(snap.genome_id[i, k]),
                "island": int(i),
                "cell": int(k),
                "fitness": snap.fitness[i, k],
            }
        with np.errstate(all="ignore"):
            island_best = np.where(
                filled.any(1), np.nanmax(np.where(filled, snap.fitness, -np.inf), 1), np.nan
            )
        ledger = run.store.calls.totals()
        return {
            "name": run.name,
            "path": str(run.path),
            **dataclasses.asdict(g),
            "evaluations": snap.evaluations,
            "last_id": snap.last_id,
            "checkpoint_id": snap.checkpoint_id,
            "elites": filled.sum(1),
            "coverage": filled.mean(1),
            "island_best": island_best,
            "best": best,
            "llm_calls": sum(r[2] for r in ledger),
            "cost": sum(r[8] for r in ledger),
            "operators": sorted({o for page in run.store.columns(("operator",)) for (o,) in page if o}),
            "hypervolume": fronts.reading_of(run),
        }

    return run.memo("summary", compute)


def stats(run: RunDir, by: str) -> list[dict[str, Any]]:
    """``history.operator_stats`` grouped by a comma-separated ``by``."""
    groups = tuple(b for b in by.split(",") if b)
    try:
        return history.operator_stats(run, groups or ("operator",))
    except ValueError as e:
        raise BadRequest(str(e)) from None


LEDGER_FIELDS = ("role", "model", *USAGE_FIELDS)


def ledger(run: RunDir) -> dict[str, Any]:
    """The model-call ledger per (role, model), with totals per role, per model and overall."""
    rows = [dict(zip(LEDGER_FIELDS, r)) for r in run.store.calls.totals()]
    sums = LEDGER_FIELDS[2:]

    def total(members: list[dict]) -> dict[str, Any]:
        return {f: sum(m[f] for m in members) for f in sums}

    return {
        "rows": rows,
        "total": total(rows),
        "per_role": {
            k: total([r for r in rows if r["role"] == k]) for k in sorted({r["role"] for r in rows})
        },
        "per_model": {
            k: total([r for r in rows if r["model"] == k]) for k in sorted({r["model"] for r in rows})
        },
    }


class Search:
    """Search and filter over every candidate of a run, on a read-only SQLite connection of
    its own (``mode=ro``: it cannot write), paged with LIMIT/OFFSET so no answer grows with
    the store."""

    SORTS = {"fitness": "fitness IS NULL, fitness DESC, id", "id": "id", "newest": "id DESC"}

    def __init__(self, path: Path):
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        # (filters) -> total, for the store's newest row: paging through a result counts it once.
        self._totals: tuple[Any, dict[tuple, int]] = (None, {})

    def close(self) -> None:
        self._db.close()

    def __call__(
        self,
        q: str = "",
        operator: str | None = None,
        valid: bool | None = None,
        error: bool | None = None,
        island: int | None = None,
        sort: str = "fitness",
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        """``{"total", "offset", "rows"}``: the candidates whose text holds ``q`` (case-blind
        for ASCII, as SQL LIKE), made by ``operator``, valid or not, with an error or not,
        born on ``island``; each row with a snippet: the first line holding ``q``."""
        if sort not in self.SORTS:
            raise BadRequest(f"sort={sort}: use one of {', '.join(self.SORTS)}")
        if not 1 <= limit <= PAGE_LIMIT or offset < 0:
            raise BadRequest(f"limit must be 1..{PAGE_LIMIT} and offset >= 0")
        where, params = ["kind IN ('text', 'vector')"], []
        if q:
            where.append("text LIKE ? ESCAPE '\\'")
            params.append("%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        for column, value in (("operator", operator), ("island", island), ("valid", valid)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(int(value) if isinstance(value, bool) else value)
        if error is not None:
            where.append("error IS NOT NULL" if error else "error IS NULL")
        sql = " WHERE " + " AND ".join(where)
        with self._lock:
            mark = self._db.execute("SELECT MAX(id) FROM candidates").fetchone()
            if self._totals[0] != mark:
                self._totals = (mark, {})
            key = (sql, *params)
            if key not in self._totals[1]:
                ((self._totals[1][key],),) = self._db.execute("SELECT COUNT(*) FROM candidates" + sql, params)
            total = self._totals[1][key]
            rows = self._db.execute(
                "SELECT id, island, operator, model, fitness, valid, error, text FROM candidates"
                f"{sql} ORDER BY {self.SORTS[sort]} LIMIT ? OFFSET ?",
                [*params, limit, offset],
            ).fetchall()
        keys = ("id", "island", "operator", "model", "fitness", "valid", "error")
        return {
            "total": total,
            "offset": offset,
            "rows": [
                {**dict(zip(keys, r[:7])), "valid": bool(r[5]), "snippet": _snippet(r[7], q)} for r in rows
            ],
        }


def _snippet(text: str | None, q: str) -> str:
    """The first line of ``text`` holding ``q`` (any case), else its first non-blank line; 160
    characters at most."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    hits = [line for line in lines if q.lower() in line.lower()] if q else []
    return (hits or lines or [""])[0].strip()[:160]
