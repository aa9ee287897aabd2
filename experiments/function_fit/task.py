"""Function fitting: evolve a small Python ``f(x)`` toward a hidden target.

The model sees a few training points; fitness is minus the RMSE on 64 held-out
points it never sees (clipped at 100, so every program scores in [-100, 0]).
Descriptors are code metrics: AST node count and number of numeric constants,
so the archive keeps short and long, constant-heavy and structural solutions.

Sized so the embedded SmolLM2-135M makes visible progress in minutes on 2 CPU
cores: the seeds are trivial and a quadratic is within reach of small edits.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from descriptors.code_metrics import AXIS_NAMES, code_metrics
from qd.contract import ConfigError
from qd.task import Scored, Stage

_HERE = Path(__file__).resolve().parent
WORST = 100.0
NUMBERS = {int, float}  # what f(x) may return

TARGETS = {
    "quadratic": lambda x: x * x + 0.5 * x + 2.0,
    "cubic": lambda x: 0.3 * x**3 - x + 2.0,
    "wave": lambda x: math.sin(2.0 * x) + 0.5 * x,
}

SEEDS = [
    "def f(x):\n    return 0.0\n",
    "def f(x):\n    return x\n",
    "def f(x):\n    return x * x\n",
    "def f(x):\n    y = 2.0 * x + 1.0\n    return y\n",
]


@dataclasses.dataclass
class FunctionFitTask:
    target: str = "quadratic"
    train_points: int = 7
    held_out_points: int = 64
    low: float = -3.0
    high: float = 3.0
    kind: str = "text"
    language: str = "python"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = (AXIS_NAMES["nodes"], AXIS_NAMES["constants"])
    # For archive=pareto (``qd.task.objectives_of``): the error the fitness is minus of (held out
    # for every program past the cascade), and the program's size in AST nodes.
    objectives: ClassVar[tuple[tuple[str, str], ...]] = (("error", "min"), ("size", "min"))

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(
                "experiment.params.target", f"unknown target {self.target!r}", f"use one of {sorted(TARGETS)}"
            )
        if self.train_points < 1 or self.held_out_points < 1:
            raise ConfigError(
                "experiment.params.train_points", "need at least one train and one held-out point"
            )
        fn = TARGETS[self.target]
        # Training points on a coarse grid; held-out points between them.
        self.train_x = np.linspace(self.low, self.high, self.train_points).tolist()
        rng = np.random.default_rng(12345)
        self.held_out_x = np.sort(rng.uniform(self.low, self.high, self.held_out_points)).tolist()
        self.train_y = [fn(x) for x in self.train_x]
        self._held_out_y = [fn(x) for x in self.held_out_x]
        points = ", ".join(f"f({x:g}) = {y:.3g}" for x, y in zip(self.train_x, self.train_y))
        self.description = (
            "Write a Python function f(x) that takes a float x and returns a float. "
            f"It should match an unknown function; known values: {points}. "
            "The score is minus the error on other points in the same range (higher is better). "
            "Use only arithmetic and the math module."
        )
        self.sandbox_entry = f"{_HERE / 'entry.py'}:run"
        # Cascade: the training points first (cheap); held-out points only if it ran. Both are
        # a few calls of f: the held-out stage runs in the train stage's process (one fork per
        # candidate, not two), and counts only when the train stage ran.
        self.stages = [
            Stage({"xs": self.train_x}, name="train"),
            Stage({"xs": self.held_out_x}, threshold=-WORST + 1e-9, name="held_out", same_visit=True),
        ]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        return [SEEDS[i] for i in rng.integers(0, len(SEEDS), n)]

    def score(self, text: str, outputs: list[Any]) -> Scored:
        stage = len(outputs) - 1
        xs_y = (self.train_y, self._held_out_y)[stage]
        values = outputs[-1]
        # (values come from the child's JSON: exact types, and bool is a type of its own)
        if not isinstance(values, list) or len(values) != len(xs_y) or not set(map(type, values)) <= NUMBERS:
            return Scored(math.nan, None, False, error="f(x) returned a non-finite or non-numeric value")
        # In plain floats: at 7 or 64 points numpy's calls cost more than the sums (inf on overflow).
        rmse = math.dist(values, xs_y) / math.sqrt(len(xs_y))
        fitness = -min(rmse, WORST) if math.isfinite(rmse) else -WORST
        m = code_metrics(text, ("nodes", "constants"))
        metrics = {f"rmse_{('train', 'held_out')[stage]}": round(rmse, 6)}
        if m is None:
            return Scored(math.nan, None, False, metrics, "syntax error")
        # What the model can act on: its own values at the known points.
        shown = ", ".join(
            f"f({x:g}) = {y:.3g} (want {t:.3g})" for x, y, t in zip(self.train_x, outputs[0], self.train_y)
        )
        metrics.update(error=-fitness, size=m["nodes"])
        return Scored(fitness, [m["nodes"], m["constants"]], True, metrics, artifacts={"values": shown})


def make_task(**params: Any) -> FunctionFitTask:
    return FunctionFitTask(**params)
