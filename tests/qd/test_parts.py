"""The engine's parts on their own: the budget ledger, the run state and its checkpoint,
the archive view, the events log."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd import archive, events
from qd import state as run_state
from qd.archive import pareto
from qd.budget import Budget, Spending
from qd.contract import Candidate
from qd.elite_table import ArchiveView, EliteTable
from qd.llm import Ledger
from qd.search import scheduler
from qd.search.strategy import Selection

SPEC = archive.GridSpec((4, 4), (0.0, 0.0), (1.0, 1.0))


def _calls(n: int, tokens: int = 0) -> Ledger:
    """A ledger of ``n`` answered operator calls (and ``tokens`` tokens in)."""
    return Ledger.from_rows([("operator", "m", n, 0, 0, 0, tokens, 0, 0.0)])


def test_spending_sizes_proposals_to_what_evaluations_and_calls_leave():
    s = Spending(
        Budget(max_evaluations=10, max_llm_calls=7), evaluations=2, spent=_calls(1), calls_per_child=2
    )
    assert s.size(64) == 3  # (7 - 1) calls // 2 per child
    s.reserve(3)
    assert s.size(64) == 0 and s.calls_left() == 0
    s.commit(3, reserved=3, calls=_calls(6))
    assert (s.evaluations, s.reserved, s.spent.calls, s.size(64)) == (5, 0, 7, 0)


def test_spending_resample_reserves_a_call_only_while_room_and_not_stopping():
    s = Spending(Budget(max_llm_calls=3), 0, Ledger(), calls_per_child=1)
    s.reserve(2)
    assert s.try_reserve_call() and s.reserved == 3
    assert not s.try_reserve_call()  # no call left
    free = Spending(Budget(), 0, Ledger(), calls_per_child=1)
    free.stopping = True
    assert not free.try_reserve_call() and math.isinf(free.calls_left())


def test_spending_trial_holds_an_evaluation_and_its_calls_until_its_proposal_commits():
    s = Spending(
        Budget(max_evaluations=4, max_llm_calls=5), 0, Ledger(), calls_per_child=2, calls_per_trial=1
    )
    s.reserve(1)
    assert s.try_reserve_trial() and s.try_reserve_trial() and s.trials == 2
    assert s.size(64) == 0 and s.calls_left() == 1  # 4 - 1 child - 2 trials; 5 - 2 - 2
    assert s.try_reserve_trial() and not s.try_reserve_trial()  # no evaluation left
    s.commit(4, reserved=1, calls=_calls(1), trials=3)
    assert (s.evaluations, s.reserved, s.trials) == (4, 0, 0) and not s.try_reserve_trial()
    stopping = Spending(Budget(), 0, Ledger(), calls_per_child=1)
    stopping.stop()
    assert not stopping.try_reserve_trial()


def test_spending_exhausted_by_time_tokens_or_cost():
    s = Spending(Budget(max_seconds=5, max_tokens=100), 0, Ledger(), 1)
    assert not s.exhausted(4.9, None)
    assert s.exhausted(5.0, None)
    assert not s.exhausted(0.0, _calls(1, tokens=99))
    assert s.exhausted(0.0, _calls(1, tokens=100))


def test_run_state_saves_and_loads_as_the_checkpoint(tmp_path):
    bandits = (scheduler.make_bandit("ucb1", 3),)
    fresh = run_state.init(SPEC, 2, bandits, 3, seed=7)
    a, _ = archive.insert(
        SPEC,
        fresh.archive,
        np.asarray([0, 1], np.int32),
        np.asarray([[0.1, 0.1], [0.9, 0.9]], np.float32),
        np.asarray([1.0, 2.0], np.float32),
        np.asarray([0, 1]),
    )
    b = bandits[0].update(fresh.bandits[0], 1, 2.0, 1.0)
    state = fresh._replace(
        archive=a, bandits=(b,), meta={"members": [1]}, describer={"w": np.ones(3, np.float32)}
    ).count(batches=4, last_id=1, fits=1)
    run_state.save(tmp_path, state)
    back = run_state.load(tmp_path, fresh)
    assert back.counters == state.counters and back.meta == {"members": [1]}
    np.testing.assert_array_equal(back.describer["w"], np.ones(3))
    for x, y in zip(
        jax.tree_util.tree_leaves((back.archive, back.bandits, back.islands, back.curiosity)),
        jax.tree_util.tree_leaves((state.archive, state.bandits, state.islands, state.curiosity)),
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(jax.random.key_data(back.key), jax.random.key_data(state.key))
    assert run_state.load(tmp_path / "none", fresh) is None


def test_run_state_loads_old_counters_and_fills_missing_parts_from_fresh(tmp_path):
    from qd.rundir import checkpoint

    fresh = run_state.init(SPEC, 1, (scheduler.make_bandit("fixed", 2),), 2, seed=0)
    checkpoint.save(tmp_path, fresh.archive, fresh.key, {"batches": 3, "last_id": 9, "elapsed": 1.5})
    back = run_state.load(tmp_path, fresh)
    assert back.counters == run_state.Counters(batches=3, last_id=9, elapsed=1.5)
    for x, y in zip(jax.tree_util.tree_leaves(back.bandits), jax.tree_util.tree_leaves(fresh.bandits)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # not in the old checkpoint: fresh


def test_a_proposal_reads_the_archive_when_it_starts_not_when_it_runs():
    """The driver's next insert donates the archive's buffers, and commits land while
    proposals run: a wave draws its parents when it hands out tickets, and a proposer
    reads their genomes synchronously, in ``start``."""
    import asyncio

    from qd.contract import Operator
    from qd.proposers import VectorProposer, Wave
    from qd.search import select
    from qd.search.step import SearchStep
    from qd.search.strategy import Arm, Strategy
    from qd.task import Evaluation

    class Copy(Operator):  # a numeric operator: the first parent, unchanged
        name, num_parents = "copy", 1

        async def __call__(self, key, parents, context):
            return parents[:, 0]

    async def evaluate(genomes):
        n = len(genomes)
        return Evaluation(np.zeros(n, np.float32), np.full((n, 2), 0.5, np.float32), np.ones(n, bool))

    state = archive.init(SPEC, 1)
    elites = EliteTable(state.fitness.shape, genome_dim=2)
    state, result = archive.insert(
        SPEC,
        state,
        np.zeros(1, np.int32),
        np.asarray([[0.1, 0.1]], np.float32),
        np.asarray([1.0], np.float32),
        np.asarray([5]),
    )
    elites.table[0, int(result.cell[0])] = [3.0, 4.0]
    view = ArchiveView(state, select.curiosity_init(1, SPEC.num_cells), elites, Selection())
    arms, bandits = [Arm(Copy())], (scheduler.make_bandit("fixed", 1),)
    run = run_state.init(SPEC, 1, bandits, 1, 0)
    ticket = Wave(run, 2, view, SearchStep(Strategy(), arms, bandits, 1, 0.0), 4).ticket(0, 0, 4, False)
    work = VectorProposer(None, arms, evaluate).start(ticket, view)
    archive.insert(
        SPEC,
        state,
        np.zeros(1, np.int32),
        np.asarray([[0.9, 0.9]], np.float32),  # donates
        np.asarray([9.0], np.float32),
        np.asarray([6]),
    )
    elites.table[:] = -1.0
    proposal = asyncio.run(work)
    assert [list(c.parent_ids) for c in proposal.candidates] == [[5]] * 4
    np.testing.assert_array_equal([c.vector for c in proposal.candidates], [[3.0, 4.0]] * 4)


def test_the_elite_table_follows_a_front_through_inserts_copies_and_resets():
    spec = archive.ParetoSpec(archive.GridSpec((2,), (0.0,), (1.0,)), front_size=2, num_objectives=2)
    made = [Candidate("text", 0, 0.0, None, True, text=f"p{i}", id=i) for i in range(3)]
    state, _ = pareto.insert(
        spec, pareto.init(spec, 2), 0, [[0.2], [0.3], [0.9]], [[2, 0], [0, 2], [1, 1]], [0, 1, 2]
    )
    elites = EliteTable((2, 4), genome_dim=None)
    elites.enter(state, made)
    assert [c.text if c else None for c in elites.table[0]] == ["p0", "p1", "p2", None]
    moved = pareto.insert(spec, state, 1, [[0.9]], [[1, 1]], [2])[0]  # a copy of id 2 on island 1
    elites.enter(moved)  # found in the row that holds it
    assert elites.table[1, 2] is made[2] and elites.ids[1].tolist() == [-1, -1, 2, -1]
    elites.enter(pareto.reset(moved, np.asarray([True, False])))
    assert list(elites.table[0]) == [None] * 4 and elites.table[1, 2] is made[2]


def test_events_are_versioned_and_old_lines_read_as_commits(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"step": 1, "evaluations": 4}) + "\n" + '{"torn": ')
    log = events.EventLog(path)  # drops the torn line
    written = log.write("refit", {"fits": 1})
    log.close()
    old, new = events.read(path)
    assert old == {"step": 1, "evaluations": 4, "v": 0, "event": "commit"}
    assert new == written and new["v"] == events.VERSION == 1 and new["event"] == "refit"


@pytest.mark.parametrize("kind", events.KINDS)
def test_every_event_kind_is_documented(kind):
    assert f"``{kind}``" in events.__doc__


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([-math.inf, 0.0]))
def test_report_running_sums_equal_a_full_recomputation(seed, threshold_min):
    """Inserts added up in O(batch) give the stats a full read of the archive gives
    (CMA-MAE thresholds included, where a cell's best can fall)."""
    from qd.report import Report

    rng = np.random.default_rng(seed)
    spec = archive.GridSpec((5, 5), (0.0, 0.0), (1.0, 1.0), learning_rate=0.5, threshold_min=threshold_min)
    state = archive.init(spec, 3)
    running, full = Report(3, 0.5, True, cells=True), Report(3, 0.5, True)
    running.refresh(state)
    for step in range(6):
        n = int(rng.integers(1, 12))
        island = rng.integers(0, 3, n).astype(np.int32)
        fitness = rng.normal(size=n).astype(np.float32)
        state, result = archive.insert(
            spec,
            state,
            island,
            rng.random((n, 2)).astype(np.float32),
            fitness,
            np.arange(n) + 100 * step,
            rng.random(n) > 0.2,
        )
        running.inserted(state, island, fitness, result)
        full.inserted(state, island, fitness, result)  # not a cell report: reads the archive
        for got, want in ((running.stats, full.stats), (running.union_stats, full.union_stats)):
            for field in archive.ArchiveStats._fields:
                np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-5, atol=1e-5)


def test_events_of_a_wave_are_one_write_with_the_shared_fields_once(tmp_path):
    log = events.EventLog(tmp_path / "events.jsonl")
    writes = []
    real = log._file.write
    log._file.write = lambda text: writes.append(text) or real(text)
    out = log.write("commit", [{"step": 1}, {"step": 2}], {"global": {"qd_score": 1.5}})
    log.close()
    assert len(writes) == 1 and [e["step"] for e in out] == [1, 2]
    read = events.read(tmp_path / "events.jsonl")
    assert [(e["step"], e["global"]["qd_score"], e["event"]) for e in read] == [
        (1, 1.5, "commit"),
        (2, 1.5, "commit"),
    ]
