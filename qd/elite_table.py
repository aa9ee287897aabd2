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
from qd.search import select
from qd.search.strategy import Selection


class EliteTable:
    """The genome of each archive elite, by (island, slot): a cell, or a place in a cell's
    Pareto front (``qd.archive.slots``).

    Args:
        shape: (islands, slots).
        genome_dim: the vector length for numeric genomes; None for text (Candidates).
    """

    def __init__(self, shape: tuple[int, int], genome_dim: int | None):
        self.genome_dim = genome_dim
        self.table = (
            np.zeros((*shape, genome_dim), np.float32) if genome_dim is not None else np.empty(shape, object)
        )
        self.ids = np.full(shape, -1, np.int64)  # the store id each row holds the genome of

    @classmethod
    def from_store(cls, state: Any, store: Any, genome_dim: int | None) -> EliteTable:
        """The table of ``state``'s elites, read from the store in one query."""
        ids = np.asarray(archive.slots_of(state).elites.genome_id)
        out = cls(ids.shape, genome_dim)
        island, slot = np.nonzero(ids >= 0)
        if len(island):
            out.put(island, slot, store.get(ids[island, slot]))
        return out

    def put(self, island: np.ndarray, slot: np.ndarray, candidates: list[Candidate]) -> None:
        for i, c, cand in zip(island, slot, candidates):
            self.table[i, c] = cand.vector if self.genome_dim is not None else cand
            self.ids[i, c] = -1 if cand.id is None else cand.id

    def enter(self, state: Any, candidates: list[Candidate] = ()) -> None:
        """Takes in the archive ``state`` after an insert, a migration or a reset: each slot
        whose elite changed gets its genome from ``candidates`` (the insert's, with their
        store ids) or, for a copy, from the row that held it; an emptied slot is cleared."""
        ids = np.array(archive.slots_of(state).elites.genome_id, np.int64)
        island, slot = np.nonzero(ids != self.ids)
        if not len(island):
            return
        new = {c.id: (c.vector if self.genome_dim is not None else c) for c in candidates}
        empty = 0 if self.genome_dim is not None else None
        genomes = [
            empty if g < 0 else new[g] if g in new else self._held(g) for g in ids[island, slot].tolist()
        ]
        for i, c, genome in zip(island, slot, genomes):
            self.table[i, c] = genome
        self.ids = ids

    def _held(self, genome_id: int) -> Any:
        """The genome of an elite the table holds (a copy for vectors: its row may change)."""
        row = self.table[tuple(np.argwhere(self.ids == genome_id)[0])]
        return row.copy() if self.genome_dim is not None else row


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

    def __post_init__(self) -> None:
        # Rules draw (island, slot)s: the archive's slots (``qd.archive.slots_of``), a cell
        # each for one elite per cell, the C*K members' places for Pareto fronts.
        object.__setattr__(self, "state", archive.slots_of(self.state).elites)

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
        )
        return select.Picks(*(np.asarray(x, np.int64) for x in jax.device_get(picks)))

    def genomes(self, island: Any, cells: Any) -> Any:
        """The elites' genomes at (island, cells)."""
        return self.elites.table[island, cells]

    def island_elites(self, island: int) -> list[Candidate]:
        """Every elite of ``island``."""
        filled = np.flatnonzero(np.asarray(self.state.genome_id[island]) >= 0)
        return [self.elites.table[island, c] for c in filled]
