"""A run's plan: the composed config, validated once, holding everything building needs.

:func:`compose` composes ``conf/`` (and the user's ``--config-dir`` folders) with the
CLI's names (``compose(["experiment=arm", "islands=ring4"])`` is what ``qd-run
experiment=arm islands=ring4`` runs). :func:`plan` checks every field once -- types
and missing values, each numeric field against its range in ``qd/config.py``, then
each group against the others and the task -- and returns a frozen :class:`Plan`.
``qd.run.build_engine`` consumes it and checks nothing again.

Validation builds nothing a run would throw away: the novelty gate, the
instruction pool and the LLM operators are checked by their own pure validators
(``NoveltyGate.check_settings``, ``InstructionPool.check_settings``,
``operators.check_llm_operator``); no client, server or sandbox starts. What the
plan does build is kept and used by the run: the task, the describer, the
CycleQD objective.

Every failure is one ``ConfigError`` naming the dotted field. Plug-ins
(``operators/``, ``descriptors/``, ``qd.search``, ``qd.archive``) name fields
relative to their own settings; the plan puts them in place with
``ConfigError.under`` (``descriptor.parts[1]`` + ``bins``), never by parsing text.

One off idiom: every switchable group is off with ``enabled: false``
(``descriptor=task``, ``meta=none``, ``gate=none``, ``cycle=none``), and a group
that is enabled but empty is an error. ``scheduler=fixed`` is not an off switch
but a rule (the configured operator weights, never learning), so it has no
``enabled``.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from qd import archive, extras
from qd.budget import Budget
from qd.config import cells_kind, check_ranges, register
from qd.contract import ConfigError
from qd.llm.plan import LLMPlan, LocalServer, plan_llm
from qd.memory import MemorySettings, plan_memory
from qd.paths import conf_dir
from qd.search.build import StrategyPlan, plan_cycle, plan_strategy
from qd.stop_rules import StopRules
from qd.task import load_task, objectives_of, task_params, task_ref

register()

ARCHIVE_KINDS = ("grid", "cvt", "novelty", "pareto")
RUNNERS = ("local", "ray")
EVALUATORS = ("auto", "inprocess", "pool", "sandbox", "host")
LOOPS = ("auto", "host", "device")
STORES = ("auto", "all", "elites")
_NUMERIC_PARAMS = ("sigma", "iso_sigma", "line_sigma", "eta", "proportion")
_LLM_PARAMS = (
    "temperature",
    "max_tokens",
    "num_inspirations",
    "fallback_to_rewrite",
    "templates",
    "debug_rounds",
    "max_steps",
    "max_trials",
    "max_conversation_tokens",
)


def compose(
    overrides: list[str], config_dirs: list[str] | tuple[str, ...] = (), hydra_node: bool = False
) -> DictConfig:
    """The config ``qd-run`` would run for these command-line overrides (``["experiment=arm"]``).

    ``config_dirs``: the user's config folders (``qd-run --config-dir DIR``), searched
    after ``conf/``, so ``DIR/experiment/mytask.yaml`` is ``experiment=mytask``.
    ``hydra_node``: keep hydra's own section (run folder, logging, overrides), as ``qd-run``
    composes a single run once and hands it to hydra's job runner (job name ``run``, as
    ``hydra.main`` names ``qd/run.py``'s).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    dirs = []
    for d in config_dirs:
        path = Path(d).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(
                "--config-dir", f"no folder {path}", "give a folder holding e.g. experiment/<name>.yaml"
            )
        dirs.append(f"'file://{path}'")  # quoted: a path may hold characters the override grammar reserves
    search = [f"hydra.searchpath=[{','.join(dirs)}]"] if dirs else []
    with initialize_config_dir(str(conf_dir()), version_base=None, job_name="run"):
        return hydra_compose("config", overrides=[*search, *overrides], return_hydra_config=hydra_node)


@dataclasses.dataclass(frozen=True)
class DescriptorSpace:
    """Descriptor space of a run: D, and per axis the grid bins and bounds."""

    dim: int
    bins: list[int]
    lower: list[float]
    upper: list[float]
    own_cells: bool = False  # the describer fits its own CVT centroids (raw embeddings)
    source: str = "archive"  # which config section these came from, for errors


class OperatorEntry(NamedTuple):
    """One ``operators.mix`` entry, checked.

    ``params``: for a numeric operator its step sizes (``sigma``, ...); for an LLM
    operator the ``operators.llm.LLMOperator`` fields but the client (templates
    read and checked).
    """

    name: str
    label: str
    weight: float
    params: dict[str, Any]


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A config validated once, and everything building a run needs from it (compared by identity).

    Attributes:
        cfg: the composed config (saved as ``<run_dir>/config.yaml``, a task file's path and the
            task's ``resolved_params`` made absolute; schema-checked scalars such as
            ``runner.batch_size`` are read from it as they are).
        task: the experiment's task.
        describer: the run's describer (``descriptor.enabled``), or None for the
            task's own descriptors.
        geometry: the descriptor space (D, bins, bounds).
        evaluator: ``inprocess``, ``pool``, ``sandbox`` (code genomes) or ``host`` (data genomes).
        genome: the text genome kind (``genomes.GenomeKind``; None for numeric tasks).
        eval_budget: the model calls one evaluation may make (``qd.llm.gateway.CallBudget``;
            None unless the task's evaluation calls the model, ``task.models``).
        operators: the ``operators.mix`` entries, checked, with their arm labels.
        strategy: the strategy groups, checked (``qd.search.build.StrategyPlan``).
        budget: the run's limits.
        llm: the model client's settings (``qd.llm.plan.LLMPlan``; None for numeric tasks).
        sandbox: the sandbox limits (``qd.sandbox.Limits``; None unless evaluator is sandbox).
        loop: ``host`` (the asyncio engine, ``qd.loop``) or ``device`` (``qd.device``).
        store: ``all`` (every candidate) or ``elites`` (the elites at each checkpoint).
        stop: the stop rules beside the budgets (``qd.stop_rules``; host loop).
        memory: run memory (``qd.memory``: the ``memory`` group, checked).
    """

    cfg: DictConfig
    task: Any
    describer: Any | None
    geometry: DescriptorSpace
    evaluator: str
    operators: tuple[OperatorEntry, ...]
    strategy: StrategyPlan
    budget: Budget
    llm: LLMPlan | None
    sandbox: Any | None
    loop: str = "host"
    store: str = "all"
    genome: Any = None
    eval_budget: Any = None
    stop: StopRules = StopRules()
    memory: MemorySettings = MemorySettings()


def plan(cfg: DictConfig) -> Plan:
    """Validates every field of ``cfg`` once; the :class:`Plan` a run is built from.

    Raises:
        ConfigError: the first bad field, named with its dotted path.
        omegaconf errors: a wrong type or a missing value.
    """
    OmegaConf.to_object(cfg)  # types and missing values
    check_ranges(cfg)  # every numeric field against its range in qd/config.py, before the cross-field checks
    task = load_task(cfg.experiment.task, task_params(cfg.experiment))
    cfg = as_saved(cfg, task)
    describer = _describer(cfg, task)
    cycle = plan_cycle(cfg)
    geometry = _geometry(cfg, task, describer, cycle)
    _check_archive(cfg, geometry, task)
    if cfg.islands.topology not in archive.TOPOLOGIES:
        raise ConfigError(
            "islands.topology",
            f"unknown topology {cfg.islands.topology!r}",
            f"use one of {list(archive.TOPOLOGIES)}",
        )
    genome = _genome(task)
    evaluator = _evaluator_kind(cfg, task, genome)
    _check_runner(cfg, evaluator)
    llm = plan_llm(cfg) if task.kind != "vector" else None
    operators = _operators(cfg, task, genome)
    strategy = plan_strategy(cfg, task, describer, [o.label for o in operators], cycle)
    r = cfg.runner
    loop = _loop(cfg, task)
    eval_budget = _eval_budget(cfg, task)
    _check_reservation(cfg, task, describer, eval_budget)
    return Plan(
        cfg=cfg,
        task=task,
        describer=describer,
        geometry=geometry,
        evaluator=evaluator,
        operators=operators,
        strategy=strategy,
        budget=Budget(r.max_evaluations, r.max_seconds, r.max_llm_calls, r.max_tokens, r.max_cost),
        llm=llm,
        sandbox=_sandbox(cfg) if evaluator == "sandbox" else None,
        loop=loop,
        store=_store(cfg, loop),
        genome=genome,
        eval_budget=eval_budget,
        stop=StopRules(r.target_fitness, r.patience, r.guard_after),
        memory=plan_memory(cfg.memory, task.kind != "vector"),
    )


def as_saved(cfg: DictConfig, task: Any) -> DictConfig:
    """``cfg`` as the run saves it, so ``resume=RUN_DIR`` works from any directory: a user's
    task file as its absolute path, and the params the task resolved (``task.resolved_params``,
    e.g. its input files made absolute). ``cfg`` itself is left as composed."""
    resolved = getattr(task, "resolved_params", None) or {}
    if task_ref(cfg.experiment.task) == cfg.experiment.task and not resolved:
        return cfg
    saved = copy.deepcopy(cfg)
    saved.experiment.task = task_ref(cfg.experiment.task)
    for key, value in resolved.items():
        saved.experiment.params[key] = value
    return saved


def _genome(task: Any) -> Any:
    """A text task's genome kind (``task.genome``), checked against its entry; None for vectors."""
    if task.kind == "vector":
        return None
    import genomes

    kind = genomes.of_task(task)
    entry = "sandbox_entry" if kind.code else "host_entry"
    if not getattr(task, entry, None):
        runs = (
            "LLM-written code runs in the sandbox"
            if kind.code
            else "data genomes are read by trusted host code"
        )
        raise ConfigError(
            "experiment.task",
            f"{kind.name} genomes need the task's {entry} ({runs})",
            f"give the task a {entry} 'path/to/file.py:function'",
        )
    return kind


def _eval_budget(cfg: DictConfig, task: Any) -> Any:
    """``eval_llm`` as a ``CallBudget`` when the task's evaluation calls the model (``task.models``);
    at least the calls a task says one evaluation needs (``task.eval_budget``: a dataset task's
    minibatch and validation rows)."""
    if task.kind == "vector" or not getattr(task, "models", False):
        return None
    from qd.llm.gateway import CallBudget

    e = cfg.eval_llm
    return CallBudget(
        calls=max(e.calls, getattr(getattr(task, "eval_budget", None), "calls", 0)),
        tokens=e.tokens,
        max_tokens=e.max_tokens,
        seconds=e.seconds if e.seconds is not None else cfg.sandbox.wall_s,
    )


def _check_reservation(cfg: DictConfig, task: Any, describer: Any, eval_budget: Any) -> None:
    """A text run whose ``runner.max_llm_calls`` cannot pay for one child's reservation would
    evaluate nothing (the budget sizes every proposal to zero): refused before it starts. A child
    reserves its operator's call, the describer's judge calls, its evaluation's ``eval_llm.calls``
    and a tie judge's two (``qd.assembly``: ``Spending.calls_per_child``)."""
    limit = cfg.runner.max_llm_calls
    if limit is None or task.kind == "vector":
        return
    parts = {
        "its operator's call": 1,
        "the describer's judge calls": describer.calls_per_item if describer is not None else 0,
        "eval_llm.calls": eval_budget.calls if eval_budget is not None else 0,
        "a tie judge's calls": 2 if cfg.tiebreak.enabled else 0,
    }
    need = sum(parts.values())
    if limit < need:
        what = " + ".join(f"{n} ({name})" for name, n in parts.items() if n)
        raise ConfigError(
            "runner.max_llm_calls",
            f"is {limit}, below the {need} calls one child reserves ({what}): the run would evaluate nothing",
            f"use runner.max_llm_calls >= {need}",
        )


def _loop(cfg: DictConfig, task: Any) -> str:
    """``runner.loop``: ``device`` where asked (every setting must allow it) or where
    ``auto`` finds nothing against it; otherwise ``host``."""
    choice = cfg.runner.loop
    if choice not in LOOPS:
        raise ConfigError("runner.loop", f"unknown loop {choice!r}", f"use one of {list(LOOPS)}")
    if choice == "host":
        return "host"
    blockers = device_blockers(cfg, task)
    if choice == "device" and blockers:
        raise blockers[0]
    return "host" if blockers else "device"


def device_blockers(cfg: DictConfig, task: Any) -> list[ConfigError]:
    """Why this config cannot run on the device loop: one error per setting it lacks
    (empty: it can). The device loop fuses uniform selection, the numeric
    operators, the task's JAX evaluation and the insert; everything else needs the host."""
    from qd.device.fronts import fronts_on_device
    from qd.task import has_device_evaluation

    c, out = cfg, []

    def needs(ok: bool, field: str, problem: str, fix: str) -> None:
        if not ok:
            out.append(ConfigError(field, f"{problem} (runner.loop=device)", fix))

    needs(
        has_device_evaluation(task),
        "runner.loop",
        f"experiment {c.experiment.task!r} has no JAX evaluation (evaluate_jax)",
        "use runner.loop=host",
    )
    needs(
        c.runner.evaluator in ("auto", "inprocess"),
        "runner.evaluator",
        "the device loop evaluates inside its jitted step",
        "use runner.evaluator=auto",
    )
    needs(
        c.archive.kind in ("grid", "cvt") or (c.archive.kind == "pareto" and fronts_on_device(c, task)),
        "archive.kind",
        "the device loop fills cell archives (Pareto fronts: with the task's objectives_jax, no migration)",
        "use archive=grid or archive=cvt, or runner.loop=host",
    )
    needs(
        c.select.parents == "uniform",
        "select.parents",
        "the device loop picks parents uniformly",
        "use select=uniform",
    )
    needs(
        c.scheduler.rule == "fixed",
        "scheduler.rule",
        "the device loop mixes operators by their fixed weights",
        "use scheduler=fixed",
    )
    needs(
        c.islands.reset_patience == 0,
        "islands.reset_patience",
        "the device loop does not reset islands",
        "use islands.reset_patience=0",
    )
    needs(
        not c.islands.mix and not c.islands.models,
        "islands.mix",
        "the device loop uses one operator mix",
        "leave islands.mix empty",
    )
    for group in ("meta", "gate", "cycle"):
        needs(not c[group].enabled, f"{group}.enabled", f"{group} runs on the host loop", f"use {group}=none")
    for field in ("target_fitness", "patience"):
        needs(
            c.runner[field] is None,
            f"runner.{field}",
            "the device loop stops on its budgets only",
            f"use runner.{field}=null, or runner.loop=host",
        )
    needs(
        c.runner.batch_size % c.islands.count == 0,
        "runner.batch_size",
        f"must be a multiple of islands.count={c.islands.count}: each island emits the same share",
        f"use a multiple of {c.islands.count}",
    )
    return out


def _store(cfg: DictConfig, loop: str) -> str:
    """``runner.store``: ``auto`` keeps every candidate on the host loop and the elites on the device loop."""
    store = cfg.runner.store
    if store not in STORES:
        raise ConfigError("runner.store", f"unknown setting {store!r}", f"use one of {list(STORES)}")
    if store == "auto":
        return "elites" if loop == "device" else "all"
    if store == "elites" and loop == "host":
        raise ConfigError(
            "runner.store",
            "an elites-only store needs the device loop (the host loop stores "
            "every candidate before it counts)",
            "use runner.store=all, or runner.loop=device",
        )
    return store


def _describer(cfg: DictConfig, task: Any) -> Any:
    """The run's describer from ``descriptor.parts`` (None when ``descriptor.enabled`` is false)."""
    d = cfg.descriptor
    if not d.enabled:
        return None
    parts = OmegaConf.to_container(d.parts, resolve=True)
    if not parts:
        raise ConfigError(
            "descriptor.parts",
            "is empty",
            "name the parts (e.g. descriptor=embedding), or use descriptor=task",
        )
    if task.kind == "vector":
        raise ConfigError(
            "descriptor.enabled",
            "describers place text candidates; numeric tasks report their own",
            "use descriptor=task",
        )
    from descriptors import Combined, make_descriptor

    cvt_cells = cfg.archive.cells if cells_kind(cfg.archive) == "cvt" else 0
    built = []
    for i, part in enumerate(parts):
        try:
            built.append(make_descriptor(part["kind"], part, cfg.seed, cvt_cells))
        except ConfigError as e:
            raise e.under(f"descriptor.parts[{i}]") from None
        if built[-1].extra is not None:
            extras.require(built[-1].extra, f"descriptor={part['kind']}")
    return Combined(built)


def _geometry(cfg: DictConfig, task: Any, describer: Any, cycle: Any) -> DescriptorSpace:
    a = cfg.archive
    if cycle is not None:  # the first phase's axes; the engine re-grids at each rotation
        g = cycle.spec(0)
        return DescriptorSpace(g.descriptor_dim, list(g.bins), list(g.lower), list(g.upper), source="cycle")
    if describer is None:
        return DescriptorSpace(task.descriptor_dim, list(a.bins), list(a.lower), list(a.upper))
    from descriptors import axis_bins

    bins = []
    for i, (part, built) in enumerate(zip(cfg.descriptor.parts, describer.parts)):
        try:
            bins += axis_bins(part.kind, OmegaConf.to_container(part, resolve=True), built.dim)
        except ConfigError as e:
            raise e.under(f"descriptor.parts[{i}]") from None
    own = any(p.kind == "embedding" and p.projection == "none" for p in cfg.descriptor.parts)
    return DescriptorSpace(
        describer.dim,
        bins,
        list(describer.lower),
        list(describer.upper),
        own_cells=own and cells_kind(a) == "cvt",
        source="descriptor.parts",
    )


def _check_archive(cfg: DictConfig, g: DescriptorSpace, task: Any) -> None:
    a = cfg.archive
    if a.kind not in ARCHIVE_KINDS:
        raise ConfigError("archive.kind", f"unknown kind {a.kind!r}", f"use one of {list(ARCHIVE_KINDS)}")
    if a.kind == "pareto":
        _check_fronts(cfg, task)
    kind = cells_kind(a)
    if kind == "grid" and g.dim > 8:
        raise ConfigError(
            "archive.kind",
            f"a grid over {g.dim} descriptor axes has too many cells",
            "use archive=cvt or archive=novelty for raw embeddings",
        )
    for name in ("lower", "upper") + (("bins",) if kind == "grid" else ()):
        if len(getattr(g, name)) != g.dim:  # a describer's axes always match
            raise ConfigError(
                f"archive.{name}",
                f"has {len(getattr(g, name))} entries but the task has {g.dim} descriptors",
                f"give {g.dim} values",
            )
    if kind == "grid":
        try:
            archive.GridSpec(
                tuple(g.bins), tuple(g.lower), tuple(g.upper)
            )  # a value: its checks are the spec's own
        except ConfigError as e:
            raise e.under(g.source) from None
    if kind == "cvt" and not g.own_cells:  # centroids by k-means over uniform samples of the bounds
        if any(not lo < hi for lo, hi in zip(g.lower, g.upper)):
            raise ConfigError(
                f"{g.source}.upper",
                f"must exceed lower in every dimension, got lower={g.lower} upper={g.upper}",
            )
        if a.cvt_samples < a.cells:
            raise ConfigError(
                "archive.cvt_samples",
                f"is {a.cvt_samples}, fewer than archive.cells={a.cells}",
                "sample at least one point per cell",
            )


def _check_fronts(cfg: DictConfig, task: Any) -> None:
    """A Pareto archive: fronts in grid or CVT cells, over the objectives the task declares; the
    rules that read one elite per cell (curiosity, the tie judge) are refused."""
    a, m = cfg.archive, len(objectives_of(task))
    for bad, field, problem, fix in (
        (a.over not in ("grid", "cvt"), "archive.over", f"unknown cells {a.over!r}", "use grid or cvt"),
        (not m, "archive.kind", "a Pareto archive needs objectives; the task declares none", "use grid"),
        (a.reference is not None and len(a.reference) != m, "archive.reference", f"needs {m} values", ""),
        (cfg.select.parents == "curiosity", "select.parents", "curiosity scores cells, not fronts", ""),
        (cfg.tiebreak.enabled, "tiebreak.enabled", "the tie judge settles one elite per cell", ""),
    ):
        if bad:
            raise ConfigError(field, problem, fix)


def _evaluator_kind(cfg: DictConfig, task: Any, genome: Any) -> str:
    """inprocess / pool for numeric tasks; LLM-written code only ever runs in the sandbox;
    data genomes (prompts, teams, texts) are read by the task's trusted code on the host."""
    e = cfg.runner.evaluator
    if e not in EVALUATORS:
        raise ConfigError("runner.evaluator", f"unknown evaluator {e!r}", f"use one of {list(EVALUATORS)}")
    if task.kind == "vector":
        if e in ("sandbox", "host"):
            raise ConfigError(
                "runner.evaluator",
                "numeric tasks are trusted and evaluated in process",
                "use auto, inprocess or pool",
            )
        return "inprocess" if e == "auto" else e
    own = "sandbox" if genome.code else "host"
    if e not in ("auto", own):
        why = (
            f"{e!r} would run LLM-written code outside the sandbox"
            if genome.code
            else f"{genome.name} genomes are data for the task's host code, not programs"
        )
        raise ConfigError("runner.evaluator", why, f"use auto or {own}")
    return own


def _check_runner(cfg: DictConfig, evaluator: str) -> None:
    """``runner=ray`` moves sandboxed evaluations to a cluster; it needs Ray and a sandboxed task."""
    name = cfg.runner.name
    if name not in RUNNERS:
        raise ConfigError(
            "runner.name", f"unknown runner {name!r}", f"use runner={' or runner='.join(RUNNERS)}"
        )
    if name == "ray":
        if evaluator != "sandbox":
            raise ConfigError(
                "runner",
                f"runner=ray runs sandboxed evaluations; this run's evaluator is {evaluator}",
                "use runner=local: its evaluations are cheap, or trusted host code",
            )
        extras.require("ray", "runner=ray")


def _sandbox(cfg: DictConfig) -> Any:
    from qd.sandbox import Limits

    return Limits(**OmegaConf.to_container(cfg.sandbox, resolve=True))


def _operators(cfg: DictConfig, task: Any, genome: Any) -> tuple[OperatorEntry, ...]:
    """The ``operators.mix`` entries, each checked by its plug-in's validator (nothing is built)."""
    mix = cfg.operators.mix
    if not mix:
        raise ConfigError("operators.mix", "is empty", "pick a group, e.g. operators=gaussian")
    labels = [o.label or o.name for o in mix]
    for i, label in enumerate(labels):
        if labels.index(label) != i:
            raise ConfigError(
                f"operators.mix[{i}].label",
                f"{label!r} names two entries",
                "give each entry of the same operator its own label",
            )
    entries = []
    for i, (o, label) in enumerate(zip(mix, labels)):
        try:
            entries.append(OperatorEntry(o.name, label, float(o.weight), _operator_params(o, task, genome)))
        except ConfigError as e:
            raise e.under(f"operators.mix[{i}]") from None
    if sum(e.weight for e in entries) <= 0:  # each weight >= 0: the schema's range
        raise ConfigError(
            "operators.mix", "weights must have a positive sum", "give some operator a weight > 0"
        )
    return tuple(entries)


def _operator_params(o: DictConfig, task: Any, genome: Any) -> dict[str, Any]:
    """A numeric operator for vector tasks, an LLM operator for text tasks: its checked params."""
    if task.kind == "vector":
        from operators import check_numeric_operator

        return check_numeric_operator(o.name, **{k: o[k] for k in _NUMERIC_PARAMS})
    from operators import check_text_operator

    params = OmegaConf.to_container(o, resolve=True)
    return check_text_operator(o.name, genome=genome, **{k: params[k] for k in _LLM_PARAMS})


__all__ = ["DescriptorSpace", "LLMPlan", "LocalServer", "OperatorEntry", "Plan", "compose", "plan"]
