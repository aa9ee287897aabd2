"""``ReasoningTask``: the base of the agent, team and prompt tasks, checked through a minimal subclass."""

import dataclasses

import numpy as np
import pytest

from qd.contract import ConfigError
from qd.reasoning import problems
from qd.reasoning.task import ReasoningTask
from qd.task import Scored, Stage


@dataclasses.dataclass
class EchoTask(ReasoningTask):
    """Its genome is the answer it gives to every problem."""

    def describe(self, example: str) -> str:
        return f"Answer this: {example}"

    def stage(self, items, name):
        return Stage({"questions": [p.question for p in items]}, name=name)

    def hand_designed(self):
        return [("zero", "0"), ("twelve", "12")]

    def score_items(self, text, items, answers, trace):
        correct = self.answers_of(items, answers)
        if correct is None:
            return Scored(0.0, None, False, None, "malformed")
        return Scored(float(np.mean(correct)), None, True, {"correct": correct})


def test_the_search_stage_shows_the_questions_of_the_search_problems_only():
    task = EchoTask(search_items=3, held_out_items=4, problem_seed=2)
    assert task.search == problems.problems("search", 3, 2)
    assert task.held_out() == problems.problems("held_out", 4, 2)
    [stage] = task.stages
    assert stage.name == "search" and stage.args["questions"] == [p.question for p in task.search]
    assert not any(p.answer in str(stage.args) for p in task.search if p.family == "knights")
    assert task.description == f"Answer this: {task.search[0].question}"


def test_founders_cycle_through_the_hand_designed_genomes():
    assert EchoTask().initial(np.random.default_rng(0), 5) == ["0", "12", "0", "12", "0"]


def test_answers_are_checked_on_the_host_and_malformed_outputs_are_invalid():
    task = EchoTask(search_items=2)
    right = [{"answer": f"Answer: {p.answer}"} for p in task.search]
    assert task.score("x", [right], []).fitness == 1.0
    wrong = [{"answer": "no idea"}, {"answer": None}]
    assert task.score("x", [wrong], []).fitness == 0.0
    for malformed in (None, right[:1], ["17", "18"], {"answers": right}):
        assert not task.score("x", [malformed], []).valid
    assert task.answer_key(task.search[0], f"so {task.search[0].answer}") == task.search[0].answer


def test_accuracy_per_family():
    task = EchoTask(search_items=4)
    assert task.family_accuracy(task.search, [True, False, True, True]) == {"arithmetic": 1.0, "knights": 0.5}


def test_no_problems_is_a_config_error():
    with pytest.raises(ConfigError, match="search_items"):
        EchoTask(search_items=0)
