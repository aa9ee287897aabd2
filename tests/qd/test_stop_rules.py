"""Stop rules: a target fitness, patience, the broken-evaluator guard, and a budget below one child."""

from __future__ import annotations

import json
import math

import pytest
from helpers import run_config, scripted_text_config, small_config, stored
from scripted_llm import Rule

from qd.contract import Candidate, ConfigError
from qd.plan import compose, plan
from qd.search.state import Watch
from qd.stop_rules import StopRules, applied, watched

NUMERIC_TASK = """
from pathlib import Path

import numpy as np
from qd.paths import experiments_dir
from qd.task import load_module

sphere = load_module(experiments_dir() / "sphere" / "task.py", "stop_rules_sphere")


class Task(sphere.SphereTask):
    def evaluate(self, genomes):
        {body}


def make_task(**params):
    return Task(**params)
"""
BROKEN = (  # while the flag file is there
    "if (Path(__file__).parent / 'broken').exists():\n"
    '            raise RuntimeError("the evaluator is broken")\n'
    "        return super().evaluate(genomes)"
)
FLAT = "ev = super().evaluate(genomes)\n        ev.fitness[:] = 1.0\n        return ev"


def numeric_config(tmp_path, body: str, *overrides: str):
    path = tmp_path / "numeric_task.py"
    path.write_text(NUMERIC_TASK.format(body=body))
    return small_config(f"experiment.task={path}", "runner.batch_size=8", *overrides)


def stop_events(run_dir) -> list[dict]:
    lines = (json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines())
    return [e for e in lines if e["event"] == "stop"]


def candidate(error: str | None, valid: bool = False, parents=(1,)) -> Candidate:
    fitness = 1.0 if valid else math.nan
    return Candidate("text", 0, fitness, None, valid, text="def f(x): ...", parent_ids=parents, error=error)


def test_target_fitness_stops_a_run_once_reached(tmp_path):
    summary = run_config(small_config("runner.target_fitness=95"), tmp_path / "run")
    assert summary["global"]["max_fitness"] >= 95 and summary["evaluations"] < 640  # the budget: 640
    assert summary["stop"].startswith("target fitness 95 reached") and "stop_reason" not in summary
    assert [e["rule"] for e in stop_events(tmp_path / "run")] == [summary["stop"]]


def test_patience_stops_a_run_without_a_new_best_and_the_checkpoint_keeps_its_count(tmp_path):
    from qd.rundir import checkpoint

    cfg = numeric_config(tmp_path, FLAT, "runner.patience=3", "runner.in_flight=1")
    summary = run_config(cfg, tmp_path / "run")
    assert summary["stop"] == "no new best fitness in 3 proposals (runner.patience=3)"
    assert summary["evaluations"] == 4 * 8  # the first proposal sets the best, three more do not beat it
    watch = checkpoint.load(tmp_path / "run" / "checkpoints")[2]["watch"]
    assert (watch["best"], watch["stale"]) == (1.0, 3)
    again = run_config(cfg, tmp_path / "run")  # resumed: its patience is spent already
    assert again["evaluations"] == summary["evaluations"] and again["stop"] == summary["stop"]


def test_a_numeric_evaluator_that_always_raises_stops_after_the_guards_n_and_resumes(tmp_path):
    (tmp_path / "broken").touch()
    cfg = numeric_config(tmp_path, BROKEN, "runner.guard_after=20", "runner.max_evaluations=200")
    summary = run_config(cfg, tmp_path / "run")
    line = summary["stop_reason"]
    assert line.startswith(
        "broken evaluator: no valid candidate after 24 failures outside the children's own code"
    )
    assert "most common errors: 24 x harness: evaluate: RuntimeError: the evaluator is broken" in line
    assert 20 <= summary["evaluations"] <= 20 + 2 * 8  # N, and a proposal in flight at most
    assert stop_events(tmp_path / "run") == [{**stop_events(tmp_path / "run")[0], "guard": line}]
    again = run_config(cfg, tmp_path / "run")  # resumed still broken: stopped after N more
    assert again["stop_reason"].startswith("broken evaluator: no valid candidate after 24 failures")
    assert summary["evaluations"] + 20 <= again["evaluations"] <= summary["evaluations"] + 20 + 2 * 8
    (tmp_path / "broken").unlink()  # fixed: the resumed run goes on to its budget
    fixed = run_config(cfg, tmp_path / "run")
    assert fixed["evaluations"] == 200 and "stop_reason" not in fixed and fixed["global"]["num_elites"] > 0


ENTRY = """
def run(text, xs):
    import no_such_module_of_the_harness
    return [0.0 for _ in xs]
"""
TOP_LEVEL_ENTRY = "import no_such_module_of_the_harness\n" + ENTRY
TEXT_TASK = """
from qd.paths import experiments_dir
from qd.task import load_module

function_fit = load_module(experiments_dir() / "function_fit" / "task.py", "stop_rules_function_fit")


def make_task(**params):
    task = function_fit.make_task(**params)
    task.sandbox_entry = "{entry}:run"
    return task
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry_text", [ENTRY, TOP_LEVEL_ENTRY], ids=["in-the-entry", "at-its-import"])
def test_a_text_task_whose_entry_imports_a_missing_module_stops_after_the_guards_n(tmp_path, entry_text):
    """Founders need no model call: without the guard this run would store candidates forever."""
    entry, task = tmp_path / "broken_entry.py", tmp_path / "text_task.py"
    entry.write_text(entry_text)
    task.write_text(TEXT_TASK.format(entry=entry))
    cfg = scripted_text_config(
        "http://127.0.0.1:9/v1", f"experiment.task={task}", "runner.guard_after=6", "runner.max_llm_calls=80"
    )
    summary = run_config(cfg, tmp_path / "run")
    line = summary["stop_reason"]
    assert line.startswith("broken evaluator: ") and "No module named 'no_such_module_of_the_harness'" in line
    assert "x harness: train: " in line and summary["llm"]["calls"] == 0
    # N, and what was formed when the guard stopped it: runner.in_flight=4 running at most, and the
    # wave (of in_flight / 2) formed ahead that runs as they finish (qd/loop.py)
    assert 6 <= len(stored(tmp_path / "run")) <= 6 + 4 + 2


SYNTAX_ERROR = "```python\ndef f(x)\n    return x\n```"
RAISES = "```python\ndef f(x):\n    return 1 / 0\n```"
NO_F = "```python\ndef g(x):\n    return x\n```"


@pytest.mark.slow
@pytest.mark.parametrize("answer", [SYNTAX_ERROR, RAISES, NO_F], ids=["syntax", "raises", "no-f"])
def test_children_that_fail_for_their_own_reasons_never_stop_the_run(tmp_path, scripted_llm, answer):
    """A weak model: every child fails, each the same way, yet the run goes on to max_llm_calls."""
    server = scripted_llm([Rule("", answer)])
    cfg = scripted_text_config(server.base_url, "runner.guard_after=2", "runner.max_llm_calls=10")
    summary = run_config(cfg, tmp_path / "run")
    assert summary["llm"]["calls"] == 10 and "stop_reason" not in summary
    children = [c for c in stored(tmp_path / "run") if c.parent_ids]
    assert len(children) == 10 and not any(c.valid for c in children)
    assert not any(c.error.startswith("harness: ") for c in children), children[0].error


def test_watch_blames_harness_failures_and_failed_founders_never_a_childs_own():
    rules, w = StopRules(guard_after=3), Watch()
    own = [candidate("run: SyntaxError: invalid syntax"), candidate("LLM: no code block")]
    w = watched(w, own * 4, [math.nan] * 8, 4)
    assert (w.harness, w.streak, w.stale) == (0, 0, 4)
    w = watched(
        w,
        [candidate("harness: run: ImportError: x")] * 2 + [candidate("run: boom", parents=())],
        [1.0] * 3,
        1,
    )
    assert (w.harness, w.streak, w.streak_error) == (3, 1, "run: boom")
    w = watched(w, [candidate("harness: run: ImportError: x")] * 3, [math.nan] * 3, 1)
    assert (w.streak, w.harness) == (3, 6)
    w = watched(w, [candidate(None, valid=True)], [2.0], 1)
    assert (w.best, w.stale, w.streak, w.streak_error) == (2.0, 0, 0, "")
    assert rules.broken(_state(w, valid=0)).startswith("no valid candidate after 6 ")
    assert rules.broken(_state(w, valid=1)) is None
    assert StopRules(guard_after=0).broken(_state(w._replace(streak=9), valid=1)) is None
    assert StopRules(target_fitness=2.0).reached(_state(w, 1)) == "target fitness 2 reached (best 2)"


def test_should_stop_reads_the_rules_and_the_first_rule_met_is_kept():
    from qd.budget import Budget, Spending
    from qd.llm import Ledger
    from qd.loop import should_stop

    spending, state = Spending(Budget(), 0, Ledger(), 0), _state(Watch(best=1.0, stale=2), valid=1)
    assert not should_stop(state, spending, 0.0, None, StopRules(patience=3, target_fitness=1.5))
    assert should_stop(state, spending, 0.0, None, StopRules(patience=2))
    assert should_stop(state, spending, 0.0, None, StopRules(target_fitness=1.0))
    assert should_stop(_state(Watch(harness=50), valid=0), spending, 0.0, None)  # the default guard
    done, event = applied(state, StopRules(patience=2), lambda n: [])
    assert done.done == event["rule"] == "no new best fitness in 2 proposals (runner.patience=2)"
    later = done._replace(watch=Watch(best=9.0))  # a new best from a wave in flight
    assert applied(later, StopRules(patience=2), lambda n: []) == (later, None) and should_stop(
        later, spending, 0.0, None, StopRules(patience=2)
    )
    broken, event = applied(_state(Watch(harness=3), 0), StopRules(guard_after=3), lambda n: [("boom", 3)])
    assert broken.stop == event["guard"] and broken.stop.endswith("most common errors: 3 x boom")


def _state(watch: Watch, valid: int):
    from qd import archive
    from qd.search.scheduler import make_bandit
    from qd.state import init

    state = init(archive.GridSpec((2,), (0.0,), (1.0,)), 1, (make_bandit("fixed", 1),), 1, 0)
    return state._replace(watch=watch).count(valid=valid)


def test_a_budget_below_one_childs_reservation_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        plan(compose(["experiment=agent_design", "runner.max_llm_calls=12"]))
    assert str(e.value) == (
        "runner.max_llm_calls: is 12, below the 13 calls one child reserves (1 (its operator's call) "
        "+ 12 (eval_llm.calls)): the run would evaluate nothing (use runner.max_llm_calls >= 13)"
    )


def test_target_and_patience_are_refused_on_the_device_loop():
    for field in ("target_fitness=90", "patience=5"):
        with pytest.raises(ConfigError, match=f"^runner.{field.split('=')[0]}: .*runner.loop=device"):
            plan(small_config("runner.loop=device", f"runner.{field}"))
        assert plan(small_config("runner.loop=auto", f"runner.{field}")).loop == "host"
