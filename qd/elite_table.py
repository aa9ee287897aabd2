"""The elites' genomes on the host, and the read-only view of the archive that proposers get.

The archive (``qd.archive``) holds numbers: fitness, descriptors and the store
id of each cell's elite. Operators need the genomes themselves, so
:class:`EliteTable` keeps them beside the archive: ``f32[I, C, n]`` for vector
genomes, ``[I, C]`` store ``Candidate``s for text. :class:`ArchiveView` is what a
proposal may read when it starts: parents and inspirations drawn by the
selection rules (a wave's at once), and an island's elites; nothing else of the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from qd import archive
from qd.contract import Candidate
from qd.search import criteria, select
from qd.search.strategy import Selection


class EliteTable:
    """The genome of each archive elite, by (island, cell).

    Args:
        shape: (islands, cells).
        genome_dim: the vector length for numeric genomes; None for text (Candidates).
    """

    def __init__(self, shape: tuple[int, int], genome_dim: int | None):
        self.genome_dim = genome_dim
        self.table = (
            np.zeros((*shape, genome_dim), np.float32) if genome_dim is not None else np.empty(shape, object)
        )

    @classmethod
    def from_store(cls, state: archive.ArchiveState, store: Any, genome_dim: int | None) -> EliteTable:
        """The table of ``state``'s elites, read from the store in one query."""
        out = cls(state.fitness.shape, genome_dim)
        ids = np.asarray(state.genome_id)
        island, cell = np.nonzero(ids >= 0)
        if len(island):
            out.put(island, cell, store.get(ids[island, cell]))
        return out

    def put(self, island: np.ndarray, cell: np.ndarray, candidates: list[Candidate]) -> None:
        for i, c, cand in zip(island, cell, candidates):
            self.table[i, c] = cand.vector if self.genome_dim is not None else cand

    def enter(self, island: np.ndarray, result: archive.InsertResult, candidates: list[Candidate]) -> None:
        """Records the candidates of an insert that became elites."""
        won = np.flatnonzero(np.asarray(result.is_elite))
        cells = np.asarray(result.cell)
        self.put(island[won], cells[won], [candidates[j] for j in won])

    def copy(self, m: archive.Migrants, result: archive.InsertResult) -> np.ndarray:
        """Copies migrated elites to the cells they entered; returns bool[B] of those that did."""
        genomes = self.table[np.asarray(m.source_island), np.asarray(m.source_cell)]
        target, cells = np.asarray(m.island), np.asarray(result.cell)
        entered = np.asarray(result.is_elite) & np.asarray(m.valid)
        for j in np.flatnonzero(entered):
            self.table[target[j], cells[j]] = genomes[j]
        return entered

    def clear(self, islands: np.ndarray) -> None:
        """Empties the rows of the islands in the bool[I] mask (after a reset)."""
        self.table[islands] = 0 if self.genome_dim is not None else None


@dataclasses.dataclass(frozen=True)
class ArchiveView:
    """What a proposal may read of the archive, as it was when the proposal started.

    Read it only while the proposal starts (synchronously, in ``Proposer.start``):
    the driver's next insert donates the archive's buffers and updates the elite
    table in place. A proposal therefore sees the archive of its start, whatever
    commits happen while it runs.
    """

    state: archive.ArchiveState
    curiosity: select.Curiosity
    elites: EliteTable
    selection: Selection

    def picks(
        self,
        rng: np.random.Generator,
        keys: Callable[[int], jax.Array],
        island: np.ndarray,
        num_parents: np.ndarray,
        children: int,
        max_parents: int,
        inspirations: int,
    ) -> select.Picks:
        """Parents and inspirations of a wave's proposals by the selection rules, as host arrays (i64).

        Uniform rules are drawn on the host from ``rng`` (``qd.search.select.wave_uniform``);
        the others in one jitted dispatch (``qd.search.select.wave``) with keys made by
        ``keys(n)`` (keys [n], from ``rng``).
        """
        s = self.selection
        if s.parents == "uniform" and (
            not inspirations
            or s.inspirations == "uniform"
            or (s.inspirations == "islands" and self.state.num_islands == 1)
        ):
            return select.wave_uniform(
                np.asarray(self.state.genome_id),
                rng,
                island,
                num_parents,
                children,
                max_parents,
                inspirations,
            )
        picks = select.wave(
            self.state,
            keys(len(island)),
            keys(len(island)),
            island,
            num_parents,
            children,
            max_parents,
            s.parents,
            self.curiosity,
            s.temperature,
            s.k,
            inspirations,
            s.inspirations,
            self._scores()
            if criteria.needs_scores(s.parents, s.inspirations if inspirations else "")
            else None,
        )
        return select.Picks(*(np.asarray(x, np.int64) for x in jax.device_get(picks)))

    def _scores(self) -> criteria.Scores:
        """What the rules by objectives and per-row scores read: the elites' stored metrics."""
        s, table = self.selection, self.elites.table
        return criteria.scores_of(
            self.state, table if table.dtype == object else None, s.objectives, s.reference, s.parents
        )

    def genomes(self, island: Any, cells: Any) -> Any:
        """The elites' genomes at (island, cells)."""
        return self.elites.table[island, cells]

    def island_elites(self, island: int) -> list[Candidate]:
        """Every elite of ``island``."""
        filled = np.flatnonzero(np.asarray(self.state.genome_id[island]) >= 0)
        return [self.elites.table[island, c] for c in filled]
