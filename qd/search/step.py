"""The search's moves around each insert: choose an arm before a proposal, pay it after.

:meth:`SearchStep.after_insert` takes the run state, the proposals committed
together and their one insert's result, and returns the new state, each
proposal's credit and the island moves (migrations, resets) for the driver to record:

- each arm's bandit is paid its proposal's archive improvement per unit of cost;
- the parents' curiosity: +1 when a child entered, -0.5 when not; a cell a new
  genome entered starts again from 0;
- the meta instructions shown in the prompts are paid their children's credit;
- islands: bookkeeping, migration when an island is due to send, and the
  stagnation reset of the weakest half (both jitted over the island axis).

:meth:`SearchStep.evolve_instructions` is meta-prompt evolution's turn: one LLM
mutation of the instruction pool, when the pool says it is due.

Credit is one currency: a child's contribution to the QD score (``qd.search.strategy``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd import archive
from qd.contract import LLMError, sample_index
from qd.search import islands as island_ops
from qd.search import select
from qd.search.state import RunState
from qd.search.strategy import Strategy, child_credit, proposal_cost


class Move(NamedTuple):
    """Elites copied between islands: a migration, or a reset's reseeding (``reset``: the
    bool[I] mask of islands emptied first; None for a migration)."""

    migrants: archive.Migrants
    result: archive.InsertResult
    reset: np.ndarray | None = None


def _pad(x: Any, size: int) -> np.ndarray:
    """``x`` (leading axis B) zero-padded to ``size`` rows: jitted bookkeeping compiles once per size."""
    x = np.asarray(x)
    return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)])


class SearchStep:
    """The strategy's per-proposal decisions and bookkeeping.

    Args:
        strategy: the run's ``qd.search.strategy.Strategy``.
        arms: the ``Arm``s proposals are made with.
        bandits: one ``qd.search.scheduler.Bandit`` per island, or one shared.
        islands: the island count.
        meta: the ``operators.meta.InstructionPool`` or None.
    """

    def __init__(
        self,
        strategy: Strategy,
        arms: list[Any],
        bandits: tuple[Any, ...],
        islands: int,
        qd_offset: float,
        meta: Any = None,
    ):
        self.strategy, self.arms, self.bandits, self.islands = strategy, arms, bandits, islands
        self.qd_offset, self.meta = qd_offset, meta

    def _bandit_of(self, island: int) -> int:
        return island if len(self.bandits) > 1 else 0

    def choose(self, state: RunState, islands: np.ndarray, keys: Callable[[], jax.Array]) -> np.ndarray:
        """The arms i64[R] of a wave's proposals on ``islands`` (i64[R]), each chosen with its key
        (``keys()``: keys [R]): one dispatch per bandit the wave uses; with one arm, none (no keys)."""
        if len(self.arms) == 1:
            return np.zeros(len(islands), np.int64)
        bandit, wave_keys = islands if len(self.bandits) > 1 else np.zeros_like(islands), keys()
        arms = np.zeros(len(islands), np.int64)
        for b in np.unique(bandit):
            arms = np.where(
                bandit == b, np.asarray(self.bandits[b].choose_many(state.bandits[b], wave_keys)), arms
            )
        return arms

    def after_insert(
        self,
        state: RunState,
        spec: Any,
        proposals: list[Any],
        island: np.ndarray,
        result: archive.InsertResult,
        fitness: np.ndarray,
    ) -> tuple[RunState, list[dict | None], list[Move]]:
        """Credit, curiosity and island dynamics after one insert of ``proposals``' candidates,
        in order (see the module doc); the credit is per proposal."""
        gain = child_credit(result, fitness, self.qd_offset)
        if self.strategy.selection.parents == "curiosity":
            state = self._curiosity(state, proposals, result)
        if self.meta is not None:  # the pool is paid, and the state holds what it now knows
            for instruction, g in zip((i for p in proposals for i in p.instructions), gain):
                if instruction is not None:
                    self.meta.credit(instruction, float(g))
            state = state._replace(meta=self.meta.state_dict())
        credits, start = [], 0
        for p in proposals:
            state, credit = self._pay_arm(state, p, gain[start : start + len(p.candidates)])
            credits.append(credit)
            start += len(p.candidates)
        moves: list[Move] = []
        if self.islands > 1:
            pad = functools.partial(_pad, size=archive.padded_size(len(island)))
            state = state._replace(
                islands=island_ops.record(
                    state.islands,
                    state.archive,
                    pad(island),
                    jax.tree_util.tree_map(pad, result),
                    pad(np.ones(len(island), bool)),
                )
            )
            state, moves = self._island_dynamics(state, spec)
        return state, credits, moves

    def _pay_arm(self, state: RunState, proposal: Any, gain: np.ndarray) -> tuple[RunState, dict | None]:
        if proposal.arm is None:  # founders: no arm was pulled
            return state, None
        cost = proposal_cost(proposal.candidates, self.strategy.cost)
        if cost > 0 and self.strategy.scheduler is not None:  # the default fixed weights learn nothing
            b = self._bandit_of(int(proposal.candidates[0].island))
            bandits = list(state.bandits)
            bandits[b] = self.bandits[b].update(bandits[b], proposal.arm, float(gain.sum()), cost)
            state = state._replace(bandits=tuple(bandits))
        return state, {
            "arm": self.arms[proposal.arm].name,
            "credit": round(float(gain.sum()), 6),
            "cost": cost,
        }

    def _curiosity(self, state: RunState, proposals: list[Any], result: archive.InsertResult) -> RunState:
        """+1 to each parent still in its cell whose child entered, -0.5 if it did not;
        cells that a new genome entered start again from 0."""
        candidates = [c for p in proposals for c in p.candidates]
        parents = np.concatenate([p.parents for p in proposals])
        pad = functools.partial(_pad, size=archive.padded_size(len(candidates)))
        island, cell = np.maximum(parents, 0).T
        first = np.asarray([c.parent_ids[0] if len(c.parent_ids) else -1 for c in candidates])
        still = (parents[:, 0] >= 0) & (np.asarray(state.archive.genome_id)[island, cell] == first)
        entered = np.asarray(result.is_elite)
        cur = select.curiosity_update(state.curiosity, pad(island), pad(cell), pad(entered), pad(still))
        cur = select.curiosity_reset(
            cur, pad(np.asarray([c.island for c in candidates])), pad(result.cell), pad(entered)
        )
        return state._replace(curiosity=cur)

    def _island_dynamics(self, state: RunState, spec: Any) -> tuple[RunState, list[Move]]:
        """Migration (islands due to send) and the stagnation reset."""
        policy, moves = self.strategy.islands, []
        if policy.migrate_every and int(jnp.max(state.islands.since_migration)) >= policy.migrate_every:
            state, key = state.split()
            a, isl, m, result = island_ops.migrate(
                spec,
                state.archive,
                state.islands,
                key,
                policy.topology,
                policy.migrants,
                policy.migrate_every,
            )
            state = self._moved(state._replace(archive=a, islands=isl), m, result)
            moves.append(Move(m, result))
        if policy.reset_patience and int(state.islands.stale) >= policy.reset_patience:
            state, key = state.split()
            a, isl, reset, m, result = island_ops.reset_stagnant(
                spec, state.archive, state.islands, key, policy.reset_patience
            )
            state = state._replace(archive=a, islands=isl)
            reset = np.asarray(reset)
            if reset.any():
                state = self._moved(state, m, result)
                moves.append(Move(m, result, reset))
        return state, moves

    def _moved(self, state: RunState, m: archive.Migrants, result: archive.InsertResult) -> RunState:
        """A new genome in a cell starts its curiosity at 0."""
        if self.strategy.selection.parents != "curiosity":
            return state
        entered = np.asarray(result.is_elite) & np.asarray(m.valid)
        pad = functools.partial(_pad, size=archive.padded_size(len(entered)))
        return state._replace(
            curiosity=select.curiosity_reset(
                state.curiosity, pad(np.asarray(m.island)), pad(np.asarray(result.cell)), pad(entered)
            )
        )

    async def evolve_instructions(self, llm: Any, batches: int, seed: int) -> dict[str, Any]:
        """One LLM mutation of the instruction pool (stored like any candidate); its ``meta`` event."""
        rng, index = np.random.default_rng([seed, 7, batches]), sample_index(batches, 0, stream=2)
        try:
            child = await self.meta.evolve(llm, rng, index, model=self.strategy.meta_model)
        except LLMError as err:  # nothing added; a client that is down stops the run at the next check
            return {"error": str(err)}
        return {
            "child": None if child is None else child.id,
            "parent": None if child is None else child.parent_id,
            "failures": self.meta.failures,
            "members": [[m.id, m.uses, round(m.mean, 6)] for m in self.meta.members],
        }
