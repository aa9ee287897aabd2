"""OpenEvolve's contract on qd: your ``initial_program.py`` and ``evaluator.py``.

The genome is a program (whole, or its ``EVOLVE-BLOCK`` regions); the seed is the
initial program's text. Each candidate is scored by the user's
``evaluate(program_path)``, which returns a dict of metrics (or an object with
``.metrics`` and ``.artifacts``, OpenEvolve's ``EvaluationResult``). Because an
evaluator imports and runs the program, it runs in the sandbox with it
(``qd/sandbox/evaluator_entry.py``, which also runs ``qd.optimize``'s evaluator
functions); the host only reads the numbers back.

Fitness follows OpenEvolve: ``combined_score`` when the evaluator returns it,
else the mean of the numeric metrics (those used as descriptors left out).
Descriptors: ``descriptors`` names each axis, a code metric of the program
(``descriptors.code_metrics.METRICS``, e.g. ``nodes``: computed on the host from
the text) or else a metric of the evaluator's dict; the archive's ``bins``,
``lower`` and ``upper`` bound them.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from descriptors.code_metrics import METRICS, code_metrics
from qd.callable_tasks import CODE_SPANS, SANDBOX_ENTRY, Axes, score_metrics
from qd.contract import ConfigError
from qd.task import Scored, Stage

DESCRIPTION = (
    "Improve this Python program. Each version is run by an evaluator that returns metrics; "
    "a higher combined_score is better. Keep the functions and signatures the evaluator calls."
)


def _source(field: str, path: str) -> tuple[Path, str, ast.Module]:
    """The resolved ``path`` (relative to the current directory, absolute, or ~/...), its text
    and its syntax tree; a one-line error naming ``experiment.params.<field>`` if it is not a Python file."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(
            f"experiment.params.{field}",
            f"no file {resolved}",
            "give the path of your .py file (relative to the current directory, absolute, or ~/...)",
        )
    text = resolved.read_text()
    try:
        tree = ast.parse(text, str(resolved))
    except SyntaxError as e:
        raise ConfigError(
            f"experiment.params.{field}",
            f"{resolved} does not parse: {e.msg} (line {e.lineno})",
            "fix the file",
        ) from None
    return resolved, text, tree


@dataclasses.dataclass
class OpenEvolveTask:
    initial_program: str
    evaluator: str
    descriptors: list[str] = dataclasses.field(default_factory=lambda: ["nodes", "constants"])
    description: str = DESCRIPTION  # what the model is told (OpenEvolve's system message)
    function: str = "evaluate"  # the evaluator's function, called with the program's path
    kind: str = "text"
    language: str = "python"

    def __post_init__(self) -> None:
        program, self.seed, _ = _source("initial_program", self.initial_program)
        evaluator, source, tree = _source("evaluator", self.evaluator)
        if not any(isinstance(n, ast.FunctionDef) and n.name == self.function for n in tree.body):
            raise ConfigError(
                "experiment.params.evaluator",
                f"{evaluator} defines no function {self.function}",
                f"define `def {self.function}(program_path) -> dict` (or set experiment.params.function)",
            )
        self.descriptors = list(self.descriptors)
        if not self.descriptors or not all(isinstance(d, str) and d for d in self.descriptors):
            raise ConfigError(
                "experiment.params.descriptors",
                f"must name at least one metric, got {self.descriptors}",
                f"e.g. [nodes, constants] (code metrics: {', '.join(METRICS)}) or your evaluator's keys",
            )
        self.descriptor_dim = len(self.descriptors)
        self.axes = Axes(tuple(self.descriptors), code_metrics, METRICS, CODE_SPANS)
        # what each axis measures: a code metric's, or the evaluator's key as it is
        self.descriptor_names = self.axes.names
        self.sandbox_entry = SANDBOX_ENTRY
        self.stages = [
            Stage(
                {"evaluator": source, "evaluator_path": str(evaluator), "function": self.function},
                name="evaluate",
            )
        ]
        # Saved in the run's config instead of the paths as given: resume works from any directory.
        self.resolved_params = {"initial_program": str(program), "evaluator": str(evaluator)}

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        return [self.seed] * n

    def score(self, text: str, outputs: list[Any]) -> Scored:
        return score_metrics(text, outputs[-1], self.axes, fitness_keys=("combined_score",))


def make_task(**params: Any) -> OpenEvolveTask:
    return OpenEvolveTask(**params)
