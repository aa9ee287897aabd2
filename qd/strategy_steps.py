"""The strategy's steps in the loop, after each commit and at resume.

What ``qd.search.strategy.Strategy`` asks of the engine besides choosing arms and
drawing parents: pay the arm, the parents' curiosity and the meta instructions
in archive improvement; island bookkeeping, migration and stagnation resets
(recorded in the store so rebuilds replay them); CycleQD scoring and
rotation; instruction evolution; and restoring their state from a checkpoint.
:class:`StrategySteps` is mixed into ``qd.loop.Engine``.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from qd import archive, checkpoint
from qd.search import select
from qd.search import islands as island_ops
from qd.llm import LLMError
from qd.proposal import Proposal, sample_index
from qd.search.scheduler import load_state_dict as load_bandit
from qd.store import Candidate
from qd.search.strategy import child_credit, proposal_cost


def _pad(x: Any, size: int) -> np.ndarray:
    """``x`` (leading axis B) zero-padded to ``size`` rows: jitted bookkeeping compiles once per size."""
    x = np.asarray(x)
    return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)])


class StrategySteps:
    """Strategy bookkeeping of ``qd.loop.Engine`` (a mixin: it reads and updates the
    engine's ``state``, ``istate``, ``curiosity``, ``_bandit_states``, ``meta``,
    ``_genomes``, ``store`` and ``counters``)."""

    def _restore_strategy(self, saved: dict[str, np.ndarray]) -> None:
        """Scheduler, island and curiosity state from the checkpoint's arrays (fresh if absent)."""
        self._bandit_states = [
            load_bandit(part, len(self.arms)) if (part := checkpoint.part(saved, f"bandit.{j}.")) else b.init(len(self.arms))
            for j, b in enumerate(self._bandits)
        ]
        shape = (self.islands, self.spec.num_cells)
        isl, cur = checkpoint.part(saved, "islands."), checkpoint.part(saved, "curiosity.")
        self.istate = (island_ops.IslandState(**isl) if isl and isl["migrant"].shape == shape
                       else island_ops.init(*shape))
        self.curiosity = (select.Curiosity(**cur) if cur and cur["score"].shape == shape
                          else select.curiosity_init(*shape))
        if self.meta is not None and self.counters.get("meta"):
            self.meta.load_state_dict(self.counters["meta"])

    def _phase(self) -> int:
        return self.strategy.cycle.phase(self.counters["insertions"])

    def _rotate(self) -> None:
        """CycleQD: the next metric becomes the quality; every stored candidate is re-scored."""
        started = time.monotonic()
        phase = self._phase()
        stored = [c for c in self.store.iter() if c.kind == self.task.kind]
        fitness, descriptor, valid, _ = self.strategy.cycle.score(
            phase, [c.metrics for c in stored], [c.valid for c in stored])
        self.spec = self.strategy.cycle.spec(phase)
        placed = self._rebuild([c.id for c in stored], fitness, descriptor, valid)
        self._log({"event": "rotate", "phase": phase, "quality": self.strategy.cycle.quality(phase),
                   "candidates": len(stored), "placed": placed, "elites": int(self._stats.num_elites[-1]),
                   "seconds": round(time.monotonic() - started, 3)})

    def _migrant_cells(self, offers: dict[str, np.ndarray]) -> np.ndarray:
        """bool[I, C]: elites that reached their island only as copies (migration,
        reseed), read off the placement history ``Store.placements`` returned."""
        own = ~offers["migrated"]
        native = set(zip(offers["island"][own].tolist(), offers["id"][own].tolist()))
        ids = np.asarray(self.state.genome_id)
        island, cell = np.nonzero(ids >= 0)
        out = np.zeros(ids.shape, bool)
        out[island, cell] = [(i, g) not in native for i, g in zip(island.tolist(), ids[island, cell].tolist())]
        return out

    def _score_cycle(self, candidates: list[Candidate]) -> None:
        """CycleQD: fitness and descriptors from the metrics, in the current phase."""
        fitness, descriptor, valid, errors = self.strategy.cycle.score(
            self._phase(), [c.metrics for c in candidates], [c.valid for c in candidates])
        for c, f, d, ok, error in zip(candidates, fitness, descriptor, valid, errors):
            c.fitness, c.descriptor = float(f), d
            if error is not None:
                c.valid, c.error = False, error

    def _credit(self, proposal: Proposal, result: archive.InsertResult,
                fitness: np.ndarray) -> dict[str, Any] | None:
        """Pays the arm, the parents' curiosity and the instructions in archive improvement."""
        gain = child_credit(result, fitness, self.qd_offset)
        if self.strategy.selection.parents == "curiosity":
            self._curiosity(proposal, result)
        meta = self.meta
        if meta is not None:
            for instruction, g in zip(proposal.instructions, gain):
                if instruction is not None:
                    meta.credit(instruction, float(g))
        if proposal.arm is None:
            return None
        cost = proposal_cost(proposal.candidates, self.strategy.cost)
        b = self._bandit_of(int(proposal.candidates[0].island))
        if cost > 0 and self.strategy.scheduler is not None:  # the default fixed weights learn nothing
            self._bandit_states[b] = self._bandits[b].update(
                self._bandit_states[b], proposal.arm, float(gain.sum()), cost)
        return {"arm": self.arms[proposal.arm].name, "credit": round(float(gain.sum()), 6), "cost": cost}

    def _record(self, island: np.ndarray, result: archive.InsertResult) -> None:
        """Island bookkeeping of one insert."""
        pad = functools.partial(_pad, size=archive.padded_size(len(island)))
        self.istate = island_ops.record(self.istate, self.state, pad(island), jax.tree_util.tree_map(pad, result),
                                        pad(np.ones(len(island), bool)))

    def _curiosity(self, proposal: Proposal, result: archive.InsertResult) -> None:
        """+1 to each parent still in its cell whose child entered, -0.5 if it did not;
        cells that a new genome entered start again from 0."""
        pad = functools.partial(_pad, size=archive.padded_size(len(proposal.candidates)))
        island, cell = np.maximum(proposal.parents, 0).T
        first = np.asarray([c.parent_ids[0] if len(c.parent_ids) else -1 for c in proposal.candidates])
        still = (proposal.parents[:, 0] >= 0) & (np.asarray(self.state.genome_id)[island, cell] == first)
        entered = np.asarray(result.is_elite)
        self.curiosity = select.curiosity_update(self.curiosity, pad(island), pad(cell), pad(entered), pad(still))
        self.curiosity = select.curiosity_reset(
            self.curiosity, pad(np.asarray([c.island for c in proposal.candidates])), pad(result.cell), pad(entered))

    def _island_dynamics(self) -> None:
        """Migration (islands due to send) and the stagnation reset, both jitted over islands."""
        policy = self.strategy.islands
        if policy.migrate_every and int(jnp.max(self.istate.since_migration)) >= policy.migrate_every:
            self.state, self.istate, m, result = island_ops.migrate(
                self.spec, self.state, self.istate, self._split(), policy.topology, policy.migrants,
                policy.migrate_every, self.learning_rate)
            self._copy_elites(m, result)
        if policy.reset_patience and int(self.istate.stale) >= policy.reset_patience:
            self.state, self.istate, reset, m, result = island_ops.reset_stagnant(
                self.spec, self.state, self.istate, self._split(), policy.reset_patience, self.learning_rate)
            reset = np.asarray(reset)
            if reset.any():
                self.store.add_reset(self.counters["last_id"], np.flatnonzero(reset))
                self._genomes[reset] = self._empty_genome_table()[reset]
                self._copy_elites(m, result)
                self._log({"event": "reset", "islands": np.flatnonzero(reset).tolist(),
                           "reseeded_from": np.asarray(m.source_island)[np.asarray(m.valid)].tolist()})
                self._checkpoint()

    def _copy_elites(self, m: archive.Migrants, result: archive.InsertResult) -> None:
        """Records copies between islands in the store and the host genome table."""
        valid = np.asarray(m.valid)
        self.store.add_migrations(
            self.counters["last_id"], np.asarray(m.genome_id)[valid], np.asarray(m.island)[valid])
        genomes = self._genomes[np.asarray(m.source_island), np.asarray(m.source_cell)]
        target, cells = np.asarray(m.island), np.asarray(result.cell)
        entered = np.asarray(result.is_elite) & valid
        for j in np.flatnonzero(entered):
            self._genomes[target[j], cells[j]] = genomes[j]
        if self.strategy.selection.parents == "curiosity":  # a new genome in a cell starts at 0
            pad = functools.partial(_pad, size=archive.padded_size(len(target)))
            self.curiosity = select.curiosity_reset(self.curiosity, pad(target), pad(cells), pad(entered))

    async def _evolve_instructions(self) -> None:
        """One LLM mutation of the instruction population (stored like any candidate)."""
        index = sample_index(self.counters["batches"], 0, stream=2)
        rng = np.random.default_rng([self.seed, 7, self.counters["batches"]])
        try:
            child = await self.counted(self.meta.evolve(self.llm, rng, index, model=self.strategy.meta_model))
        except LLMError as err:  # nothing added; a client that is down stops the run at the next check
            self._log({"event": "meta", "error": str(err)})
            return
        finally:
            self.counters["last_id"] = self.store.last_id()  # the pool's rows are not placements
        self._log({"event": "meta", "child": None if child is None else child.id,
                   "parent": None if child is None else child.parent_id, "failures": self.meta.failures,
                   "members": [[m.id, m.uses, round(m.mean, 6)] for m in self.meta.members]})
