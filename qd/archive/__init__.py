"""The archive as a JAX pytree and pure, jitted functions over it (no text here)."""

import os

import jax

# qd reads every insert's results back on the host at once, so JAX's asynchronous
# dispatch on CPU only adds a thread hand-off: about 40% of a small insert's cost.
# GPU/TPU dispatch is unaffected. Set QD_CPU_ASYNC_DISPATCH=1 to keep JAX's default.
if os.environ.get("QD_CPU_ASYNC_DISPATCH") != "1":
    jax.config.update("jax_cpu_enable_async_dispatch", False)
# Random bits: JAX's "partitionable" threefry (its default since 0.5) costs XLA:CPU 1.6x the
# time of the classic one per bit, and a 256 x 100 Gaussian draw is the largest cost of a
# device-loop generation. qd runs on one device, where partitioning buys nothing. Set
# QD_THREEFRY_PARTITIONABLE=1 to keep JAX's default (the random streams then differ).
if os.environ.get("QD_THREEFRY_PARTITIONABLE") != "1":
    jax.config.update("jax_threefry_partitionable", False)

from qd.archive.cells import (
    IMPROVED,
    NEW_CELL,
    NOT_ADDED,
    InsertResult,
    insert_batch,
    insert_device,
    padded_size,
)
from qd.archive.centroid_index import CentroidIndex
from qd.archive.centroids import cvt_centroids
from qd.archive.cvt import CVTSpec
from qd.archive.grid import GridSpec
from qd.archive.kinds import KINDS, ArchiveKind, has_cells, insert, kind_of, rebuild
from qd.archive.migration import TOPOLOGIES, Migrants, migrate, select_migrants
from qd.archive.novelty import (
    NoveltySpec,
    NoveltyState,
    archive_novelty,
    knn,
    novelty,
    novelty_add,
    novelty_init,
    novelty_insert,
    novelty_insert_batch,
    novelty_rebuild,
)
from qd.archive.pareto import ParetoSpec, ParetoState
from qd.archive.select import Elites, elites, sample
from qd.archive.slots import Slots, best_per_cell, slots_of
from qd.archive.state import CMA_MAE, ArchiveState, init, reset, thresholds, with_thresholds
from qd.archive.stats import ArchiveStats, stats, union_stats

__all__ = [
    "ArchiveKind",
    "ArchiveState",
    "ArchiveStats",
    "CVTSpec",
    "CentroidIndex",
    "Elites",
    "GridSpec",
    "IMPROVED",
    "InsertResult",
    "KINDS",
    "Migrants",
    "NEW_CELL",
    "NOT_ADDED",
    "NoveltySpec",
    "NoveltyState",
    "ParetoSpec",
    "ParetoState",
    "Slots",
    "TOPOLOGIES",
    "archive_novelty",
    "best_per_cell",
    "cvt_centroids",
    "elites",
    "has_cells",
    "init",
    "insert",
    "insert_batch",
    "insert_device",
    "kind_of",
    "knn",
    "migrate",
    "novelty",
    "novelty_add",
    "novelty_init",
    "novelty_insert",
    "novelty_insert_batch",
    "novelty_rebuild",
    "padded_size",
    "rebuild",
    "reset",
    "sample",
    "select_migrants",
    "slots_of",
    "stats",
    "union_stats",
    "with_thresholds",
    "thresholds",
    "CMA_MAE",
]
