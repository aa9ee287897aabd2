"""SearchStep as state -> state: fake proposals and a fake instruction pool, no store, no run."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from qd import archive
from qd import state as run_state
from qd.contract import Candidate
from qd.search.scheduler import make_bandit
from qd.search.step import SearchStep
from qd.search.strategy import Arm, Strategy

GRID = archive.GridSpec((4,), (0.0,), (1.0,))


@dataclasses.dataclass
class Op:
    name: str
    num_parents: int = 1


@dataclasses.dataclass
class Proposal:
    candidates: list[Candidate]
    arm: int | None
    parents: np.ndarray
    instructions: list[int | None]


class Pool:
    """The two calls the search step makes of an instruction pool."""

    def __init__(self):
        self.credit_of: dict[int, float] = {}

    def credit(self, instruction: int, gain: float) -> None:
        self.credit_of[instruction] = self.credit_of.get(instruction, 0.0) + gain

    def state_dict(self) -> dict:
        return {"credit": dict(self.credit_of)}


def child(i: int, fitness: float, x: float) -> Candidate:
    return Candidate(
        kind="text",
        island=0,
        fitness=fitness,
        descriptor=np.asarray([x], np.float32),
        valid=True,
        id=i,
        model="m",
        parent_ids=(),
    )


def step(pool=None) -> tuple[SearchStep, run_state.RunState]:
    bandit = make_bandit("ucb1", 2)
    strategy = Strategy(scheduler=(bandit,))
    arms = [Arm(Op("a")), Arm(Op("b"))]
    search = SearchStep(strategy, arms, (bandit,), 1, 0.0, pool)
    return search, run_state.init(GRID, 1, (bandit,), 2, 0)


def inserted(state: run_state.RunState, candidates: list[Candidate]):
    a, result = archive.insert(
        GRID,
        state.archive,
        np.zeros(len(candidates), np.int32),
        np.stack([c.descriptor for c in candidates]),
        np.asarray([c.fitness for c in candidates], np.float32),
        np.asarray([c.id for c in candidates]),
        np.ones(len(candidates), bool),
    )
    return state._replace(archive=a), result


def test_after_insert_pays_each_proposals_arm_in_a_new_state():
    search, state = step()
    first, second = [child(0, 2.0, 0.1)], [child(1, 0.5, 0.6), child(2, 0.25, 0.9)]
    proposals = [
        Proposal(first, 1, np.full((1, 2), -1), [None]),
        Proposal(second, 0, np.full((2, 2), -1), [None, None]),
    ]
    before, result = inserted(state, first + second)
    after, credits, moves = search.after_insert(
        before, GRID, proposals, np.zeros(3, np.int32), result, np.asarray([2.0, 0.5, 0.25], np.float32)
    )
    assert [c["arm"] for c in credits] == ["b", "a"] and moves == []
    assert [c["credit"] for c in credits] == [2.0, 0.75]  # new cells: their fitness above offset 0
    pulls = np.asarray(after.bandits[0].pulls)
    assert pulls.tolist() == [1.0, 1.0] and np.asarray(before.bandits[0].pulls).tolist() == [0.0, 0.0]


def test_founders_pay_no_arm():
    search, state = step()
    founders = [child(0, 1.0, 0.1)]
    before, result = inserted(state, founders)
    after, credits, _ = search.after_insert(
        before,
        GRID,
        [Proposal(founders, None, np.full((1, 2), -1), [None])],
        np.zeros(1, np.int32),
        result,
        np.asarray([1.0], np.float32),
    )
    assert credits == [None] and np.asarray(after.bandits[0].pulls).sum() == 0


def test_the_instruction_pools_credit_is_in_the_returned_state():
    pool = Pool()
    search, state = step(pool)
    children = [child(0, 1.5, 0.1), child(1, 0.5, 0.6)]
    before, result = inserted(state, children)
    after, _, _ = search.after_insert(
        before,
        GRID,
        [Proposal(children, 0, np.full((2, 2), -1), [7, None])],
        np.zeros(2, np.int32),
        result,
        np.asarray([1.5, 0.5], np.float32),
    )
    assert after.meta == {"credit": {7: 1.5}} and before.meta is None


def test_choose_is_a_function_of_the_state_and_the_keys():
    search, state = step()
    keys = jax.random.split(jax.random.key(1), 6)
    islands = np.zeros(6, np.int64)
    arms = search.choose(state, islands, lambda: keys)
    assert np.array_equal(arms, search.choose(state, islands, lambda: keys))
    assert set(arms.tolist()) <= {0, 1}
