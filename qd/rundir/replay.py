"""The store's rows after a checkpoint, replayed into the archive: what a resume and a reader both do.

A checkpoint holds the archive as it was at store row ``last_id``; every row (and
recorded migration or island reset) after it is in the store. :func:`replay`
inserts those into the checkpointed archive -- the engine's resume after
``kill -9`` and a reader's :func:`snapshot` call the same function, so a reader
sees exactly the archive a resume would rebuild.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from qd.rundir.layout import CHECKPOINTS, Geometry


class PlacementLog(Protocol):
    """What a replay reads from the store: the archive offers after a row, and the newest row."""

    def placements(
        self, after_id: int = -1, descriptor_dim: int | None = None, objectives: tuple = ()
    ) -> dict[str, np.ndarray]: ...

    def last_id(self) -> int: ...


class Replayed(NamedTuple):
    """The archive and island bookkeeping after a replay, with what it took in.

    Attributes:
        archive: the ``qd.archive.ArchiveState`` after the replayed offers.
        islands: the ``qd.search.islands.IslandState`` after them.
        offered: candidates and migrants offered (the replay's insertions).
        last_id: the newest store row the archive now reflects.
    """

    archive: Any
    islands: Any
    offered: int
    last_id: int


def replay(
    log: PlacementLog, spec: Any, archive: Any, islands: Any, after_id: int, objectives: tuple = ()
) -> Replayed | None:
    """Inserts every store row (and migration) newer than ``after_id`` into ``archive``; islands
    reset after it restart empty, then one batched insert (``archive`` is donated). None: the
    store holds nothing newer. ``objectives``: a Pareto archive's (``Geometry.objectives``),
    whose values are read from the rows' metrics."""
    from qd.search import islands as island_ops

    offers = log.placements(after_id, spec.descriptor_dim, objectives)
    if not len(offers["id"]) and not len(offers["reset"]):
        return None
    archive, islands, _ = island_ops.replay(spec, archive, islands, offers)
    return Replayed(archive, islands, len(offers["id"]), log.last_id())


class Snapshot(NamedTuple):
    """The archive as a resume would rebuild it, on the host.

    Attributes:
        fitness: f32[I, C] (NaN where empty).
        descriptor: f32[I, C, D].
        genome_id: i64[I, C], the store id of each cell's elite (-1 where empty).
        last_id: the newest store row reflected.
        checkpoint_id: the newest row the checkpoint held (-1: no checkpoint yet).
        evaluations: candidates in the store.
        fronts: a Pareto archive's whole state on the host (``qd.archive.ParetoState``: every
            front), whose best member per cell the arrays above hold; None for the other kinds.
    """

    fitness: np.ndarray
    descriptor: np.ndarray
    genome_id: np.ndarray
    last_id: int
    checkpoint_id: int
    evaluations: int
    fronts: Any = None

    def filled(self, island: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(island, cell) index arrays of the filled cells (of one island when given)."""
        isl, cell = np.nonzero(self.genome_id >= 0)
        if island is not None:
            keep = isl == island
            isl, cell = isl[keep], cell[keep]
        return isl, cell


def snapshot(run_dir: Path, store: Any, g: Geometry, spec: Any) -> Snapshot:
    """The archive now: the last checkpoint plus the store rows after it, replayed in memory
    (nothing is written; ``store`` may be opened read-only). A device loop's store is
    written at its checkpoints, so its checkpoint alone is the archive."""
    import jax

    from qd import archive
    from qd.rundir import checkpoint
    from qd.search import islands as island_ops

    evaluations = store.count()
    loaded = checkpoint.load(run_dir / CHECKPOINTS)
    state, counters = (loaded[0], loaded[2]) if loaded is not None else (None, {})
    checkpoint_id = int(counters.get("last_id", -1))
    last_id = checkpoint_id
    if spec is not None and counters.get("loop") != "device":
        if state is None:
            state = archive.kinds.init(spec, g.islands)
        done = replay(store, spec, state, island_ops.init(g.islands, g.cells), checkpoint_id, g.objectives)
        if done is not None:
            state, last_id = done.archive, done.last_id
    if state is None:  # nothing placed yet
        return Snapshot(
            np.full((g.islands, g.cells), np.nan, np.float32),
            np.zeros((g.islands, g.cells, g.dim), np.float32),
            np.full((g.islands, g.cells), -1, np.int64),
            -1,
            -1,
            evaluations,
        )
    fronts = jax.device_get(state) if g.pareto else None
    state = archive.best_per_cell(state)  # a front shows its best member (``qd.archive.slots``)
    fitness, descriptor, ids = (
        np.asarray(x) for x in jax.device_get((state.fitness, state.descriptor, state.genome_id))
    )
    ids = ids.astype(np.int64)
    return Snapshot(
        np.where(ids >= 0, fitness, np.nan).astype(np.float32),
        descriptor.astype(np.float32),
        ids,
        last_id,
        checkpoint_id,
        evaluations,
        fronts,
    )
