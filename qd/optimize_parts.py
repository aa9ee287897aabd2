"""The parts of a ``qd.optimize`` run, made from its arguments: the task, where candidates
land, the model client, and the held-out score at the end (the evaluator is the task's own,
as ``qd.build`` makes it).

What ``qd-run`` reads from a hydra config and a task file is made here from Python values,
with the same checks and the same defaults as the experiments (a preset of ``conf/llm/``, a
describer of ``conf/descriptor/``), so a bad argument fails before anything starts, in one
line naming the argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from qd.archive import GridSpec
from qd.config import schema
from qd.contract import ConfigError
from qd.paths import conf_dir

__all__ = [
    "DESCRIBERS",
    "ModelArgs",
    "heldout_of",
    "make_task",
    "placement_of",
    "start_client",
    "strategy_of",
]

DESCRIBERS = ("code_metrics", "embedding")  # descriptors qd computes from the text (``descriptors/``)
# a ``qd.llm.plan`` field -> the argument of ``qd.optimize`` that sets it
_MODEL_FIELDS = {"llm.models": "model", "llm.base_url": "base_url", "llm.api_key_env": "api_key_env"}


def make_task(
    seeds: list[str],
    kind: Any,
    evaluate: Callable[..., Any] | None,
    dataset: Any,
    metric: Any,
    columns: dict[str, str],
    splits: dict[str, Any],
    description: str,
    descriptors: Any,
    random_seed: int,
    objectives: tuple[tuple[str, str], ...] = (),
) -> Any:
    """The task of the arguments: a genome scored on ``dataset`` (prompts, agents), a code
    genome scored by ``evaluate`` in the sandbox, or a data genome scored by it on the host;
    ``objectives`` the ones it reports (a dataset task's own, ``qd.data.task.OBJECTIVES``; else
    metrics of ``evaluate``'s dict)."""
    if (evaluate is None) == (dataset is None):
        raise ConfigError(
            "evaluate",
            f"a {kind.name} genome is scored by evaluate= or by dataset=, exactly one",
            "give evaluate(program_path) for code, evaluate(candidate, llm) for data, or dataset=",
        )
    if dataset is not None:
        from qd.data.task import dataset_task

        try:
            return dataset_task(
                seeds,
                dataset,
                metric,
                kind.name,
                **columns,
                **splits,
                seed=random_seed,
                description=description,
                objectives=objectives,
            )
        except ConfigError as e:  # a column's name is given in ``columns``
            raise (
                ConfigError("columns", e.problem, e.fix) if e.field in ("input", "answer") else e
            ) from None
    from qd.callable_tasks import code_task, host_task

    own = _task_descriptors(descriptors)
    if kind.code:
        return code_task(seeds, evaluate, kind.name, description=description, objectives=objectives, **own)
    return host_task(seeds, evaluate, kind.name, description=description, objectives=objectives, **own)


def strategy_of(parents: str, inspirations: str, task: Any, islands: int) -> Any:
    """The search strategy of ``parents=`` and ``inspirations=``: MAP-Elites' otherwise, with the
    selection rules checked against ``task`` as ``select=`` is (``plan_selection``)."""
    from qd.search.build import plan_selection
    from qd.search.strategy import Selection, Strategy

    try:
        return Strategy(selection=plan_selection(Selection(parents, inspirations), task, islands))
    except ConfigError as e:  # select.parents -> parents
        raise ConfigError(e.field.removeprefix("select."), e.problem, e.fix) from None


def _listed(descriptors: Any) -> list[Any]:
    if descriptors is None:
        return []
    return [descriptors] if isinstance(descriptors, str) or callable(descriptors) else list(descriptors)


def _task_descriptors(descriptors: Any) -> dict[str, Any]:
    """The ``descriptors=`` a code task reports itself (metric names, callables), if any."""
    own = [d for d in _listed(descriptors) if d not in DESCRIBERS]
    return {"descriptors": own} if own else {}


def placement_of(task: Any, descriptors: Any, random_seed: int) -> tuple[Any, GridSpec]:
    """The describer (None: the task reports its descriptors) and the grid it places into.

    ``code_metrics`` / ``embedding`` take their settings from ``conf/descriptor/``, as
    ``descriptor=NAME`` does. Otherwise the task places its candidates (a program by its AST
    size and constants, a prompt by its length, ...), each axis over the task's own
    ``descriptor_bounds`` (``qd.callable_tasks``', ``qd.data``'s) in 10 bins.
    """
    listed = _listed(descriptors)
    named = [d for d in listed if isinstance(d, str) and d in DESCRIBERS]
    if named and len(named) != len(listed):
        raise ConfigError(
            "descriptors",
            "mixes descriptors qd computes (code_metrics, embedding) with the evaluator's",
            "give either kind",
        )
    if not named:
        lower, upper = zip(*task.descriptor_bounds)
        return None, GridSpec((10,) * task.descriptor_dim, lower, upper)
    from descriptors import Combined, axis_bins, make_descriptor
    from qd import extras

    cfg = schema()
    parts = []
    for name in named:
        part = OmegaConf.merge(cfg.descriptor, OmegaConf.load(conf_dir() / "descriptor" / f"{name}.yaml"))
        parts.append(OmegaConf.to_container(part.parts[0], resolve=True))
    built = [make_descriptor(p["kind"], p, random_seed) for p in parts]
    for b, name in zip(built, named):
        if b.extra is not None:
            extras.require(b.extra, f"descriptors={name!r}")
    bins = [n for p, b in zip(parts, built) for n in axis_bins(p["kind"], p, b.dim)]
    describer = Combined(built)
    return describer, GridSpec(tuple(bins), describer.lower, describer.upper)


@dataclasses.dataclass(frozen=True)
class ModelArgs:
    """The model arguments of ``qd.optimize``: a client object, or a preset with overrides."""

    model: str | None
    base_url: str | None
    api_key_env: str | None
    llm: Any

    @property
    def preset(self) -> str:
        """``llm=`` when it names one; else ``base_url`` alone means any OpenAI-compatible server,
        ``model`` alone OpenAI, and nothing the embedded SmolLM2."""
        if isinstance(self.llm, str):
            return self.llm
        return "server" if self.base_url else "openai" if self.model else "local"


def start_client(m: ModelArgs, random_seed: int, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """The run's ``qd.llm.LLMClient``: a client object as ``qd.build`` takes it (a ``ChatClient``
    wrapped in qd's ledger and budget), or the preset's, checked as ``qd-run`` checks ``llm=``
    (the embedded server started, and stopped by ``stack``)."""
    from qd.api import client_of
    from qd.llm.plan import plan_llm
    from qd.run import start_llm

    if m.llm is not None and not isinstance(m.llm, str):
        if m.model or m.base_url or m.api_key_env:
            raise ConfigError(
                "llm", "is a client object", "drop model=, base_url= and api_key_env= (a preset's)"
            )
        return client_of(m.llm, run_dir)
    node = OmegaConf.create({"provider": "server"}) if m.preset == "server" else _preset(m.preset)
    given = {"base_url": m.base_url, "api_key_env": m.api_key_env}
    given = {k: v for k, v in given.items() if v is not None} | (
        {"models": [{"name": m.model}]} if m.model else {}
    )
    cfg = OmegaConf.merge(schema(), {"llm": node, "seed": random_seed}, {"llm": given})
    if not cfg.llm.models:
        raise ConfigError("model", "is missing", f"name the model the {m.preset} server serves")
    try:
        planned = plan_llm(cfg)
    except ConfigError as e:
        raise ConfigError(_MODEL_FIELDS.get(e.field, "llm"), e.problem, e.fix) from None
    run_dir.mkdir(parents=True, exist_ok=True)  # the embedded server's log goes there
    return start_llm(planned, run_dir, stack)


def _preset(name: str) -> Any:
    """``conf/llm/NAME.yaml``; a one-line error naming the presets otherwise."""
    path = conf_dir() / "llm" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError("llm", f"no preset {name!r}", f"use one of {known}, or pass a client object")
    return OmegaConf.load(path)


def heldout_of(task: Any, run_dir: Path, client: Any) -> tuple[Any, Any]:
    """The best candidate's score on the dataset's test split with its 95 % interval
    (``DatasetTask.heldout``, on the run's model, outside its budget), and the ledger of those
    calls alone (role ``heldout``), which the store does not hold."""
    from qd.llm import Ledger

    scored = task.heldout(run_dir, client)
    return scored, Ledger.from_rows([row for row in client.ledger.rows() if row[0] == "heldout"])
