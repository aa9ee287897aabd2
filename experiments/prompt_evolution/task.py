"""Prompt evolution (Promptbreeder): evolve the instruction a fixed solver model follows.

A genome is a task-prompt: one short instruction, sent as the system message to
the run's model (the fixed solver) before each problem of a search batch. The
problems are ``qd.reasoning.problems``', generated offline and
checked exactly; the held-out problems come from other templates and are used
only by ``table.py``, after a run.

- **Fitness**: the solver's accuracy on the search batch with the prompt.
- **Descriptors**: by default MiniLM embeddings of the prompt (``descriptor=embedding``
  in the experiment's config); the task's own axes are prompt length in words x
  mean answer length in characters.
- **Operators** (Promptbreeder's classes): direct mutation (``rewrite``, steered by a
  mutation prompt from the instruction pool), hyper-mutation (``meta=hyper``: the
  mutation prompts evolve too), Lamarckian (a rewrite shown a correct worked answer
  and asked for the prompt that leads to it) and crossover.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from qd.data.task import experiment_make_task
from qd.reasoning.task import ReasoningTask
from qd.task import Scored, Stage, load_module

_HERE = Path(__file__).resolve().parent
seeds = load_module(_HERE / "seeds.py", "experiments_prompt_evolution_seeds")


@dataclasses.dataclass
class PromptEvolutionTask(ReasoningTask):
    descriptor_names: ClassVar[tuple[str, ...]] = ("prompt words", "answer characters (mean)")
    search_items: int = 8
    solver_max_tokens: int = 160
    genome: str = "prompt"

    def __post_init__(self) -> None:
        self.host_entry = f"{_HERE / 'entry.py'}:run"
        super().__post_init__()

    def describe(self, example: str) -> str:
        return (
            "Write the instruction (system prompt) a small language model follows to solve short reasoning "
            "problems: arithmetic word problems (answer: a number) and Knights-and-Knaves puzzles "
            "(answer like "
            f"'A: knight, B: knave'). Example problem: {example} "
            "The score is the fraction the model answers correctly with the instruction."
        )

    def stage(self, items: list[Any], name: str) -> Stage:
        return Stage(
            {"questions": [p.question for p in items], "max_tokens": self.solver_max_tokens}, name=name
        )

    def hand_designed(self) -> list[tuple[str, str]]:
        return [
            (f"prompt {i + 1}: {p[:48]}{'...' if len(p) > 48 else ''}", p + "\n")
            for i, p in enumerate(seeds.SEED_PROMPTS)
        ]

    def score_items(self, text: str, items: list[Any], answers: Any, trace: list[dict]) -> Scored:
        """The solver's accuracy with prompt ``text``; a correct working for Lamarckian mutation."""
        correct = self.answers_of(items, answers)
        if correct is None:
            return Scored(math.nan, None, False, error="the entry returned no answer list")
        said = [str(a.get("answer") or "") for a in answers]
        accuracy = float(np.mean(correct))
        metrics = {
            "accuracy": accuracy,
            "calls_per_problem": sum("text" in call for call in trace) / len(items),
            "correct": [int(c) for c in correct],
        }
        artifacts = {}
        right = next((i for i, ok in enumerate(correct) if ok), None)
        if right is not None:  # a search problem the solver got right: Lamarckian mutation's material
            artifacts["correct_working"] = f"Q: {items[right].question[:200]}\nSolver: {said[right][:300]}"
        wrong = next((i for i, ok in enumerate(correct) if not ok), None)
        if wrong is not None:
            artifacts["wrong"] = (
                f"Q: {items[wrong].question[:200]} -> said {said[wrong][-80:]!r}, "
                f"expected {items[wrong].answer}"
            )
        descriptor = [len(text.split()), float(np.mean([len(s) for s in said]))]
        return Scored(accuracy, descriptor, True, metrics, artifacts=artifacts)


make_task = experiment_make_task(PromptEvolutionTask, seeds.SEED_PROMPTS, "prompt")
