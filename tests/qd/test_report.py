"""The lines a run ends with: aligned, readable, naming why it stopped and where its files are."""

from __future__ import annotations

from pathlib import Path

from qd.budget import Budget
from qd.report import closing_lines, stopped

STATS = {"num_elites": 25.0, "coverage": 0.125, "qd_score": 345.678, "max_fitness": -0.01}
LLM = {
    "calls": 20,
    "failed_calls": 2,
    "cached_calls": 1,
    "tokens_in": 12000,
    "tokens_out": 345,
    "cost": 0.0123,
}


def summary(**extra) -> dict:
    return {"evaluations": 40, "batches": 10, "elapsed_s": 83.4, "global": STATS, **extra}


def test_the_end_of_a_text_run_is_aligned_lines_of_what_a_person_asks():
    lines = closing_lines(summary(llm=LLM), Path("/runs/ff"), Budget(max_llm_calls=20), valid=31)
    rows = {line[:13].strip(): line[13:] for line in lines}
    assert all(line[13] != " " and line[12] == " " for line in lines)  # one column of values
    assert rows == {
        "evaluations": "40 (31 valid)",
        "coverage": "12.5% (25 elites)",
        "QD score": "345.678",
        "LLM calls": "20 (2 failed, 1 cached)",
        "tokens": "12,345 (12,000 in, 345 out)",
        "cost": "$0.0123",
        "stopped": "runner.max_llm_calls=20 reached",
        "elapsed": "1:23",
        "run dir": "/runs/ff",
    }


def test_a_numeric_run_shows_no_model_lines_and_its_merged_islands():
    union = {**STATS, "coverage": 0.5, "qd_score": 99.0}
    lines = closing_lines(summary(union=union), Path("r"), Budget(max_evaluations=40), valid=None)
    assert lines[0].split() == ["evaluations", "40"]  # a store of elites only: no valid count
    assert "islands merged  coverage 50%, QD score 99" in lines
    assert not any(line.startswith(("LLM calls", "tokens", "cost")) for line in lines)


def test_why_a_run_stopped():
    assert (
        stopped(summary(stop_reason="the server refused the key"), Budget()) == "the server refused the key"
    )
    assert stopped(summary(), Budget(max_evaluations=100, max_seconds=60)) == "runner.max_seconds=60 reached"
    assert stopped(summary(llm=LLM), Budget(max_cost=0.01)) == "runner.max_cost=0.01 reached"
    assert stopped(summary(), Budget(max_evaluations=100)) == "asked to stop"
