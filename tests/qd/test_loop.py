import json
import os
import signal
import threading

import numpy as np
import pytest
from helpers import small_config

from qd import archive
from qd.errors import CheckpointError
from qd.run import build_engine
from qd.rundir import checkpoint
from qd.store import Store


def run(cfg, path):
    engine = build_engine(cfg, path)
    try:
        return engine, engine.run()
    finally:
        engine.close()


def assert_archive_matches_store(path, cfg):
    """The checkpointed archive equals a rebuild from the store alone."""
    state, _, counters = checkpoint.load(path / "checkpoints")
    with Store(path / "store.sqlite") as store:
        offers = store.placements()
        assert counters["last_id"] == store.last_id()
    spec = archive.GridSpec(tuple(cfg.archive.bins), tuple(cfg.archive.lower), tuple(cfg.archive.upper))
    rebuilt = archive.rebuild(
        spec,
        cfg.islands.count,
        offers["island"],
        offers["descriptor"],
        offers["fitness"],
        offers["id"],
        offers["valid"],
    )
    for field in ("fitness", "genome_id", "descriptor", "threshold"):
        np.testing.assert_array_equal(np.asarray(getattr(state, field)), np.asarray(getattr(rebuilt, field)))


def test_run_spends_exactly_the_evaluation_budget_and_improves(tmp_path):
    cfg = small_config()
    _, summary = run(cfg, tmp_path)
    assert summary["evaluations"] == 640
    with Store(tmp_path / "store.sqlite") as store:
        assert store.count() == 640
        ops = {c.operator for c in store.iter()}
    assert ops == {"init+gaussian", "gaussian"}
    assert summary["global"]["num_elites"] > 10
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert len(events) == summary["batches"]
    assert events[-1]["evaluations"] == 640
    # Improves on the initial batch, not just "does not lose" (true of any elitist
    # archive). Measured over seeds 0-11: qd_score x5.9-x10.5 (median x8.6) from the
    # first event (32 evaluations) to the last; max_fitness +4.3 to +5.4. Floors: x3, +2.
    first, last = events[0]["global"], events[-1]["global"]
    assert events[0]["evaluations"] == 32
    assert last["qd_score"] >= 3.0 * first["qd_score"] > 0, (first, last)
    assert last["max_fitness"] >= first["max_fitness"] + 2.0, (first, last)
    assert {"coverage", "qd_score", "norm_qd_score", "max_fitness", "mean_fitness"} <= set(
        events[-1]["global"]
    )
    assert_archive_matches_store(tmp_path, cfg)


def test_islands_with_migration_rebuild_from_store(tmp_path):
    cfg = small_config("islands=ring4", "islands.migrate_every=2", "islands.migrants=3")
    _, summary = run(cfg, tmp_path)
    assert len(summary["islands"]) == 4
    with Store(tmp_path / "store.sqlite") as store:
        assert len(store.placements()["id"]) > store.count()  # migrations recorded
        assert {c.island for c in store.iter()} == {0, 1, 2, 3}
    assert_archive_matches_store(tmp_path, cfg)


def test_resume_continues_without_losing_or_repeating(tmp_path):
    _, first = run(small_config("runner.max_evaluations=320"), tmp_path)
    assert first["evaluations"] == 320
    engine, second = run(small_config("runner.max_evaluations=640"), tmp_path)
    assert second["evaluations"] == 640
    assert second["global"]["num_elites"] >= first["global"]["num_elites"]
    with Store(tmp_path / "store.sqlite") as store:
        assert [c.id for c in store.iter()] == list(range(640))
    assert_archive_matches_store(tmp_path, small_config())


def test_rows_stored_after_the_checkpoint_are_replayed(tmp_path):
    cfg = small_config("runner.max_evaluations=320")
    run(cfg, tmp_path)
    # Simulate a crash between a store commit and the next checkpoint: the store
    # has rows the checkpoint has not seen.
    state, key, counters = checkpoint.load(tmp_path / "checkpoints")
    counters["last_id"] = 100
    fresh = archive.init(archive.GridSpec((20, 20), (-26, -26), (26, 26)), 1)
    with Store(tmp_path / "store.sqlite") as store:
        early = store.placements()
    keep = early["id"] <= 100
    spec = archive.GridSpec((20, 20), (-26, -26), (26, 26))
    partial, _ = archive.insert(
        spec,
        fresh,
        early["island"][keep],
        early["descriptor"][keep],
        early["fitness"][keep],
        early["id"][keep],
        early["valid"][keep],
    )
    checkpoint.save(tmp_path / "checkpoints", partial, key, counters)
    engine = build_engine(cfg, tmp_path)  # replays rows 101..319 on start
    try:
        np.testing.assert_array_equal(np.asarray(engine.state.archive.genome_id), np.asarray(state.genome_id))
        assert engine.evaluations == 320
    finally:
        engine.close()


def test_sigterm_stops_cleanly_with_a_checkpoint(tmp_path):
    cfg = small_config("runner.max_evaluations=null", "runner.max_seconds=60")
    engine = build_engine(cfg, tmp_path)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        summary = engine.run()
    finally:
        timer.cancel()
        engine.close()
    assert 0 < summary["evaluations"]
    assert summary["elapsed_s"] < 30
    assert_archive_matches_store(tmp_path, cfg)


def test_time_budget_stops_the_run(tmp_path):
    _, summary = run(small_config("runner.max_evaluations=null", "runner.max_seconds=2"), tmp_path)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    commits = [0.0] + [e["elapsed_s"] for e in events]
    longest = max(b - a for a, b in zip(commits, commits[1:]))  # the slowest batch (the first one compiles)
    # The budget is checked between commits, so the run spends its 2 s and stops at most one batch
    # later, right after its last commit. Measured over 15 runs: idle machine, 3 runs: 2.009-2.010 s
    # (batches of 4 ms); loaded machine (load 4-5 on 2 cores), 6 runs in a warm process: overshoot
    # 0.014-0.048 s (longest batch 1.1-1.9 s), 6 in a fresh one: the first batch compiles and lands at
    # 4.2-6.0 s, overshoot 2.2-4.0 s; overshoot / longest batch <= 0.67; last commit to stop <= 0.022 s.
    # Margins: 0.25 s on both.
    assert summary["evaluations"] > 0 and len(events) == summary["batches"]
    assert 2.0 <= summary["elapsed_s"] <= 2.0 + longest + 0.25, (summary["elapsed_s"], longest)
    assert summary["elapsed_s"] - commits[-1] <= 0.25, (summary["elapsed_s"], commits[-1])


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    run(small_config("runner.max_evaluations=64"), tmp_path)
    (tmp_path / "checkpoints" / "checkpoint.npz").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="is corrupt.*delete it"):
        build_engine(small_config(), tmp_path)


def test_checkpoint_from_another_config_is_refused(tmp_path):
    run(small_config("runner.max_evaluations=64"), tmp_path)
    with pytest.raises(CheckpointError, match="config asks for 2 x 400"):
        build_engine(small_config("islands.count=2"), tmp_path)


def test_pool_evaluator_gives_the_same_results(tmp_path):
    _, inproc = run(small_config("runner.max_evaluations=128", "runner.in_flight=1"), tmp_path / "a")
    _, pooled = run(
        small_config(
            "runner.max_evaluations=128", "runner.in_flight=1", "runner.evaluator=pool", "runner.workers=2"
        ),
        tmp_path / "b",
    )
    assert pooled["global"] == inproc["global"]


def test_should_stop_is_a_pure_predicate_of_the_state_the_budget_and_the_client():
    from qd.budget import Budget, Spending
    from qd.llm import Ledger
    from qd.loop import should_stop
    from qd.search.scheduler import make_bandit
    from qd.state import init

    class Client:
        def __init__(self, down=None):
            self.down, self.ledger = down, Ledger()

    state = init(archive.GridSpec((2,), (0.0,), (1.0,)), 1, (make_bandit("fixed", 1),), 1, 0)
    spending = Spending(Budget(max_seconds=10), 0, Ledger(), 0)
    assert state.stop is None and not should_stop(state, spending, 5.0, Client())
    assert should_stop(state._replace(stop=""), spending, 5.0, Client())  # asked to (a signal)
    assert should_stop(state, spending, 10.0, None)  # out of time
    assert should_stop(state, spending, 5.0, Client("server gone"))  # a dead client
    assert not spending.stopping and state.stop is None  # asking changed nothing
