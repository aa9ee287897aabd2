"""Placement as state -> state: no store (a fake history), no run directory."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from qd import archive
from qd import state as run_state
from qd.contract import Candidate, Described, Descriptor
from qd.placement import Placement, values_of
from qd.search.scheduler import make_bandit

GRID = archive.GridSpec((4,), (0.0,), (1.0,))


def candidate(i: int, fitness: float, descriptor: float, metrics: dict | None = None) -> Candidate:
    return Candidate(
        id=i,
        kind="text",
        text=f"text {i}",
        island=0,
        fitness=fitness,
        descriptor=np.asarray([descriptor], np.float32),
        valid=True,
        metrics=metrics or {},
    )


class History:
    """The two reads placement makes of a store: every candidate, every offer in order."""

    def __init__(self, candidates: list[Candidate]):
        self.candidates = candidates

    def iter(self):
        return iter(self.candidates)

    def placements(self, after_id: int, dim: int, objectives: tuple = ()) -> dict[str, np.ndarray]:
        rows = [c for c in self.candidates if c.id > after_id]
        return {
            "id": np.asarray([c.id for c in rows], np.int64),
            "island": np.zeros(len(rows), np.int32),
            "fitness": values_of(rows, objectives),
            "descriptor": np.stack([c.descriptor for c in rows]).astype(np.float32),
            "valid": np.ones(len(rows), bool),
            "migrated": np.zeros(len(rows), bool),
            "reset": np.zeros(0, np.int32),
        }


def fresh(spec=GRID) -> run_state.RunState:
    return run_state.init(spec, 1, (make_bandit("fixed", 1, weights=np.ones(1)),), 1, 0)


@dataclasses.dataclass
class Halves:
    """A CycleQD-like rule: phase = insertions // 4; the quality alternates between two metrics."""

    names: tuple[str, str] = ("a", "b")

    def phase(self, insertions: int) -> int:
        return insertions // 4

    def spec(self, phase: int):
        return archive.GridSpec((2 + phase % 2,), (0.0,), (1.0,))

    def quality(self, phase: int) -> str:
        return self.names[phase % 2]

    def score(self, phase, metrics, valid):
        q, d = self.names[phase % 2], self.names[1 - phase % 2]
        fitness = np.asarray([m[q] for m in metrics], np.float32)
        descriptor = np.asarray([[m[d]] for m in metrics], np.float32)
        return fitness, descriptor, np.asarray(valid, bool), [None] * len(metrics)


class Fitted(Descriptor):
    """A fitted describer: needs a fit at 3 valid candidates; places by fitness after it."""

    dim = 1

    def __init__(self):
        self.fitted = False

    def needs_fit(self, num_valid: int) -> bool:
        return not self.fitted and num_valid >= 3

    async def fit(self, items, rng) -> None:
        self.fitted = True

    async def describe(self, items) -> Described:
        values = np.asarray([[min(max(it.fitness, 0.0), 1.0)] for it in items], np.float32)
        return Described(values, np.ones(len(items), bool), [None] * len(items))

    def state_dict(self):
        return {"fitted": np.asarray(self.fitted)}

    def load_state_dict(self, state) -> None:
        self.fitted = bool(state["fitted"])


def test_offers_count_the_valid_candidates_into_a_new_state():
    placement = Placement(GRID, None, None, "text", 1, 0)
    state = fresh()
    batch = [candidate(0, 1.0, 0.1), dataclasses.replace(candidate(1, 2.0, 0.6), valid=False)]
    after, offers = placement.offers(batch, state)
    assert after.counters.valid == 1 and state.counters.valid == 0  # by value: the input is unchanged
    assert offers.valid.tolist() == [True, False]
    assert offers.descriptor.shape == (2, 1)


def numbers(placement: Placement) -> dict:
    return {k: v for k, v in vars(placement).items() if isinstance(v, (int, float))}


def test_placement_holds_no_counter():
    """Placing, rotating and refitting move only the state's counters, never the placement's."""
    describer = Fitted()
    placement = Placement(GRID, describer, None, "text", 1, 0)
    history = History([candidate(i, 0.3 * i, 0.0) for i in range(4)])
    before = numbers(placement)
    state, _ = placement.offers(history.candidates, fresh())
    state, _ = asyncio.run(placement.refit(history, state))
    cyclic = Placement(GRID, None, Halves(), "text", 1, 0)
    cycled = numbers(cyclic)
    cyclic.rotate(History([candidate(0, 0.0, 0.0, {"a": 0.5, "b": 0.5})]), fresh().count(insertions=4))
    assert numbers(placement) == before and numbers(cyclic) == cycled
    assert state.counters.valid == 4 and state.counters.fits == 1


def test_a_phase_change_is_due_from_the_state_and_rotating_rebuilds_on_the_new_grid():
    placement = Placement(GRID, None, Halves(), "text", 1, 0)
    history = History([candidate(i, 0.0, 0.0, {"a": i / 10, "b": 1 - i / 10}) for i in range(5)])
    state = fresh(placement.spec()).count(insertions=5)
    assert placement.rotation_due(state) and placement.spec(state).num_cells == 2
    rotated, event = placement.rotate(history, state)
    assert event["phase"] == 1 and event["quality"] == "b" and event["placed"] == 5
    assert rotated.counters.phase == 1 and not placement.rotation_due(rotated)
    assert placement.spec(rotated).num_cells == 3 and rotated.archive.fitness.shape == (1, 3)
    assert state.counters.phase == 0  # the state it was given is untouched
    # the best under quality b (candidate 0, b = 1.0) holds the cell its a-metric (0.0) places it in
    assert int(rotated.archive.genome_id[0, 0]) == 0


def test_a_refit_is_due_from_the_counted_valid_candidates_and_refitting_replaces_every_one():
    describer = Fitted()
    placement = Placement(GRID, describer, None, "text", 1, 0)
    history = History([candidate(i, 0.3 * i, 0.0) for i in range(4)])
    state = fresh()
    assert not placement.refit_due(state.count(valid=2)) and placement.refit_due(state.count(valid=3))
    refitted, event = asyncio.run(placement.refit(history, state.count(valid=3)))
    assert event["fits"] == 1 and refitted.counters.fits == 1 and state.counters.fits == 0
    placed = sorted(int(i) for i in np.asarray(refitted.archive.genome_id[0]) if i >= 0)
    assert placed == [0, 1, 2, 3]  # fitness 0, .3, .6, .9 -> one cell each of the 4-cell grid
    assert not placement.refit_due(refitted)


def test_a_pareto_refit_rebuilds_the_fronts_from_each_candidates_objectives():
    objectives = (("error", "min"), ("size", "min"))
    fronts = archive.ParetoSpec(GRID, front_size=2, num_objectives=2)
    placement = Placement(fronts, Fitted(), None, "text", 1, 0, objectives)
    assert Placement(GRID, None, None, "text", 1, 0, objectives).objectives == ()  # one elite per cell
    scored = [(0.1, 1.0, 5), (0.15, 2.0, 3), (0.12, 3.0, 6), (0.9, 0.5, 9)]  # (fitness, error, size)
    history = History([candidate(i, f, 0.0, {"error": e, "size": n}) for i, (f, e, n) in enumerate(scored)])
    state, offers = placement.offers(history.candidates, fresh(fronts))
    np.testing.assert_array_equal(offers.values[1], [-2.0, -3.0])  # maximised: both negated
    assert offers.fitness.tolist() == np.float32([0.1, 0.15, 0.12, 0.9]).tolist()
    state, event = asyncio.run(placement.refit(history, state))
    ids = np.asarray(state.archive.genome_id)[0]  # the describer places by fitness: cells 0 and 3
    assert ids[0].tolist() == [0, 1] and ids[3].tolist() == [3, -1]  # 2 is dominated by 0
    assert event["placed"] == 4 and np.asarray(state.islands.migrant).shape == (1, 4)
