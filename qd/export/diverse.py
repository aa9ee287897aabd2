"""``diverse``: k elites spread as far apart as the run allows, for a small training or
evaluation set that covers the archive rather than its best corner.

Selection is greedy farthest-point: the best elite first (ties by id), then each time
the elite farthest from every one chosen so far (ties by id), so the set is the same
on every export. ``min_distance`` is that distance when it was picked (null for the
first pick): it never grows, and where it falls off, the rest of the archive is close
to something already chosen.

The space is the texts' all-MiniLM-L6-v2 embeddings the run cached (an embedding
descriptor stores one per text), when every elite has one; with ``embed=true`` the
missing ones are encoded here. Otherwise (no embedding descriptor, or vectors) it is
the archive's descriptors, scaled by the archive's bounds to [0, 1] per axis so that no
axis weighs more for its units. Every row names the space used.

On a Pareto run the pool is the union of the fronts, every member with its first
objective (maximised) as its fitness, so ``qd committee`` draws its members from them.

Options: ``k``; ``min_fitness`` (a quality floor: elites below it are never picked);
``max_chars`` (elites with longer texts are dropped, for a context-length budget);
``seed`` (the random subset :func:`report` compares against).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from qd import extras, fronts
from qd.export.rows import batched, candidates
from qd.rundir import RunDir

COLUMNS = {
    "rank": "int64",
    "id": "int64",
    "island": "int64",
    "cell": "int64",
    "fitness": "float64",
    "text": "string",
    "min_distance": "float64",
    "space": "string",
}
OPTIONS: dict[str, Any] = {"k": 16, "embed": False, "min_fitness": None, "max_chars": None, "seed": 0}


class _Pool(NamedTuple):
    """The elites that may be picked, best first (ties by id), with their points in ``space``."""

    id: np.ndarray  # i64[N]
    island: np.ndarray  # i64[N]
    cell: np.ndarray  # i64[N]
    fitness: np.ndarray  # f64[N]
    points: np.ndarray  # f64[N, D]
    space: str  # "embedding" or "descriptor"
    below_floor: int  # elites left out by min_fitness
    too_long: int  # elites left out by max_chars


def rows(run: RunDir, options: dict) -> Iterator[dict]:
    """The picks in the order chosen."""
    pool, picks, gaps = _select(run, {**OPTIONS, **options})
    for rank, (k, c) in enumerate(zip(picks, candidates(run, pool.id[picks].tolist()))):
        yield {
            "rank": rank,
            "id": int(pool.id[k]),
            "island": int(pool.island[k]),
            "cell": int(pool.cell[k]),
            "fitness": float(pool.fitness[k]),
            "text": _text(c),
            "min_distance": gaps[rank],
            "space": pool.space,
        }


def report(run: RunDir, options: dict) -> dict[str, Any]:
    """How the picks compare with a random subset of the same size (``seed``): diversity
    (mean pairwise distance in the space used) and quality (mean fitness). The greedy
    picks should be more diverse; the quality shows what the spread cost."""
    opts = {**OPTIONS, **options}
    pool, picks, _ = _select(run, opts)
    rng = np.random.default_rng(int(opts["seed"]))
    random = np.sort(rng.choice(len(pool.id), size=len(picks), replace=False))
    return {
        "space": pool.space,
        "k": len(picks),
        "pool": len(pool.id),
        "below_floor": pool.below_floor,
        "too_long": pool.too_long,
        "selected": _summary(pool, np.asarray(picks, np.int64)),
        "random": _summary(pool, random),
    }


def _summary(pool: _Pool, rows: np.ndarray) -> dict[str, float | None]:
    p = pool.points[rows]
    pairwise = np.linalg.norm(p[:, None] - p[None], axis=-1)[np.triu_indices(len(rows), 1)]
    return {
        "diversity": float(pairwise.mean()) if len(pairwise) else None,
        "quality": float(pool.fitness[rows].mean()) if len(rows) else None,
    }


def _select(run: RunDir, opts: dict) -> tuple[_Pool, list[int], list[float | None]]:
    """The pool, the picks (pool rows, in order) and each pick's distance to the ones before."""
    pool = _pool(run, opts)
    picks: list[int] = []
    gaps: list[float | None] = []
    if not len(pool.id):
        return pool, picks, gaps
    nearest = np.full(len(pool.id), np.inf)  # each elite's distance to the nearest pick
    k = 0  # the best elite (the pool is best first)
    gaps.append(None)
    while True:
        picks.append(k)
        nearest = np.minimum(nearest, np.linalg.norm(pool.points - pool.points[k], axis=1))
        nearest[picks] = -np.inf
        if len(picks) >= min(int(opts["k"]), len(pool.id)):
            return pool, picks, gaps
        far = np.flatnonzero(nearest == nearest.max())
        k = int(far[np.argmin(pool.id[far])])
        gaps.append(float(nearest[k]))


def _pool(run: RunDir, opts: dict) -> _Pool:
    """The archive's elites that pass the quality floor and the length limit, best first,
    placed in the embedding space if every one has an embedding, else the descriptor space."""
    island, cell, ids, fitness, descriptor = _placed(run)
    keep = np.ones(len(ids), bool) if opts["min_fitness"] is None else fitness >= float(opts["min_fitness"])
    below_floor = int((~keep).sum())
    order = np.lexsort((ids, -fitness))
    order = order[keep[order]]
    _, first = np.unique(ids[order], return_index=True)  # a migrated elite: its best cell only
    order = order[np.sort(first)]
    fits, embeddings = _read(run, ids[order].tolist(), opts)
    order = order[fits]
    if embeddings is not None:
        points, space = embeddings.astype(np.float64), "embedding"
    else:
        g = run.geometry
        lower, upper = np.asarray(g.lower, np.float64), np.asarray(g.upper, np.float64)
        points = (descriptor[order].astype(np.float64) - lower) / (upper - lower)
        space = "descriptor"
    return _Pool(
        ids[order].astype(np.int64),
        island[order].astype(np.int64),
        cell[order].astype(np.int64),
        fitness[order],
        points,
        space,
        below_floor,
        int((~fits).sum()),
    )


def _placed(run: RunDir) -> tuple[np.ndarray, ...]:
    """(island, cell, id, fitness, descriptor) of every elite: each cell's, or on a Pareto run
    every front member, its fitness the first objective (maximised) as the archive's slots
    read it."""
    read = fronts.of_run(run)
    if read is not None:
        m = fronts.members(read[0])
        return m.island, m.cell, m.id, m.objectives[:, 0], m.descriptor
    snap = run.snapshot()
    island, cell = snap.filled()
    return (
        island,
        cell,
        snap.genome_id[island, cell],
        snap.fitness[island, cell].astype(np.float64),
        snap.descriptor[island, cell],
    )


def _read(run: RunDir, ids: list[int], opts: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """bool[N]: the elites within ``max_chars``; and f32[M, 384] the embeddings of those M
    (None: one has none cached and ``embed`` is off, or the genomes are vectors).
    Texts are read a batch at a time; with ``embed``, each batch's misses are encoded at once."""
    from descriptors.embedding import CACHE_KIND, DIM, Encoder, _key

    if opts["embed"]:
        extras.require("embeddings", "--option embed=true")
    limit = opts["max_chars"]
    fits: list[bool] = []
    vectors: list[np.ndarray] | None = []
    for chunk in batched(ids):
        texts = []  # the chunk's texts within the limit (None: a vector)
        for c in run.store.get(chunk):
            text = _text(c)
            fits.append(limit is None or len(text) <= int(limit))
            if fits[-1]:
                texts.append(text if c.kind == "text" else None)
        if vectors is None or None in texts:
            vectors = None
            continue
        keys = [_key(t) for t in texts]
        found = {k: np.frombuffer(v, "<f4") for k, v in run.store.cache.get(CACHE_KIND, keys).items()}
        missing = {k: t for k, t in zip(keys, texts) if k not in found}
        if missing and not opts["embed"]:
            vectors = None
            continue
        if missing:
            found.update(zip(missing, Encoder().encode(list(missing.values()))))
        vectors += [found[k] for k in keys]
    return np.asarray(fits, bool), None if vectors is None else np.asarray(vectors, np.float32).reshape(
        -1, DIM
    )


def _text(c: Any) -> str:
    """A text genome's text; a vector as its JSON list (what a reader of the row can use)."""
    return (c.text or "") if c.kind == "text" else json.dumps([float(x) for x in c.vector])
