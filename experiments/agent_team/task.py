"""Agent teams (EvoAgent): evolve multi-agent teams, written as JSON configurations, from one expert agent.

A genome is a ``team`` (``team.py``): roles, each with its instructions and model,
and how their answers are merged (``sequential`` refinement or ``vote``). It is
data: ``entry.py`` reads it with ``json.loads`` and runs it on the host, each
role's call through the evaluation's model gateway. The problems are
``qd.reasoning.problems``' (generated offline, checked exactly);
the held-out ones come from other templates and are used only by ``table.py``.

- **Initial population**: one expert agent (a single-role team, ``FOUNDER``), as
  EvoAgent starts from one specialised agent and evolves it into a team.
- **Validity**: a malformed team, or one whose roles duplicate each other (the
  same instructions, or the model says two roles do the same job), is invalid.
- **Fitness**: accuracy on a fixed search batch (``search_items`` problems).
- **Descriptors** (from the genome, no model): team size (1-4) x diversity of the
  roles (mean pairwise 1 - Jaccard similarity of their instruction words, 0-1).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from qd.reasoning.task import ReasoningTask
from qd.task import Scored, Stage, load_module

_HERE = Path(__file__).resolve().parent
team = load_module(_HERE / "team.py", "experiments_agent_team_team")

FOUNDER = (
    json.dumps(
        {
            "merge": "sequential",
            "roles": [
                {
                    "name": "expert",
                    "instructions": "You are an expert at arithmetic and logic puzzles. "
                    "Think step by step, check each step, "
                    "then end with a last line 'Answer: <final answer>'.",
                    "model": None,
                }
            ],
        },
        indent=1,
    )
    + "\n"
)


@dataclasses.dataclass
class AgentTeamTask(ReasoningTask):
    descriptor_names: ClassVar[tuple[str, ...]] = ("team size", "role diversity")
    solver_max_tokens: int = 96
    model_names: Any = ()  # the run's models (``llm.models``: names or {name: ...}); a role may name one
    genome: str = "team"

    def __post_init__(self) -> None:
        self.host_entry = f"{_HERE / 'entry.py'}:run"
        self.model_names = tuple(m if isinstance(m, str) else m["name"] for m in self.model_names)
        super().__post_init__()

    def describe(self, example: str) -> str:
        return (
            "Design a team of LLM agents that answers short reasoning problems: arithmetic word problems "
            "(answer: a number) and Knights-and-Knaves puzzles (answer like 'A: knight, B: knave'). "
            f"Example problem: {example} "
            'A team is a JSON object: "merge" is "sequential" '
            "(each role sees the previous role's answer and "
            'improves it) or "vote" (the majority answer of the roles wins); "roles" is a list of 1 to 4 '
            '{"name": ..., "instructions": ..., "model": null}, each role with a different job. '
            "The score is the fraction answered correctly; each role costs one model call per problem."
        )

    def stage(self, items: list[Any], name: str) -> Stage:
        return Stage(
            {
                "questions": [p.question for p in items],
                "models": list(self.model_names),
                "max_tokens": self.solver_max_tokens,
            },
            name=name,
        )

    def hand_designed(self) -> list[tuple[str, str]]:
        return [("single expert (founder)", FOUNDER)]

    def score_items(self, text: str, items: list[Any], outputs: Any, trace: list[dict]) -> Scored:
        """Accuracy, placed by team size x role diversity; the model calls per problem (checks included)."""
        if isinstance(outputs, dict) and isinstance(outputs.get("invalid"), str):
            return Scored(math.nan, None, False, error=outputs["invalid"])
        answers = outputs.get("answers") if isinstance(outputs, dict) else None
        correct = self.answers_of(items, answers)
        if correct is None:
            return Scored(math.nan, None, False, error="the entry returned no answer list")
        t = team.parse(text, self.model_names)
        answered = [call for call in trace if "text" in call]
        checks = sum(
            call["messages"][0]["role"] == "user" for call in answered
        )  # roles' calls start with system
        failures = [a["error"] for a in answers if isinstance(a.get("error"), str)]
        accuracy = float(np.mean(correct))
        diversity = team.diversity(t)
        metrics = {
            "accuracy": accuracy,
            "calls_per_problem": len(answered) / len(items),
            "check_calls": checks,
            "roles": len(t.roles),
            "diversity": diversity,
            "vote": int(t.merge == "vote"),
            "failed_problems": len(failures),
            "correct": [int(c) for c in correct],
        }
        artifacts = {}
        wrong = next(((p, a) for p, a, ok in zip(items, answers, correct) if not ok), None)
        if wrong is not None:  # search problems only: what the operators can learn from
            p, a = wrong
            said = str(a.get("answer"))[-80:]
            artifacts["wrong"] = f"Q: {p.question[:200]} -> team said {said!r}, expected {p.answer}"
        if failures:
            artifacts["team_error"] = failures[0]
        return Scored(accuracy, [len(t.roles), diversity], True, metrics, artifacts=artifacts)


def make_task(**params: Any) -> AgentTeamTask:
    return AgentTeamTask(**params)
