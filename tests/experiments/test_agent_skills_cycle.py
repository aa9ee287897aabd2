"""CycleQD over agent skills: agent_design's problem families take turns as the quality."""

import json
from pathlib import Path

import pytest
from helpers import run_config, stored
from scripted_llm import Rule

from qd.plan import compose
from qd.reasoning import problems as PROBLEMS
from qd.task import load_module

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


KNIGHTS = {
    p.question: p.answer
    for split in ("search", "held_out")
    for p in PROBLEMS.problems(split, 24)
    if p.family == "knights"
}


def knights_only(request: dict) -> str:
    """A model that solves every Knights-and-Knaves puzzle it is shown and no arithmetic problem."""
    asked = request["messages"][-1]["content"]
    return next((answer for question, answer in KNIGHTS.items() if question in asked), "I do not know.")


def designed(request: dict) -> str:
    seed = int(request.get("seed") or 0)
    return (
        f'```python\n"""Design {seed}: ask once."""\ndef forward(task, llm):\n'
        f"    return llm(task, max_tokens=16)\n```"
    )


def config(base_url, *overrides):
    return compose(
        [
            "experiment=agent_design",
            "llm.provider=server",
            f"llm.base_url={base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "llm.timeout_s=10",
            "runner.progress=false",
            "experiment.params.search_items=2",
            "eval_llm.calls=4",
            "runner.workers=3",
            "sandbox.wall_s=20",
            *overrides,
        ]
    )


def test_families_take_turns_as_the_quality(tmp_path, scripted_llm):
    server = scripted_llm([Rule("You design LLM agents", designed), Rule("", knights_only)])
    run_config(
        config(server.base_url, "cycle=agent_skills", "cycle.every=4", "runner.max_llm_calls=50"), tmp_path
    )
    rows = [c for c in stored(tmp_path) if c.kind == "text" and c.valid]
    assert rows and all({"arithmetic", "knights", "accuracy"} <= set(c.metrics) for c in rows)
    for c in rows:  # two search problems: one per family; the mean is the fixed objective
        assert c.metrics["accuracy"] == pytest.approx((c.metrics["arithmetic"] + c.metrics["knights"]) / 2)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    rotations = [e for e in events if e.get("event") == "rotate"]
    assert rotations and rotations[0]["quality"] == "knights" and rotations[0]["candidates"] >= 4
    # each candidate was committed under the phase of its insertion: fitness = that phase's family
    by_phase = {c.id: (i // 4) % 2 for i, c in enumerate(sorted(rows, key=lambda c: c.id))}
    assert any(c.fitness == c.metrics["knights"] for c in rows if by_phase[c.id] == 1)


def test_cycle_table_compares_cycleqd_with_the_fixed_objective(tmp_path, scripted_llm):
    server = scripted_llm([Rule("You design LLM agents", designed), Rule("", knights_only)])
    table = load_module(EXPERIMENTS / "agent_design" / "cycle_table.py", "experiments_cycle_table")
    result = table.main(
        [
            "--base-url",
            server.base_url,
            "--model",
            "scripted",
            "--seeds",
            "0",
            "--held-out",
            "4",
            "--max-llm-calls",
            "40",
            "--out",
            str(tmp_path),
            "experiment.params.search_items=2",
            "eval_llm.calls=4",
            "runner.workers=3",
            "cycle.every=4",
        ]
    )
    assert [(r["arm"], r["runs"]) for r in result["rows"]] == [
        ("fixed", "seed 0"),
        ("fixed", "1 seeds pooled"),
        ("cycleqd", "seed 0"),
        ("cycleqd", "1 seeds pooled"),
    ]
    for r in result["rows"]:
        assert (
            r["knights"] == 1.0 and r["arithmetic"] == 0.0 and r["all"] == 0.5
        )  # what the scripted model knows
        lo, hi = r["all_ci95"]
        assert 0 <= lo <= 0.5 <= hi <= 1 and r["calls_per_problem"] == 1.0
        assert r["search_best"] == {"arithmetic": 1.0, "knights": 1.0}  # python_compute parses the arithmetic
    for arm in ("fixed", "cycleqd"):
        (run,) = result["runs"][arm]
        assert 0 < run["llm_calls"] <= 40  # the same budget for both arms
    assert json.loads((tmp_path / "cycle_table.json").read_text())["rows"] == result["rows"]
