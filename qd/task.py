"""What an experiment provides: initial genomes and a (vectorized) evaluator.

An experiment is a folder ``experiments/<name>/`` whose ``task.py`` defines
``make_task(**params) -> Task``. It is loaded by file path, so experiments need
not be importable packages and ship unchanged inside the wheel.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from qd.contract import ConfigError
from qd.paths import experiments_dir


@dataclasses.dataclass
class Evaluation:
    """Results for a batch of B genomes.

    Attributes:
        fitness: f32[B]; descriptor: f32[B, D]; valid: bool[B] (False = failed);
        metrics: B dicts of extra numbers (or None); error: B reasons (None if ok);
        artifacts: B dicts of feedback for later prompts (or None);
        seconds: B evaluation wall times (or None).
        traces: B lists of the model calls each evaluation made (or None: no model calls).
    """

    fitness: np.ndarray
    descriptor: np.ndarray
    valid: np.ndarray
    metrics: list[dict] | None = None
    error: list[str | None] | None = None
    artifacts: list[dict | None] | None = None
    seconds: list[float | None] | None = None
    traces: list[list[dict] | None] | None = None


class Task(Protocol):
    """A numeric task: vectorized and trusted, so it is evaluated in process."""

    kind: str  # "vector"
    descriptor_dim: int
    genome_dim: int  # length of a vector genome

    def initial(self, rng: np.random.Generator, n: int) -> Any:
        """n starting genomes, f32[n, dim]."""
        ...

    def evaluate(self, genomes: Any) -> Evaluation:
        """Evaluates a batch; must not raise for a bad genome (mark it invalid)."""
        ...

    # Optional: ``evaluate_jax(genomes f32[B, dim]) -> (fitness f32[B], descriptor
    # f32[B, D], valid bool[B])``, the same evaluation as a pure, traceable JAX
    # function. A task that has it can run on the device loop (``runner.loop``:
    # select, vary, evaluate and insert fused in one jitted step; see qd.device).


def has_device_evaluation(task: Any) -> bool:
    """True if ``task`` provides ``evaluate_jax`` (the device loop can run it)."""
    return getattr(task, "kind", None) == "vector" and callable(getattr(task, "evaluate_jax", None))


@dataclasses.dataclass
class Scored:
    """One text candidate's evaluation, computed by trusted code on the host."""

    fitness: float
    descriptor: Any  # D floats
    valid: bool = True
    metrics: dict[str, float] | None = None
    error: str | None = None  # why it is invalid: shown to the LLM in later prompts
    artifacts: dict[str, Any] | None = None  # extra feedback for prompts (short strings)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of an evaluation cascade, run in the sandbox as ``entry(text, **args)``.

    The next stage runs only if this one scored valid and, when the next stage has
    a ``threshold``, its fitness is at least that (cheap checks first).
    """

    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    threshold: float | None = None
    name: str = "main"


class TextTask(Protocol):
    """A program/prompt task: the candidate runs only in the sandbox.

    The untrusted part (``sandbox_entry``, called with the candidate text) returns
    plain JSON; ``score`` then judges that JSON on the host, so a candidate can
    never tamper with its own score or read hidden targets.
    """

    kind: str  # "text"
    descriptor_dim: int
    description: str  # what the LLM is told; must not leak hidden targets
    language: str  # "python"
    sandbox_entry: str  # "path/to/file.py:function"
    stages: list[Stage]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        ...

    def score(self, text: str, outputs: list[Any]) -> Scored:
        """Judges the outputs of the stages run so far; must not raise."""
        ...


def load_task(name: str, params: dict[str, Any]) -> Task:
    """Imports ``experiments/<name>/task.py`` and calls ``make_task(**params)``."""
    path = experiments_dir() / name / "task.py"
    if not path.is_file():
        known = sorted(p.name for p in experiments_dir().iterdir() if (p / "task.py").is_file())
        raise ConfigError("experiment.task", f"no experiment {name!r}", f"use one of {known}")
    module = load_module(path, f"qd_experiment_{name}")
    try:
        return module.make_task(**params)
    except TypeError as e:
        raise ConfigError("experiment.params", str(e), f"see {path}") from None


def load_module(path: str | Path, module_name: str) -> Any:
    """The module at ``path``, imported once as ``sys.modules[module_name]``: how experiments
    (folders, not packages) import their own files and each other's."""
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before running it: picklable by process pools, and dataclasses need it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return module
