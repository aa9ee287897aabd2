"""Tasks made from a Python function: ``code_task`` (programs, scored in the sandbox) and
``host_task`` (prompts, agents and other data, scored on the host): what ``qd.optimize``
evolves when it is given ``evaluate=`` instead of a task file.

- ``code_task(seeds, evaluate)``: each candidate program is written to ``program.py`` in the
  sandbox's private folder, and ``evaluate(program_path)`` (OpenEvolve's convention: the
  evaluator gets the candidate's file path, and imports or runs it) is called beside it. The
  sandbox runs standard-library Python under ``python -I``, so ``evaluate`` crosses as source
  (``qd.shipping.ship``), with the imports, helpers and constants of its module it reads. An
  ``evaluate(program_path, llm)`` (an agent's evaluator: it runs the candidate with a model) gets
  the sandbox's channel to the run's model, budgeted and ledgered as ``host_task``'s ``llm``.
- ``host_task(seeds, evaluate)``: a data genome is never executed, so ``evaluate(candidate,
  llm)`` runs on the host, trusted, with ``llm(prompt_or_messages) -> str``: the run's model,
  within a per-evaluation budget, every call in the run's ledger and counted in its budget.

Either ``evaluate`` returns a number (the fitness) or a dict of metrics: ``combined_score``
(else ``score``) is the fitness, else the mean of the numbers; ``feedback`` (or any other text)
goes to the candidate's artifacts, which later prompts show; the other numbers are stored as
metrics and can be descriptors. A descriptor is the name of such a metric, a measure of the
text computed on the host (a code metric of ``descriptors.code_metrics`` for programs;
``words``, ``lines`` or ``characters`` for data), or a callable ``(text) -> float``.

Both tasks say they were made from Python (``made_by``, :data:`MADE_BY`): a run of them can
be continued only by calling ``qd.optimize`` again, never by ``qd-run resume=``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import genomes
from descriptors.code_metrics import AXIS_NAMES, METRICS, code_metrics
from qd.contract import ConfigError
from qd.llm.gateway import MAX_CALLS, CallBudget
from qd.sandbox.evaluator_entry import outcome
from qd.shipping import Shipped, ship
from qd.task import Scored, Stage, objectives_of

MADE_BY = "qd.optimize"  # a task's ``made_by``: its evaluator is a Python callable, not a file
SANDBOX_ENTRY = f"{Path(__file__).resolve().parent / 'sandbox' / 'evaluator_entry.py'}:run"
FITNESS_KEYS = ("combined_score", "score")  # the first present is the fitness
TEXT_MEASURES = ("words", "lines", "characters")
# Where a measure of the text lands, as the experiments' archives place it; any other axis (a
# metric of the user's, a callable, another code metric) spans [0, 1].
TEXT_SPANS = {"words": (0.0, 200.0), "lines": (0.0, 50.0), "characters": (0.0, 1500.0)}
CODE_SPANS = {"lines": (0.0, 50.0), "nodes": (0.0, 400.0), "constants": (0.0, 12.0)}
Descriptor = str | Callable[[str], float]


def code_task(
    seeds: Sequence[str],
    evaluate: Callable[[str], Any] | Shipped,
    genome: str = "program",
    *,
    description: str = "",
    descriptors: Sequence[Descriptor] = ("nodes", "constants"),
    calls_per_evaluation: int = CallBudget.calls,
    objectives: Sequence[tuple[str, str]] = (),
) -> CodeTask:
    """A task that evolves programs from ``seeds``, each scored by ``evaluate(program_path)`` in the
    sandbox (see the module doc); a ``ConfigError`` if ``evaluate`` cannot be shipped. An
    ``evaluate(program_path, llm)`` (two parameters: an agent's evaluator) also gets the run's
    model, as ``host_task``'s does, for ``calls_per_evaluation`` calls at most per candidate.
    ``objectives`` name metrics of ``evaluate``'s dict with their directions (``qd.task.objectives_of``)."""
    shipped = ship(evaluate)
    return CodeTask(
        seeds=_seeds(seeds),
        genome=_genome(genome, code=True),
        description=description
        or "Improve this Python program. Each version is run by an evaluator that returns its score "
        f"(higher is better). Keep the functions and signatures {shipped.name}() calls.",
        axes=_axes(descriptors, code=True),
        stages=[Stage({"evaluator": shipped.source, "function": shipped.name}, name="evaluate")],
        models=_takes_llm(shipped),
        eval_budget=_call_budget(calls_per_evaluation),
        objectives=tuple(objectives),
    )


def _takes_llm(shipped: Shipped) -> bool:
    """Whether the shipped function takes a second positional parameter (``llm``)."""
    tree = ast.parse(shipped.source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == shipped.name)
    return len(fn.args.posonlyargs) + len(fn.args.args) >= 2


def host_task(
    seeds: Sequence[str],
    evaluate: Callable[[str, Callable[..., str]], Any],
    genome: str = "prompt",
    *,
    description: str = "",
    descriptors: Sequence[Descriptor] = ("words",),
    calls_per_evaluation: int = CallBudget.calls,
    objectives: Sequence[tuple[str, str]] = (),
) -> HostTask:
    """A task that evolves data (a prompt, an agent, a text) from ``seeds``, each scored on the host
    by ``evaluate(candidate, llm)`` (see the module doc). ``llm`` answers ``calls_per_evaluation``
    calls at most per candidate; the run's ``max_llm_calls`` reserves that many for each child.
    ``objectives`` as ``code_task``'s."""
    if not callable(evaluate) or inspect.iscoroutinefunction(evaluate):
        what = "an async def" if callable(evaluate) else f"{type(evaluate).__name__}, not callable"
        raise ConfigError("evaluate", f"{what}: the evaluation calls it plainly", "pass a function (def)")
    return HostTask(
        seeds=_seeds(seeds),
        genome=_genome(genome, code=False),
        description=description
        or f"Improve this {genome}. Each version is scored by an evaluation that uses it (higher is better).",
        axes=_axes(descriptors, code=False),
        evaluate=evaluate,
        eval_budget=_call_budget(calls_per_evaluation),
        objectives=tuple(objectives),
    )


def _call_budget(calls: int) -> CallBudget:
    """The model calls one evaluation may make, checked here so the error names this argument."""
    if isinstance(calls, bool) or not isinstance(calls, int) or not 0 <= calls <= MAX_CALLS:
        raise ConfigError(
            "calls_per_evaluation",
            f"{calls!r} is not allowed",
            f"use a whole number in 0..{MAX_CALLS}, e.g. 4",
        )
    return CallBudget(calls=calls)


def _genome(name: str, code: bool) -> str:
    """``name`` if it is a registered genome kind that is (``code``) or is not a program."""
    try:
        kind = genomes.get(name)
    except ConfigError as e:
        raise ConfigError("genome", e.problem, e.fix) from None
    if kind.code != code:
        what, other = ("data", "host_task: evaluate(candidate, llm)") if code else ("code", "code_task")
        raise ConfigError("genome", f"{name!r} is a {what} genome", f"use {other} for it")
    return name


def _seeds(seeds: Sequence[str]) -> list[str]:
    if isinstance(seeds, str):
        seeds = [seeds]
    seeds = list(seeds)
    if not seeds or not all(isinstance(s, str) and s.strip() for s in seeds):
        raise ConfigError("seed", "give one or more non-empty starting texts", "e.g. seed='def f(x): ...'")
    return seeds


@dataclasses.dataclass(frozen=True)
class Axes:
    """What a task's descriptor axes measure: each a metric of ``evaluate``'s dict, a measure of the
    text computed on the host (``measures`` names those ``measure`` returns, ``spans`` where some
    of them land), or a callable."""

    descriptors: tuple[Descriptor, ...]
    measure: Callable[[str], dict[str, float] | None]
    measures: tuple[str, ...]
    spans: dict[str, tuple[float, float]]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(
            AXIS_NAMES.get(d, d) if isinstance(d, str) else getattr(d, "__name__", "descriptor")
            for d in self.descriptors
        )

    @property
    def bounds(self) -> tuple[tuple[float, float], ...]:
        """Each axis's range: a measure's span, else [0, 1]."""
        return tuple(
            self.spans.get(d, (0.0, 1.0)) if isinstance(d, str) and d in self.measures else (0.0, 1.0)
            for d in self.descriptors
        )

    def of(self, text: str, metrics: dict[str, float]) -> tuple[list[float] | None, str | None]:
        """The descriptor of ``text`` scored ``metrics``, or None and why not."""
        measured = self.measure(text) if any(d in self.measures for d in self.descriptors) else {}
        values = []
        for d in self.descriptors:
            if callable(d):
                try:
                    value = float(d(text))
                except Exception as e:  # the caller's descriptor failed on this text
                    return None, f"descriptor {self.names[len(values)]}: {type(e).__name__}: {e}"
            elif d in self.measures:
                if measured is None:
                    return None, "syntax error"
                value = measured[d]
            elif d in metrics:
                value = metrics[d]
            else:
                return None, f"the evaluator returned no metric {d!r} (a descriptor)"
            values.append(float(value))
        return values, None


def _text_measures(text: str) -> dict[str, float]:
    return {"words": len(text.split()), "lines": len(text.splitlines()), "characters": len(text)}


def _axes(descriptors: Sequence[Descriptor], code: bool) -> Axes:
    descriptors = (descriptors,) if isinstance(descriptors, str) else tuple(descriptors)
    if not descriptors or not all(callable(d) or (isinstance(d, str) and d) for d in descriptors):
        measures = ", ".join(METRICS if code else TEXT_MEASURES)
        raise ConfigError(
            "descriptors",
            f"must name at least one metric or be callables, got {list(descriptors)}",
            f"e.g. {measures}, a metric your evaluate returns, or a function (text) -> float",
        )
    if code:
        return Axes(descriptors, code_metrics, METRICS, CODE_SPANS)
    return Axes(descriptors, _text_measures, TEXT_MEASURES, TEXT_SPANS)


def score_metrics(text: str, output: Any, axes: Axes, fitness_keys: Sequence[str] = FITNESS_KEYS) -> Scored:
    """The score of an evaluator's ``outcome`` (``{"metrics", "artifacts"}``): the fitness the first
    of ``fitness_keys`` present, else the mean of the numbers that are not descriptors."""
    metrics = output.get("metrics") if isinstance(output, dict) else None
    notes = output.get("artifacts") if isinstance(output, dict) else None
    if (
        not isinstance(metrics, dict)
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in metrics.values()
        )
        or not isinstance(notes, dict)
    ):
        return Scored(math.nan, None, False, error="the evaluation returned no dict of metrics")
    artifacts = {str(k): str(v)[:2000] for k, v in notes.items()}
    descriptor, why = axes.of(text, metrics)
    if descriptor is None:
        return Scored(math.nan, None, False, metrics, why, artifacts)
    key = next((k for k in fitness_keys if k in metrics), None)
    if key is not None:
        return Scored(float(metrics[key]), descriptor, True, metrics, artifacts=artifacts)
    rest = [v for k, v in metrics.items() if k not in axes.descriptors]
    if not rest:
        return Scored(math.nan, None, False, metrics, "the evaluator returned no numeric metric", artifacts)
    return Scored(float(sum(rest) / len(rest)), descriptor, True, metrics, artifacts=artifacts)


@dataclasses.dataclass
class _CallableTask:
    """What both tasks share: the seeds, the genome kind, the axes, the model budget, the marker,
    and the named objectives (metrics of the evaluator's dict, with directions)."""

    seeds: list[str]
    genome: str
    description: str
    axes: Axes
    models: bool = False  # the evaluation calls the run's model
    eval_budget: CallBudget = CallBudget()  # its calls per candidate (what ``qd.build`` gives its gateway)
    kind: str = "text"
    made_by: str = MADE_BY
    objectives: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.objectives = objectives_of(self)

    @property
    def descriptor_dim(self) -> int:
        return len(self.axes.descriptors)

    @property
    def descriptor_names(self) -> tuple[str, ...]:
        return self.axes.names

    @property
    def descriptor_bounds(self) -> tuple[tuple[float, float], ...]:
        """Where each axis lands (``qd.optimize`` places the archive over them)."""
        return self.axes.bounds

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        return [self.seeds[i % len(self.seeds)] for i in range(n)]

    def score(self, text: str, outputs: list[Any], trace: list[dict] | None = None) -> Scored:
        return score_metrics(text, outputs[-1], self.axes)


@dataclasses.dataclass
class CodeTask(_CallableTask):
    """Programs scored in the sandbox by a shipped evaluator (``code_task``)."""

    stages: list[Stage] = dataclasses.field(default_factory=list)
    language: str = "python"
    sandbox_entry: str = SANDBOX_ENTRY


@dataclasses.dataclass
class HostTask(_CallableTask):
    """Data scored on the host by ``evaluate(candidate, llm)`` (``host_task``)."""

    evaluate: Callable[[str, Callable[..., str]], Any] | None = None
    models: bool = True
    language: str = "text"
    stages: list[Stage] = dataclasses.field(default_factory=lambda: [Stage(name="evaluate")])

    def host_entry(self, text: str, llm: Callable[..., str] | None = None) -> dict:
        """The stage the host runs (``qd.evaluator.HostRunner``): ``evaluate`` and its outcome."""
        return outcome(self.evaluate(text, llm), getattr(self.evaluate, "__name__", "evaluate"))
