"""What the agent and prompt experiments share: generated reasoning problems, a fixed search
batch, a held-out split from other templates, and hand-designed starting genomes.

A subclass says what its genome is and how it is run on problems (``genome``,
``describe``, its entry, ``stage``, ``hand_designed``, ``score_items``); this
class makes the search stage, the founders and the held-out problems from them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from qd.contract import ConfigError
from qd.reasoning import problems
from qd.task import Scored, Stage


@dataclasses.dataclass
class ReasoningTask(abc.ABC):
    search_items: int = 4
    held_out_items: int = 24
    problem_seed: int = 0
    kind: str = "text"
    models: bool = True  # the evaluation calls the run's model
    descriptor_dim: int = 2

    def __post_init__(self) -> None:
        if self.search_items < 1 or self.held_out_items < 1:
            raise ConfigError(
                "experiment.params.search_items", "need at least one search and one held-out problem"
            )
        self.search = problems.problems("search", self.search_items, self.problem_seed)
        self.description = self.describe(self.search[0].question)
        self.stages = [self.stage(self.search, "search")]

    @abc.abstractmethod
    def describe(self, example: str) -> str:
        """What the operators' model is told (an example search problem included)."""

    @abc.abstractmethod
    def stage(self, items: list[Any], name: str) -> Stage:
        """A stage that runs a genome on ``items`` (their questions only: answers stay on the host)."""

    @abc.abstractmethod
    def hand_designed(self) -> list[tuple[str, str]]:
        """(name, genome) of the hand-designed starting genomes (the tables' baselines)."""

    @abc.abstractmethod
    def score_items(self, text: str, items: list[Any], answers: Any, trace: list[dict]) -> Scored:
        """How well ``text`` did on ``items``, from its ``answers`` and the model calls it made."""

    def held_out(self) -> list[Any]:
        """The held-out problems (other templates): for reports after a run, never shown during one."""
        return problems.problems("held_out", self.held_out_items, self.problem_seed)

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        """The hand-designed genomes, in order (then again): a founding batch of 6 holds them all."""
        hand = self.hand_designed()
        return [hand[i % len(hand)][1] for i in range(n)]

    def score(self, text: str, outputs: list[Any], trace: list[dict]) -> Scored:
        return self.score_items(text, self.search, outputs[-1], trace)

    @staticmethod
    def family_accuracy(items: list[Any], correct: list[bool]) -> dict[str, float]:
        """Accuracy per problem family (``arithmetic``, ``knights``): the skills CycleQD takes turns on."""
        out: dict[str, list[bool]] = {}
        for p, ok in zip(items, correct):
            out.setdefault(p.family, []).append(ok)
        return {family: float(np.mean(oks)) for family, oks in out.items()}

    @staticmethod
    def answer_key(item: Any, answer: Any) -> str | None:
        """``answer`` normalised as the checker compares it (None: unparseable): equal keys are the same
        answer, so a committee (``qd committee``) can count votes."""
        return problems.extract(item, answer)

    @staticmethod
    def answers_of(items: list[Any], answers: Any) -> list[bool] | None:
        """Which answers are right (checked on the host), or None if the entry's output is malformed."""
        if (
            not isinstance(answers, list)
            or len(answers) != len(items)
            or not all(isinstance(a, dict) for a in answers)
        ):
            return None
        return [bool(problems.check(p, a.get("answer"))) for p, a in zip(items, answers)]
