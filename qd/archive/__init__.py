"""The archive as a JAX pytree and pure, jitted functions over it (no text here)."""

from qd.archive.grid import GridSpec
from qd.archive.insert import (
    IMPROVED,
    NEW_CELL,
    NOT_ADDED,
    InsertResult,
    insert,
    insert_batch,
    padded_size,
    rebuild,
)
from qd.archive.migration import TOPOLOGIES, Migrants, migrate, select_migrants
from qd.archive.novelty import NoveltyState, novelty, novelty_add, novelty_init
from qd.archive.select import Elites, elites, sample
from qd.archive.state import ArchiveState, init, reset
from qd.archive.stats import ArchiveStats, stats

__all__ = [
    "ArchiveState", "ArchiveStats", "Elites", "GridSpec", "IMPROVED", "InsertResult",
    "Migrants", "NEW_CELL", "NOT_ADDED", "NoveltyState", "TOPOLOGIES", "elites", "init", "insert",
    "insert_batch", "migrate", "novelty", "novelty_add", "novelty_init",
    "padded_size", "rebuild", "reset", "sample", "select_migrants", "stats",
]
