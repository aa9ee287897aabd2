"""A prompt or an agent evolved on a user's dataset, scored by a metric: ``dataset_task``.

A child is scored in a cascade of two stages, the way GEPA spends its evaluations:

1. ``minibatch``: a seeded minibatch of the training split, fixed for the run, so a child and
   its parents are compared on the same rows;
2. ``validation``: the whole validation split, only for a founder or a child whose minibatch
   score beats its best parent's (``Stage.runs_if`` reads the parents' stored metrics through
   ``qd.task.parents_of``). A child that loses makes no validation call.

A child's fitness is its validation score; one that lost on the minibatch keeps an estimate
that cannot pass its parents: its minibatch score, capped at its best parent's fitness. Each
scored child stores its per-row scores (``metrics["row_scores"]``: split -> row id -> score),
so selection rules can read them, and its wrong *training* rows (input, expected, its output)
as feedback (``artifacts["wrong_rows"]``) that the next operator prompt shows. Validation rows
are never shown; test rows are scored only after the run, by :meth:`DatasetTask.heldout`.

The genome runs where its kind says: a prompt is the system message of a fixed solver (the
run's model) on the host (``experiments/prompt_evolution/entry.py``); an agent's code runs in
the sandbox and reaches the model through the host (``experiments/agent_design/entry.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from descriptors.code_metrics import AXIS_NAMES, code_metrics
from qd.contract import ConfigError
from qd.data.metrics import Metric, Verdict, metric_of
from qd.data.rows import Row, load_rows
from qd.data.splits import Splits, split_rows
from qd.llm.gateway import MAX_CALLS, CallBudget
from qd.paths import experiments_dir
from qd.task import Scored, Stage, objectives_of, parents_of

_SHOWN = 300  # characters of a row's input and output that feedback shows
# The objectives a dataset task computes itself (``objectives=``): its fitness (the metric's
# mean: on the validation split, or the capped minibatch estimate) and the model's output
# tokens per answered row (its evaluation's trace).
OBJECTIVES = ("accuracy", "tokens")


@dataclasses.dataclass(frozen=True)
class OnRows:
    """How a genome kind runs on a dataset's rows: the entry of the experiment that runs it (a
    prompt's on the host, an agent's in the sandbox), the model calls a row may take, and the
    axes it is placed on (with their spans)."""

    experiment: str
    entry: str  # the task attribute the entry goes in: host_entry | sandbox_entry
    limit: str  # the task field the entry gets, its per-row limit: max_tokens | item_seconds
    calls_per_row: int
    descriptor_names: tuple[str, str]
    descriptor_bounds: tuple[tuple[float, float], tuple[float, float]]

    def descriptor(self, text: str, said: list[str], trace: list[dict]) -> list[float] | None:
        """A prompt's length x its answers'; an agent's model calls per row x its code's size
        (None: code that does not parse)."""
        if self.entry == "host_entry":
            return [len(text.split()), float(np.mean([len(s) for s in said]))]
        size = code_metrics(text)
        return None if size is None else [sum("text" in call for call in trace) / len(said), size["nodes"]]


GENOMES = {
    "prompt": OnRows(
        "prompt_evolution",
        "host_entry",
        "max_tokens",
        1,
        ("prompt words", "output characters (mean)"),
        ((0, 120), (0, 600)),
    ),
    "agent": OnRows(
        "agent_design",
        "sandbox_entry",
        "item_seconds",
        4,
        ("model calls per row", AXIS_NAMES["nodes"]),
        ((0, 5), (0, 400)),
    ),
}


@dataclasses.dataclass
class DatasetTask:
    """A text task over ``splits`` scored by ``metric`` (see the module doc); :func:`dataset_task`
    builds it."""

    seeds: list[str]
    splits: Splits
    metric: Metric
    genome: str = "prompt"
    description: str = ""
    minibatch: int = 8
    seed: int = 0
    max_tokens: int = 256  # a prompt's solver call
    item_seconds: float = 60.0  # an agent's time per row
    calls_per_row: int | None = None  # model calls a row may take (default: 1 for a prompt, 4 for an agent)
    wrong_shown: int = 3  # wrong training rows in a child's feedback
    kind: str = "text"
    models: bool = True  # the evaluation calls the run's model
    language: str = "python"
    descriptor_dim: int = 2
    objectives: tuple[tuple[str, str], ...] = ()  # named (OBJECTIVES) with directions: qd.task.objectives_of

    def __post_init__(self) -> None:
        self.objectives = objectives_of(self)
        unknown = [name for name, _ in self.objectives if name not in OBJECTIVES]
        if unknown:
            raise ConfigError(
                "objectives",
                f"a dataset task computes no objective {unknown[0]!r}",
                f"use names of {list(OBJECTIVES)}",
            )
        if self.genome not in GENOMES:
            raise ConfigError(
                "genome",
                f"a dataset evolves a prompt or an agent, not {self.genome!r}",
                f"use genome= one of {sorted(GENOMES)}",
            )
        if not self.seeds or not all(isinstance(s, str) and s.strip() for s in self.seeds):
            raise ConfigError(
                "seed", "needs at least one non-empty starting text", f"give a starting {self.genome}"
            )
        if isinstance(self.minibatch, bool) or not isinstance(self.minibatch, int) or self.minibatch < 1:
            raise ConfigError(
                "minibatch", f"{self.minibatch!r} is not a row count", "use a whole number >= 1"
            )
        self.runs = GENOMES[self.genome]
        setattr(self, self.runs.entry, f"{experiments_dir() / self.runs.experiment / 'entry.py'}:run")
        self.extra = {self.runs.limit: getattr(self, self.runs.limit)}
        self.calls_per_row = self.calls_per_row or self.runs.calls_per_row
        self.descriptor_names, self.descriptor_bounds = (
            self.runs.descriptor_names,
            self.runs.descriptor_bounds,
        )
        train = self.splits.train
        picked = np.random.default_rng(self.seed).choice(
            len(train), min(self.minibatch, len(train)), replace=False
        )
        self.batch = [train[i] for i in sorted(picked)]
        self.description = self.description or self._describe()
        self.stages = [
            self.stage(self.batch, "minibatch"),
            dataclasses.replace(self.stage(self.splits.validation, "validation"), runs_if=self.beats_parents),
        ]

    @property
    def eval_budget(self) -> CallBudget:
        """Model calls one evaluation may need: a call (an agent: ``calls_per_row``) per row of its
        minibatch and of the validation split."""
        calls = (len(self.batch) + len(self.splits.validation)) * self.calls_per_row
        return CallBudget(
            calls=min(calls, MAX_CALLS), tokens=calls * (self.max_tokens + 1024), max_tokens=self.max_tokens
        )

    def held_out(self) -> list[str]:
        """The test rows' inputs: what no export may hold (``qd export --kind sft`` leaves them out)."""
        return [row.input for row in self.splits.test]

    def _describe(self) -> str:
        example = self.batch[0]
        what = (
            "the instruction (system prompt) a language model follows to answer each input"
            if self.genome == "prompt"
            else "an agent: Python code defining forward(task, llm) -> str that answers each input "
            "(task: the input text; llm(messages) -> str calls the model)"
        )
        return (
            f"Write {what}. Example input: {example.input[:_SHOWN]!r}; its expected answer: "
            f"{str(example.answer)[:80]!r}. The score is the fraction of answers the {self.metric.name} "
            "metric accepts."
        )

    def stage(self, rows: list[Row], name: str) -> Stage:
        """A stage that runs a genome on ``rows``' inputs (their answers stay on the host)."""
        return Stage({"questions": [row.input for row in rows], **self.extra}, name=name)

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        """The seeds, in order (then again)."""
        return [self.seeds[i % len(self.seeds)] for i in range(n)]

    def beats_parents(self, text: str, scored: Scored) -> bool:
        """Whether ``text`` earns the validation split: a founder, or a child whose minibatch score
        is above its best parent's (a parent scored without one, by another task, lets it through)."""
        known = [p.metrics["minibatch"] for p in parents_of(text) if "minibatch" in (p.metrics or {})]
        return not known or scored.metrics["minibatch"] > max(known)

    def judge(self, rows: list[Row], answers: Any) -> tuple[list[Verdict], list[str]] | None:
        """Each row's verdict and the output judged (None if the entry's result is malformed)."""
        if (
            not isinstance(answers, list)
            or len(answers) != len(rows)
            or not all(isinstance(a, dict) for a in answers)
        ):
            return None
        said = [str(a.get("answer") or "") for a in answers]
        return [self.metric(row, out) for row, out in zip(rows, said)], said

    def score(self, text: str, outputs: list[Any], trace: list[dict]) -> Scored:
        judged = [self.judge(rows, out) for rows, out in zip((self.batch, self.splits.validation), outputs)]
        if any(j is None for j in judged):
            return Scored(math.nan, None, False, error="the entry returned no answer list")
        (verdicts, said), *validated = judged
        minibatch = float(np.mean([v.score for v in verdicts]))
        metrics: dict[str, Any] = {
            "minibatch": minibatch,
            "row_scores": {"train": {row.id: v.score for row, v in zip(self.batch, verdicts)}},
        }
        if validated:
            val_verdicts, val_said = validated[0]
            fitness = metrics["validation"] = float(np.mean([v.score for v in val_verdicts]))
            metrics["row_scores"]["validation"] = {
                row.id: v.score for row, v in zip(self.splits.validation, val_verdicts)
            }
            metrics["validation_scores"] = [float(v.score) for v in val_verdicts]
            said = said + val_said
        else:
            parents = [
                p.fitness for p in parents_of(text) if p.fitness is not None and math.isfinite(p.fitness)
            ]
            fitness = min(minibatch, max(parents)) if parents else minibatch
        computed = {"accuracy": fitness, "tokens": sum(c.get("tokens_out", 0) for c in trace) / len(said)}
        metrics.update({name: float(computed[name]) for name, _ in self.objectives})
        descriptor = self.runs.descriptor(text, said, trace)
        if descriptor is None:
            return Scored(math.nan, None, False, metrics, error="syntax error")
        wrong = self.wrong_rows(verdicts, said[: len(self.batch)])
        return Scored(fitness, descriptor, True, metrics, artifacts={"wrong_rows": wrong} if wrong else None)

    def wrong_rows(self, verdicts: list[Verdict], said: list[str]) -> str:
        """Feedback: the first minibatch (training) rows the genome got wrong, as the model sees them."""
        shown = []
        for row, verdict, out in zip(self.batch, verdicts, said):
            if verdict.score < 1 and len(shown) < self.wrong_shown:
                note = f"\nwhy: {verdict.feedback[:_SHOWN]}" if verdict.feedback else ""
                shown.append(
                    f"input: {row.input[:_SHOWN]}\nexpected: {str(row.answer)[:_SHOWN]}\n"
                    f"output: {out[-_SHOWN:]!r}{note}"
                )
        return "\n\n".join(shown)

    def heldout(self, source: Any, llm: Any) -> tuple[float, tuple[float, float]]:
        """The test-split score of ``source`` (a genome's text, a run directory or a result with
        ``run_dir``: its best elite), with its bootstrap 95 % interval, on the client ``llm``
        (its calls ledgered under the role ``heldout``: ``qd.data.heldout``)."""
        from qd.data.heldout import test_score

        return test_score(self, source, llm)


def dataset_task(
    seeds: str | list[str],
    rows: Any,
    metric: Any = "exact",
    genome: str = "prompt",
    *,
    input: str = "input",
    answer: str = "answer",
    seed: int = 0,
    minibatch: int = 8,
    splits: tuple[float, float, float] = (0.5, 0.25, 0.25),
    description: str = "",
    metric_options: dict[str, Any] | None = None,
    **options: Any,
) -> DatasetTask:
    """A task that evolves ``seeds`` (prompts or agents) on ``rows`` (anything ``load_rows`` reads),
    scored by ``metric`` (a name or a callable; ``metric_options`` go to a named one), split with
    ``seed`` by ``splits`` (train, validation, test fractions). Other ``options`` are
    :class:`DatasetTask`'s (``max_tokens``, ``item_seconds``, ``calls_per_row``, ``wrong_shown``)."""
    loaded = load_rows(rows, input=input, answer=answer)
    return DatasetTask(
        [seeds] if isinstance(seeds, str) else list(seeds),
        split_rows(loaded, seed, tuple(splits)),
        metric_of(metric, **(metric_options or {})),
        genome,
        description,
        minibatch,
        seed,
        **options,
    )


# A reasoning experiment's params that still mean something on a dataset, and what they become.
_EXPERIMENT_PARAMS = {
    "problem_seed": "seed",
    "solver_max_tokens": "max_tokens",
    "item_seconds": "item_seconds",
}


def experiment_make_task(generated: type, seeds: list[str], genome: str) -> Callable[..., Any]:
    """The ``make_task`` of a reasoning experiment that can evolve on a user's dataset
    (prompt_evolution, agent_design): ``generated(**params)``, the experiment's task on its
    generated problems; given a ``dataset`` (``experiment.dataset``), its ``seeds`` evolved as
    ``genome`` on the dataset's rows instead (:func:`experiment_dataset_task`), reporting the
    ``objectives`` named (:data:`OBJECTIVES`, with directions). Its return
    annotation names ``generated`` first, so ``qd.task.declared_params`` lists that class's
    fields as the params it takes, beside its own keywords."""

    def make_task(
        dataset: str | None = None,
        metric: str | None = None,
        input: str = "input",
        answer: str = "answer",
        metric_options: dict[str, Any] | None = None,
        minibatch: int = 8,
        splits: list[float] | None = None,
        objectives: list[list[str]] | None = None,
        **params: Any,
    ) -> Any:
        if dataset is None:
            if objectives:
                raise ConfigError(
                    "experiment.params.objectives",
                    "the generated problems report no objectives",
                    f"evolve on a dataset (experiment.dataset=FILE), whose task computes {list(OBJECTIVES)}",
                )
            return generated(**params)
        return experiment_dataset_task(
            seeds,
            genome,
            params,
            dataset=dataset,
            metric=metric,
            input=input,
            answer=answer,
            metric_options=metric_options,
            minibatch=minibatch,
            objectives=tuple(map(tuple, objectives or ())),
            **({"splits": splits} if splits is not None else {}),
        )

    make_task.__annotations__["return"] = generated | DatasetTask
    make_task.__doc__ = (
        f"{generated.__name__} on the generated problems; given a ``dataset``, the experiment's "
        f"seeds evolved as {genome}s on its rows, scored by ``metric`` (``qd.data``)."
    )
    return make_task


def experiment_dataset_task(
    seeds: list[str], genome: str, params: dict[str, Any], **data: Any
) -> DatasetTask:
    """A reasoning experiment's task on a user's dataset (``experiment.dataset``, with ``data``:
    ``dataset``, ``metric`` and ``dataset_task``'s keywords): its seeds, and its ``params`` that
    still apply (``problem_seed`` seeds the split and minibatch, ``solver_max_tokens`` cuts a
    prompt's answers, ``item_seconds`` times an agent's); the generated problems' counts do not.
    The dataset's path is saved absolute, so ``resume=RUN_DIR`` finds it from any directory."""
    path = Path(data.pop("dataset")).expanduser()
    source = str(path.resolve()) if path.exists() else str(path)
    mapped = {_EXPERIMENT_PARAMS[k]: v for k, v in params.items() if k in _EXPERIMENT_PARAMS}
    try:
        task = dataset_task(seeds, source, data.pop("metric") or "exact", genome, **data, **mapped)
    except ConfigError as e:  # named as the command line names it
        raise e.under("experiment" if e.field in ("dataset", "metric") else "experiment.params") from None
    task.resolved_params = {"dataset": source}
    return task
