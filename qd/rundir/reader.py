"""A run directory opened read-only: what ``qd show``, ``lineage``, ``stats``, ``compare``, ``plot``
and ``explore`` read, during a run or after it.

The archive a reader sees is the one ``qd-run resume=`` would rebuild: the last
checkpoint plus the store rows after it, replayed into a copy
(``qd.rundir.replay``). Nothing here writes to the run: the store is opened
read-only and the replayed archive lives in memory, so a reader can watch a run
in progress and never disturbs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qd.rundir import replay
from qd.rundir.layout import (
    CENTROIDS,
    CHECKPOINT,
    CHECKPOINTS,
    CONFIG,
    EVENTS,
    STORE,
    Geometry,
    RunDirError,
    described,
    is_run,
    spec_of,
)
from qd.rundir.replay import Snapshot


class RunDir:
    """A run directory opened read-only (see the module doc).

    Raises:
        RunDirError: ``path`` has no ``store.sqlite``, or neither ``config.yaml`` nor ``archive.json``.
    """

    def __init__(self, path: str | Path):
        from qd.store import Store

        self.path = Path(path)
        if not is_run(self.path):
            raise RunDirError(
                f"{self.path}: no {STORE if described(self.path) else CONFIG}; pass a run directory made by "
                "qd-run or qd.build (its path is printed as `run dir` at the end of a run)"
            )
        self.store = Store(self.path / STORE, readonly=True)
        self._geometry: Geometry | None = None
        self._spec: Any = None
        self._memo: dict[str, tuple[tuple, Any]] = {}
        # Told (candidates read, candidates stored) as a scan of the store goes (``history.pages``):
        # the progress bar of a long export.
        self.on_read: Callable[[int, int], None] | None = None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self.path.name

    def config(self) -> Any:
        """The saved config; an empty one for a run built from Python objects (``qd.build`` with
        parts, ``qd.optimize``), which has none: its readers take their defaults."""
        from omegaconf import OmegaConf

        path = self.path / CONFIG
        return OmegaConf.load(path) if path.exists() else OmegaConf.create({})

    @property
    def geometry(self) -> Geometry:
        """The saved geometry (``Geometry.load``: a run from before qd saved it is refused, with
        how to give it one)."""
        if self._geometry is None:
            self._geometry = Geometry.load(self.path)
        return self._geometry

    def events(self) -> list[dict[str, Any]]:
        """Every event of ``events.jsonl`` (a line still being written is left out)."""
        from qd import events

        path = self.path / EVENTS
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the writer's current line
                continue
        return [events.upgrade(e) for e in out]

    # ----- the archive ------------------------------------------------------------

    def centroids(self) -> np.ndarray | None:
        """f32[C, D] CVT centroids as the run saved them: a describer's fitted ones from the
        checkpoint, else ``centroids.npy`` (None for other archives, or a describer that has not
        fitted yet)."""
        g = self.geometry
        if g.kind != "cvt":
            return None
        if g.own_cells:
            from qd.rundir import checkpoint

            fitted = [
                v
                for k, v in checkpoint.load_arrays(self.path / CHECKPOINTS).items()
                if k.startswith("describer.") and k.endswith("centroids")
            ]
            return np.asarray(fitted[0], np.float32) if fitted else None
        path = self.path / CENTROIDS
        return np.load(path) if path.is_file() else None

    def spec(self) -> Any:
        """The run's tessellation (None: a describer's own CVT that has not fitted yet)."""
        if self._spec is None:
            self._spec = spec_of(self.geometry, self.centroids())
        return self._spec

    def version(self) -> tuple:
        """What the run's readings depend on: the checkpoint and event files, the store's newest rows."""
        files = [self.path / CHECKPOINTS / CHECKPOINT, self.path / EVENTS]
        stats = tuple((s.st_mtime_ns, s.st_size) if (s := _stat(f)) else None for f in files)
        return stats, self.store.marks()

    def memo(self, key: str, compute: Any) -> Any:
        """``compute()``, kept until the run changes (:meth:`version`): a live reader
        recomputes only as the run writes."""
        version = self.version()
        hit = self._memo.get(key)
        if hit is None or hit[0] != version:
            hit = self._memo[key] = (version, compute())
        return hit[1]

    def snapshot(self) -> Snapshot:
        """The archive now: the last checkpoint plus the store rows after it, replayed as a
        resume does."""
        return self.memo(
            "snapshot", lambda: replay.snapshot(self.path, self.store, self.geometry, self.spec())
        )

    def fronts(self) -> Any:
        """A Pareto run's fronts now, every member of every cell (``Snapshot.fronts``, empty
        fronts before anything is placed); None for one elite per cell."""
        if self.geometry.pareto is None:
            return None
        fronts = self.snapshot().fronts
        if fronts is None:
            import jax

            from qd.archive import pareto

            fronts = jax.device_get(pareto.init(self.spec(), self.geometry.islands))
        return fronts

    # ----- elites -------------------------------------------------------------------

    def placed(self, island: int | None = None, top: int | None = None) -> list[tuple[int, int, Any]]:
        """(island, cell, stored Candidate) of the archive's elites, best first (of one island when given)."""
        snap = self.snapshot()
        isl, cell = snap.filled(island)
        order = np.argsort(-snap.fitness[isl, cell], kind="stable")[:top]
        isl, cell = isl[order], cell[order]
        candidates = self.store.get(snap.genome_id[isl, cell].tolist())
        return [(int(i), int(k), c) for i, k, c in zip(isl, cell, candidates)]

    def elites(self, island: int | None = None, top: int | None = None) -> list[dict[str, Any]]:
        """The archive's elites, best first: each an :func:`elite_row` (of one island when given)."""
        snap = self.snapshot()
        return [elite_row(c, i, k, snap) for i, k, c in self.placed(island, top)]

    def best(self) -> dict[str, Any] | None:
        """The best elite (over every island), or None while the archive is empty."""
        top = self.elites(top=1)
        return top[0] if top else None


def _stat(path: Path) -> Any:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def elite_row(c: Any, island: int, cell: int, snap: Snapshot) -> dict[str, Any]:
    """One elite as ``elites.jsonl`` writes it: where it sits, its archive fitness and
    descriptor, and the stored candidate (genome, lineage, how it was made, its metrics)."""
    row = {
        "island": island,
        "cell": cell,
        "id": c.id,
        "fitness": float(snap.fitness[island, cell]),
        "descriptor": [float(x) for x in snap.descriptor[island, cell]],
        "genome": c.genome if c.kind == "text" else "vector",
        "parent_ids": list(c.parent_ids),
        "operator": c.operator,
        "model": c.model,
        "born_island": c.island,
        "metrics": c.metrics or {},
    }
    if c.kind == "text":
        row["text"] = c.text
    else:
        row["vector"] = [float(x) for x in c.vector]
    return row
