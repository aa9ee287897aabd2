"""Agent design (ADAS, Meta Agent Search): evolve LLM agents, Python code defining ``forward(task, llm)``.

An agent answers short reasoning problems generated offline by a seeded generator
and checked exactly (``qd.reasoning.problems``): multi-step arithmetic word problems and
Knights-and-Knaves puzzles. It runs in the sandbox; its model calls go through
the sandbox's channel to the run's model client, within ``eval_llm``'s budget.

- **Fitness**: accuracy on a fixed search batch (``search_items`` problems of the
  search templates).
- **Descriptors**: model calls per problem (from the host's record of the calls,
  which the agent cannot forge) x AST node count of the agent's code.
- **Skills**: accuracy per problem family (``arithmetic``, ``knights``) is in the
  metrics, so ``cycle=agent_skills`` (CycleQD) can make each family the quality in
  turn, the other family's accuracy the descriptor.
- **Held-out**: problems from *different templates* (``held_out_items``), used
  only by ``table.py`` after a run, never during one: a design that memorises the
  search phrasing fails them.
- **Initial archive**: the hand-designed agents of ``seeds.py`` (direct answer,
  chain of thought, self-consistency, self-refine, debate, compute in Python).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from descriptors.code_metrics import AXIS_NAMES, code_metrics
from qd.data.task import experiment_make_task
from qd.reasoning.task import ReasoningTask
from qd.task import Scored, Stage, load_module

_HERE = Path(__file__).resolve().parent
seeds = load_module(_HERE / "seeds.py", "experiments_agent_design_seeds")


@dataclasses.dataclass
class AgentDesignTask(ReasoningTask):
    descriptor_names: ClassVar[tuple[str, ...]] = ("model calls per problem", AXIS_NAMES["nodes"])
    item_seconds: float = 120.0
    genome: str = "agent"

    def __post_init__(self) -> None:
        self.sandbox_entry = f"{_HERE / 'entry.py'}:run"
        super().__post_init__()

    def describe(self, example: str) -> str:
        return (
            "Design an agent that answers short reasoning problems: multi-step arithmetic word problems "
            "(answer: a number) and Knights-and-Knaves puzzles (answer like 'A: knight, B: knave'). "
            f"Example problem: {example} "
            "The score is the fraction answered correctly; fewer model calls per problem is better."
        )

    def stage(self, items: list[Any], name: str) -> Stage:
        return Stage({"questions": [p.question for p in items], "item_seconds": self.item_seconds}, name=name)

    def hand_designed(self) -> list[tuple[str, str]]:
        return list(seeds.SEEDS)

    def score_items(self, text: str, items: list[Any], answers: Any, trace: list[dict]) -> Scored:
        """Accuracy, placed by model calls per problem (answered calls, the host's record) x code size."""
        correct = self.answers_of(items, answers)
        if correct is None:
            return Scored(math.nan, None, False, error="the entry returned no answer list")
        size = code_metrics(text, ("nodes",))
        if size is None:
            return Scored(math.nan, None, False, error="syntax error")
        failures = [a["error"] for a in answers if isinstance(a.get("error"), str)]
        accuracy = float(np.mean(correct))
        per_problem = sum("text" in call for call in trace) / len(items)
        metrics = {
            "accuracy": accuracy,
            "calls_per_problem": per_problem,
            "nodes": size["nodes"],
            "failed_problems": len(failures),
            "correct": [int(c) for c in correct],
            **self.family_accuracy(items, correct),
        }
        artifacts = {}
        wrong = next(((p, a) for p, a, ok in zip(items, answers, correct) if not ok), None)
        if wrong is not None:  # search problems only: what the meta agent can learn from
            p, a = wrong
            artifacts["wrong"] = (
                f"Q: {p.question[:200]} -> agent said {str(a.get('answer'))[:80]!r}, expected {p.answer}"
            )
        if failures:
            artifacts["agent_error"] = failures[0]
        return Scored(accuracy, [per_problem, size["nodes"]], True, metrics, artifacts=artifacts)


make_task = experiment_make_task(AgentDesignTask, [code for _, code in seeds.SEEDS], "agent")
