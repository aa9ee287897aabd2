"""StagedEvaluator: cascades, host-side scoring, and failures turned into reasons."""

import math

import numpy as np
from helpers import evaluate_in_sandbox

from qd.task import Scored, Stage

ENTRY = """
def run(text, scale):
    if text == "crash":
        raise ValueError("boom")
    print("evaluating", text)
    try:
        return float(text) * scale
    except ValueError:
        return 0.0
"""


class TwoStageTask:
    """Stage 1 is cheap (scale 1); stage 2 (scale 10) runs only from fitness 5 up."""

    kind, language, descriptor_dim, description = "text", "python", 1, "numbers"

    def __init__(self, entry: str):
        self.sandbox_entry = entry
        self.stages = [
            Stage({"scale": 1.0}, name="cheap"),
            Stage({"scale": 10.0}, threshold=5.0, name="full"),
        ]

    def score(self, text, outputs):
        if text == "bad-descriptor":
            return Scored(1.0, [1.0, 2.0])
        if text == "1e9":
            raise RuntimeError("task bug")
        return Scored(outputs[-1], [len(outputs)], metrics={"value": outputs[-1]})


def evaluate(tmp_path, texts):
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    return evaluate_in_sandbox(TwoStageTask(f"{entry}:run"), texts)


def test_cascade_runs_later_stages_only_above_the_threshold(tmp_path):
    ev = evaluate(tmp_path, ["2", "7"])
    assert ev.fitness.tolist() == [2.0, 70.0]
    assert [m["stages"] for m in ev.metrics] == [1, 2]
    assert ev.descriptor[:, 0].tolist() == [1.0, 2.0]
    assert "evaluating 7" in ev.artifacts[1]["stdout"]
    assert all(s > 0 for s in ev.seconds)


def test_failures_become_invalid_candidates_with_one_line_reasons(tmp_path):
    ev = evaluate(tmp_path, ["crash", "bad-descriptor", "1e9", "3"])
    assert ev.valid.tolist() == [False, False, False, True]
    assert ev.error[0] == "cheap: ValueError: boom" and "Traceback" in ev.artifacts[0]["stderr"]
    assert ev.error[1].startswith("harness: score: descriptor has shape (2,)")  # the task's bugs
    assert ev.error[2] == "harness: score: RuntimeError: task bug"
    assert math.isnan(ev.fitness[0]) and np.isnan(ev.descriptor[0]).all()


# A process is told apart by a token it draws at its first call, not by its pid: each sandbox
# worker is pid 1 of a namespace of its own, so two workers' children can have the same pid.
PID_ENTRY = """
import os

_TOKEN = []

def run(text, scale):
    if scale > 1 and text in ("4", "8"):
        raise ValueError("late boom")
    _TOKEN[:] = _TOKEN or [os.urandom(8).hex()]
    return {"value": float(text) * scale, "pid": _TOKEN[0]}
"""


class SameVisitTask:
    """TwoStageTask's cascade whose second stage runs in the first stage's process, or not."""

    kind, language, descriptor_dim, description = "text", "python", 1, "numbers"

    def __init__(self, entry: str, same_visit: bool):
        self.sandbox_entry = entry
        self.stages = [
            Stage({"scale": 1.0}, name="cheap"),
            Stage({"scale": 10.0}, threshold=5.0, name="full", same_visit=same_visit),
        ]

    def score(self, text, outputs):
        pids = [o["pid"] for o in outputs]
        return Scored(outputs[-1]["value"], [len(outputs)], metrics={"one_process": len(set(pids)) == 1})


def test_a_same_visit_stage_runs_in_its_stage_before_ones_process_and_scores_alike(tmp_path):
    entry = tmp_path / "entry.py"
    entry.write_text(PID_ENTRY)
    runs = {}
    for same_visit in (True, False):
        runs[same_visit] = evaluate_in_sandbox(SameVisitTask(f"{entry}:run", same_visit), ["2", "7", "9"])
    together, apart = runs[True], runs[False]
    assert together.fitness.tolist() == apart.fitness.tolist() == [2.0, 70.0, 90.0]
    assert [m["stages"] for m in together.metrics] == [m["stages"] for m in apart.metrics] == [1, 2, 2]
    assert [m["one_process"] for m in together.metrics[1:]] == [True, True]  # one fork per candidate
    assert [m["one_process"] for m in apart.metrics[1:]] == [False, False]


def test_a_same_visit_stages_failure_counts_only_past_its_gate(tmp_path):
    entry = tmp_path / "entry.py"
    entry.write_text(PID_ENTRY)
    ev = evaluate_in_sandbox(SameVisitTask(f"{entry}:run", True), ["4", "8"])
    # "4" scores 4 at the cheap stage: the gate (5) stops it, so its failed second call does not count.
    assert ev.valid.tolist() == [True, False]
    assert ev.fitness[0] == 4.0 and ev.metrics[0]["stages"] == 1
    assert ev.error[1] == "full: ValueError: late boom"  # named by the stage that failed
    assert "Traceback" in ev.artifacts[1]["stderr"]
