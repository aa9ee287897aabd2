"""What an experiment provides: initial genomes and a (vectorized) evaluator.

An experiment is a folder ``experiments/<name>/`` whose ``task.py`` defines
``make_task(**params) -> Task``. It is loaded by file path, so experiments need
not be importable packages and ship unchanged inside the wheel.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from typing import Any, Protocol

import numpy as np

from qd.errors import ConfigError
from qd.paths import experiments_dir


@dataclasses.dataclass
class Evaluation:
    """Results for a batch of B genomes.

    Attributes:
        fitness: f32[B]; descriptor: f32[B, D]; valid: bool[B] (False = failed);
        metrics: B dicts of extra numbers (or None); error: B reasons (None if ok).
    """

    fitness: np.ndarray
    descriptor: np.ndarray
    valid: np.ndarray
    metrics: list[dict] | None = None
    error: list[str | None] | None = None


class Task(Protocol):
    kind: str  # "vector" or "text"
    descriptor_dim: int
    genome_dim: int  # length of a vector genome (vector tasks only)

    def initial(self, rng: np.random.Generator, n: int) -> Any:
        """n starting genomes (f32[n, dim] for vector tasks, list[str] for text)."""
        ...

    def evaluate(self, genomes: Any) -> Evaluation:
        """Evaluates a batch; must not raise for a bad genome (mark it invalid)."""
        ...


def load_task(name: str, params: dict[str, Any]) -> Task:
    """Imports ``experiments/<name>/task.py`` and calls ``make_task(**params)``."""
    path = experiments_dir() / name / "task.py"
    if not path.is_file():
        known = sorted(p.name for p in experiments_dir().iterdir() if (p / "task.py").is_file())
        raise ConfigError("experiment.task", f"no experiment {name!r}", f"use one of {known}")
    module_name = f"qd_experiment_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # picklable by process pools
        spec.loader.exec_module(module)
    try:
        return module.make_task(**params)
    except TypeError as e:
        raise ConfigError("experiment.params", str(e), f"see {path}") from None
