"""From the hydra groups to a ``qd.search.strategy.Strategy`` and the scheduler's arms, in two steps.

:func:`plan_strategy` checks the groups ``islands``, ``select``, ``scheduler``,
``meta``, ``gate`` and ``cycle`` against each other and the task (part of
``qd.plan.plan``; it builds nothing a run would throw away: the gate and the
instruction pool are checked by their own ``check_settings``) and returns a
:class:`StrategyPlan`. :func:`build_arms` and :func:`build_strategy` turn that
plan into the run's objects without checking anything again.

Every switchable group is off with ``enabled: false`` (``meta=none``,
``gate=none``, ``cycle=none``); ``scheduler=fixed`` is not an off switch but a
rule: the configured weights, never learning.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from omegaconf import DictConfig, OmegaConf

from qd import extras
from qd.contract import ConfigError
from qd.llm.prices import price_of
from qd.search import select
from qd.search.cycle import CyclicObjective
from qd.search.scheduler import RULES, check_bandit, make_bandit
from qd.search.strategy import COSTS, Arm, IslandPolicy, Selection, Strategy
from qd.task import objectives_of

ARM_KINDS = ("operators", "operators_models")


class ArmPlan(NamedTuple):
    """One arm to build: the operator entry (index into ``Plan.operators``), the model
    (None: the client picks), the fixed scheduler's weight and the arm's label."""

    entry: int
    model: str | None
    weight: float
    label: str


@dataclasses.dataclass(frozen=True, eq=False)
class StrategyPlan:
    """The strategy groups, checked.

    Attributes:
        arms: the arms, in the scheduler's order.
        rule: ``scheduler.rule``; ``params`` its keyword arguments (``decay``, ``c``, ...).
        island_weights: per island, the fixed weight of each arm (``islands.mix`` x
            ``islands.models``), or None when the islands share the scheduler.
        cost, islands, selection: as in :class:`~qd.search.strategy.Strategy`.
        meta: the ``InstructionPool`` keywords (checked), or None when ``meta.enabled`` is false.
        meta_model: the model that mutates instructions (None: the client's pick).
        gate: the ``NoveltyGate`` keywords (checked), or None when ``gate.enabled`` is false.
        cycle: the ``CyclicObjective``, or None when ``cycle.enabled`` is false.
        tiebreak: the ``PairwiseJudge`` keywords (checked), or None when ``tiebreak.enabled`` is false.
    """

    arms: tuple[ArmPlan, ...]
    rule: str
    params: dict[str, Any]
    island_weights: tuple[np.ndarray, ...] | None
    cost: str
    islands: IslandPolicy
    selection: Selection
    meta: dict[str, Any] | None
    meta_model: str | None
    gate: dict[str, Any] | None
    cycle: CyclicObjective | None
    tiebreak: dict[str, Any] | None = None


def plan_cycle(cfg: DictConfig) -> CyclicObjective | None:
    """The CycleQD objective (None when ``cycle.enabled`` is false), its settings checked."""
    c = cfg.cycle
    if not c.enabled:
        return None
    if not c.metrics:
        raise ConfigError("cycle.metrics", "is empty", "name the metrics to cycle, or use cycle=none")
    try:
        return CyclicObjective.create(c.metrics, c.lower, c.upper, c.bins, c.every)
    except ConfigError as e:
        raise e.under("cycle") from None


def plan_selection(selection: Selection, task: Any, islands: int, reference: Any = None) -> Selection:
    """``selection`` checked against the task, with what its rules read of it: the task's
    objectives (``qd.task.objectives_of``) and the hypervolume ``reference`` point (each
    objective in its own units, a Pareto archive's, checked with it; None: derived from the
    elites). A rule the task cannot feed is
    refused: ``instance`` (and ``complement`` without objectives) needs per-row validation
    scores, which only a task with validation rows reports (``qd.data.task``); ``pareto`` and
    ``hypervolume`` need the task's named objectives."""
    parents, inspirations = selection.parents, selection.inspirations
    if parents not in select.PARENT_RULES:
        raise ConfigError(
            "select.parents", f"unknown rule {parents!r}", f"use one of {list(select.PARENT_RULES)}"
        )
    if inspirations not in select.INSPIRATION_RULES:
        raise ConfigError(
            "select.inspirations",
            f"unknown rule {inspirations!r}",
            f"use one of {list(select.INSPIRATION_RULES)}",
        )
    if inspirations == "islands" and islands < 2:
        raise ConfigError("select.inspirations", "islands needs other islands", "set islands.count >= 2")
    objectives = objectives_of(task)
    rows = bool(getattr(getattr(task, "splits", None), "validation", None))
    what = f"the task ({type(task).__name__})"
    if parents in ("pareto", "hypervolume") and not objectives:
        raise ConfigError(
            "select.parents",
            f"{parents} needs objectives, and {what} declares none",
            "use a task with objectives",
        )
    if (parents == "instance" or (inspirations == "complement" and not objectives)) and not rows:
        field = "select.parents" if parents == "instance" else "select.inspirations"
        rule = parents if parents == "instance" else inspirations
        raise ConfigError(
            field,
            f"{rule} needs per-row validation scores, and {what} has no validation rows",
            "use a dataset task",
        )
    return dataclasses.replace(
        selection,
        objectives=objectives,
        reference=None if reference is None else tuple(map(float, reference)),
    )


def plan_strategy(
    cfg: DictConfig, task: Any, describer: Any, labels: Sequence[str], cycle: CyclicObjective | None
) -> StrategyPlan:
    """Checks the strategy groups against each other and the task; ``labels`` name the
    operator entries (``Plan.operators``), ``cycle`` is :func:`plan_cycle`'s."""
    isl, sel, sch = cfg.islands, cfg.select, cfg.scheduler
    text = task.kind != "vector"
    if isl.reset_patience and isl.count < 2:
        raise ConfigError(
            "islands.reset_patience", "a reset needs surviving islands", "set islands.count >= 2"
        )
    for field in ("mix", "models"):
        if isl[field] and len(isl[field]) != isl.count:
            raise ConfigError(
                f"islands.{field}",
                f"has {len(isl[field])} entries for {isl.count} islands",
                "give one per island, or none",
            )
        for i, weights in enumerate(isl[field]):
            for name, w in weights.items():
                if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
                    raise ConfigError(f"islands.{field}[{i}].{name}", f"weight {w!r} is not a number >= 0")
    if isl.models and not text:
        raise ConfigError("islands.models", "numeric tasks call no model", "remove islands.models")
    selection = plan_selection(
        Selection(sel.parents, sel.inspirations, sel.temperature, sel.k),
        task,
        isl.count,
        cfg.archive.reference if cfg.archive.kind == "pareto" else None,  # checked with the archive
    )
    if sch.rule not in RULES:
        raise ConfigError("scheduler.rule", f"unknown rule {sch.rule!r}", f"use one of {list(RULES)}")
    if sch.arms not in ARM_KINDS:
        raise ConfigError("scheduler.arms", f"unknown arms {sch.arms!r}", f"use one of {list(ARM_KINDS)}")
    if sch.cost not in COSTS:
        raise ConfigError("scheduler.cost", f"unknown cost {sch.cost!r}", f"use one of {list(COSTS)}")
    if (
        sch.cost == "usd"
        and text
        and not any(m.price_in or m.price_out or price_of(m.name) for m in cfg.llm.models)
    ):
        raise ConfigError(
            "scheduler.cost", "usd needs prices", "set llm.models[i].price_in/price_out, or cost=calls"
        )
    if (isl.mix or isl.models) and sch.rule != "fixed":
        raise ConfigError(
            "islands.mix",
            f"per-island mixes are fixed weights; scheduler.rule={sch.rule} learns them",
            "use scheduler=fixed, or drop islands.mix/models",
        )
    if not text:
        for group in ("meta", "gate"):
            if cfg[group].enabled:
                raise ConfigError(f"{group}.enabled", "works on LLM text tasks only", f"use {group}=none")
    if cycle is not None:
        if describer is not None:
            raise ConfigError("cycle.enabled", "CycleQD sets the descriptors itself", "use descriptor=task")
        if cfg.archive.kind != "grid":
            raise ConfigError(
                "cycle.metrics", f"CycleQD builds grids, not archive={cfg.archive.kind}", "use archive=grid"
            )
    arms = _arms(cfg, labels, text)
    island_weights = _island_weights(cfg, arms) if isl.mix or isl.models else None
    params = {
        "decay": sch.decay,
        **{"ucb1": {"c": sch.c}, "epsilon_greedy": {"epsilon": sch.epsilon}}.get(sch.rule, {}),
    }
    if island_weights is None and sch.rule != "fixed":
        check_bandit(sch.rule, len(arms), **params)
    return StrategyPlan(
        arms=arms,
        rule=sch.rule,
        params=params,
        island_weights=island_weights,
        cost=sch.cost,
        islands=IslandPolicy(isl.migrate_every, isl.topology, isl.migrants, isl.reset_patience),
        selection=selection,
        meta=_meta_settings(cfg, task) if text else None,
        meta_model=cfg.meta.model,
        gate=_gate_settings(cfg),
        cycle=cycle,
        tiebreak=_tiebreak_settings(cfg, text),
    )


def _arms(cfg: DictConfig, labels: Sequence[str], text: bool) -> tuple[ArmPlan, ...]:
    """One arm per operator entry, or per (entry, model) with ``scheduler.arms=operators_models``
    or per-island model weights (``islands.models``), for text tasks with several models."""
    per_model = cfg.scheduler.arms == "operators_models" or bool(cfg.islands.models)
    by_model = text and per_model and len(cfg.llm.models) > 1
    models = [(m.name, float(m.weight)) for m in cfg.llm.models] if by_model else [(None, 1.0)]
    total = sum(w for _, w in models)
    return tuple(
        ArmPlan(i, model, float(o.weight) * share / total, label)
        for i, (o, label) in enumerate(zip(cfg.operators.mix, labels))
        for model, share in models
    )


def _island_weights(cfg: DictConfig, arms: Sequence[ArmPlan]) -> tuple[np.ndarray, ...]:
    """Per island, the fixed weight of each arm (``islands.mix`` x ``islands.models``)."""
    out = []
    for i in range(cfg.islands.count):
        mix = OmegaConf.to_container(cfg.islands.mix[i]) if cfg.islands.mix else None
        models = OmegaConf.to_container(cfg.islands.models[i]) if cfg.islands.models else None
        w = np.asarray(
            [
                (mix.get(a.label, 0.0) if mix is not None else a.weight)
                * (models.get(a.model, 0.0) if models else 1.0)
                for a in arms
            ]
        )
        if w.sum() <= 0:
            raise ConfigError(
                f"islands.mix[{i}]",
                "gives every arm weight 0",
                f"name operators by label: {sorted({a.label for a in arms})}",
            )
        out.append(w)
    return tuple(out)


def _meta_settings(cfg: DictConfig, task: Any) -> dict[str, Any] | None:
    """The ``InstructionPool`` keywords (None when off), checked without building a pool."""
    m = cfg.meta
    if not m.enabled:
        return None
    import genomes
    from operators.meta import DEFAULT_SEEDS, InstructionPool

    settings = dict(
        seeds=list(m.seeds) or list(DEFAULT_SEEDS),
        size=m.size,
        evolve_every=m.evolve_every,
        hyper=m.hyper,
        hyper_every=m.hyper_every,
        task=task.description,
        noun=genomes.of_task(task).noun,
    )
    try:
        InstructionPool.check_settings(**settings)
    except ConfigError as e:
        raise e.under("meta") from None
    return settings


def _gate_settings(cfg: DictConfig) -> dict[str, Any] | None:
    """The ``NoveltyGate`` keywords (None when off), checked without building a gate."""
    g = cfg.gate
    if not g.enabled:
        return None
    from qd.search.gate import NoveltyGate

    try:
        settings = NoveltyGate.check_settings(g.threshold, tuple(g.against), g.resample, g.measure)
    except ConfigError as e:
        raise e.under("gate") from None
    if settings["measure"] != "bleu":  # MiniLM embeddings
        extras.require("embeddings", "gate=embedding")
    return settings


def _tiebreak_settings(cfg: DictConfig, text: bool) -> dict[str, Any] | None:
    """The ``PairwiseJudge`` keywords (None when off): a judge reads texts in cells."""
    t = cfg.tiebreak
    if not t.enabled:
        return None
    if not text:
        raise ConfigError(
            "tiebreak.enabled",
            "a judge compares texts; numeric tasks have none",
            "use tiebreak.enabled=false",
        )
    if cfg.cycle.enabled:
        raise ConfigError(
            "tiebreak.enabled",
            "CycleQD re-scores every candidate from its metrics at each phase",
            "use cycle=none, or tiebreak.enabled=false",
        )
    if cfg.archive.kind == "novelty":
        raise ConfigError(
            "tiebreak.enabled", "a novelty archive has no cells to tie in", "use archive=grid or cvt"
        )
    from qd.search.tiebreak import PairwiseJudge

    return {"question": PairwiseJudge.check_question(t.question), "model": t.model}


def build_arms(strategy: StrategyPlan, operators: Sequence[Any]) -> list[Arm]:
    """The planned arms with their operators (``operators[i]`` built from ``Plan.operators[i]``)."""
    return [Arm(operators[a.entry], a.model, a.weight, a.label) for a in strategy.arms]


def build_strategy(strategy: StrategyPlan) -> Strategy:
    """The run's Strategy from its checked plan (nothing is checked again)."""
    num_arms = len(strategy.arms)
    if strategy.island_weights is not None:
        bandits = tuple(make_bandit("fixed", num_arms, weights=w) for w in strategy.island_weights)
    elif strategy.rule == "fixed":
        bandits = None
    else:
        bandits = (make_bandit(strategy.rule, num_arms, **strategy.params),)
    return Strategy(
        scheduler=bandits,
        cost=strategy.cost,
        islands=strategy.islands,
        selection=strategy.selection,
        meta=_meta_factory(strategy.meta),
        meta_model=strategy.meta_model,
        gate=_gate_factory(strategy.gate),
        cycle=strategy.cycle,
        tiebreak=_tiebreak_factory(strategy.tiebreak),
    )


def _meta_factory(settings: dict[str, Any] | None) -> Callable[[Any], Any] | None:
    """candidate log (the run's store) -> InstructionPool (the store comes with the engine)."""
    if settings is None:
        return None
    from operators.meta import InstructionPool

    return functools.partial(InstructionPool, **settings)


def _tiebreak_factory(settings: dict[str, Any] | None) -> Callable[[Any], Any] | None:
    """llm -> PairwiseJudge asking the run's client."""
    if settings is None:
        return None
    from qd.search.tiebreak import PairwiseJudge

    return lambda llm: PairwiseJudge(client=llm, **settings)


def _gate_factory(settings: dict[str, Any] | None) -> Callable[[Any], Any] | None:
    """cache (the run's store's) -> NoveltyGate over MiniLM embeddings cached there (BLEU needs no model)."""
    if settings is None:
        return None

    def make(cache: Any) -> Any:
        from qd.search.gate import NoveltyGate

        if settings["measure"] == "bleu":
            return NoveltyGate(None, **settings)
        from descriptors.embedding import EmbeddingCache, Encoder

        return NoveltyGate(EmbeddingCache(Encoder(), cache).embed, **settings)

    return make
