"""Writing a run directory's founding files when a run is built (a new run or a resume).

The builder calls :func:`create` once per build: it saves the resolved config
(what ``qd-run resume=RUN_DIR`` reads), the archive's :class:`~qd.rundir.layout.Geometry`
(what every reader needs) and a CVT's centroids (so a resume reuses the same
cells), and returns the archive spec made from that geometry by the same
``spec_of`` the readers use. A resume rewrites the geometry, so a run from
before qd saved it gets it on its next build.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from qd.config import cells_kind
from qd.rundir.layout import CENTROIDS, CONFIG, Geometry, fronts, spec_of
from qd.task import descriptor_names, objectives_of


def create(p: Any, run_dir: Path) -> Any:
    """Writes the founding files of the planned run ``p`` (a ``qd.plan.Plan``) into ``run_dir``
    and returns its archive spec.

    A describer that fits its own centroids (raw embeddings) starts from placeholder
    centroids: nothing is placed before its first fit.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(p.cfg, run_dir / CONFIG, resolve=True)
    centroids = _centroids(p, run_dir) if cells_kind(p.cfg.archive) == "cvt" else None
    g = geometry_of(p, centroids)
    g.save(run_dir)
    return spec_of(g, centroids)


# Settings a run decides when it starts (``runner.in_flight`` unset on ``runner=ray``: sized from
# the cluster's CPUs), kept in its config so a resume replays it as it ran, on any cluster.
SETTLED = ("runner.in_flight",)


def settle(run_dir: Path, key: str, value: Any) -> None:
    """Writes ``key`` (one of :data:`SETTLED`), as the run decided it, into its saved config."""
    cfg = OmegaConf.load(run_dir / CONFIG)
    OmegaConf.update(cfg, key, value)
    OmegaConf.save(cfg, run_dir / CONFIG)


def create_of_spec(spec: Any, islands: int, genome: str | None, run_dir: Path, task: Any) -> None:
    """Writes the founding files of a run built from Python objects (``qd.build`` with parts,
    no config): its geometry, and a CVT's centroids, all read off ``spec`` (the axes' names off
    ``task``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    axes = descriptor_names(task, int(spec.descriptor_dim))
    Geometry.of_spec(spec, islands, genome, axes, objectives_of(task)).save(run_dir)
    cells = getattr(spec, "cells", spec)  # a Pareto archive's fronts sit in cells
    if cells.kind == "cvt":
        np.save(run_dir / CENTROIDS, np.asarray(cells.centroids, np.float32))


def _centroids(p: Any, run_dir: Path) -> np.ndarray:
    """A CVT's centroids: the run's saved ones, else made once (and saved) from the config."""
    a, d = p.cfg.archive, p.geometry
    if d.own_cells:
        return np.zeros((a.cells, d.dim), np.float32)
    path = run_dir / CENTROIDS
    if path.exists():
        return np.load(path)
    from qd.archive import cvt_centroids

    centroids = cvt_centroids(a.cells, list(d.lower), list(d.upper), a.cvt_samples, a.cvt_seed)
    np.save(path, centroids)
    return centroids


def geometry_of(p: Any, centroids: np.ndarray | None) -> Geometry:
    """The geometry of a planned run (``qd.plan.Plan``); a CVT has a cell per centroid."""
    from qd.archive import CMA_MAE

    a, d = p.cfg.archive, p.geometry
    cells = (
        len(centroids)
        if centroids is not None
        else {"grid": math.prod(d.bins), "novelty": a.capacity}[cells_kind(a)]
    )
    novelty = (
        {
            "k": int(a.k),
            "threshold": float(a.novelty_threshold),
            "local_competition": bool(a.local_competition),
        }
        if a.kind == "novelty"
        else None
    )
    pareto = fronts(a.front_size, objectives_of(p.task), a.reference) if a.kind == "pareto" else None
    return Geometry(
        kind=cells_kind(a),
        islands=int(p.cfg.islands.count),
        cells=int(cells),
        dim=int(d.dim),
        bins=tuple(int(b) for b in d.bins) if d.bins else (),
        lower=tuple(map(float, d.lower)),
        upper=tuple(map(float, d.upper)),
        axes=axis_names(p),
        own_cells=bool(d.own_cells),
        thresholds={name: float(a[name]) for name in CMA_MAE},
        novelty=novelty,
        genome=p.genome.name if p.genome is not None else None,
        loop=p.loop,
        pareto=pareto,
    )


def axis_names(p: Any) -> tuple[str, ...]:
    """A name per descriptor axis: the describer's (``Descriptor.axis_names``), else the task's
    (``qd.task.descriptor_names``). Under cyclic objectives the axes change with each phase,
    which one saved geometry cannot say: they stay ``d0, d1, ...``, as for a task that names none."""
    dim = p.geometry.dim
    if p.strategy.cycle is not None:
        return descriptor_names(None, dim)
    if p.describer is not None and len(p.describer.axis_names) == dim:
        return tuple(p.describer.axis_names)
    return descriptor_names(p.task, dim)
