"""From the hydra groups to a ``qd.search.strategy.Strategy`` and the scheduler's arms.

Every combination that cannot work is refused here, before any server starts,
with a one-line error naming the field and the fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from qd.search import select
from qd.search.cycle import CyclicObjective
from qd.contract import ConfigError
from qd.search.scheduler import RULES, make_bandit
from qd.search.strategy import COSTS, Arm, IslandPolicy, Selection, Strategy

ARM_KINDS = ("operators", "operators_models")


def _fail_on(error: ValueError, prefix: str) -> ConfigError:
    """A module's ``"field: problem"`` ValueError as a ConfigError under ``prefix``."""
    field, _, problem = str(error).partition(": ")
    field = field if field.startswith(prefix.split(".")[0] + ".") else f"{prefix}.{field}"
    return ConfigError(field, problem or str(error))


def check_strategy(cfg: DictConfig, task: Any, describer: Any) -> None:
    """Validates the strategy groups against each other and the task."""
    isl, sel, sch = cfg.islands, cfg.select, cfg.scheduler
    text = task.kind != "vector"
    if isl.reset_patience and isl.count < 2:
        raise ConfigError("islands.reset_patience", "a reset needs surviving islands", "set islands.count >= 2")
    for field in ("mix", "models"):
        if isl[field] and len(isl[field]) != isl.count:
            raise ConfigError(f"islands.{field}", f"has {len(isl[field])} entries for {isl.count} islands",
                              "give one per island, or none")
        for i, weights in enumerate(isl[field]):
            for name, w in weights.items():
                if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
                    raise ConfigError(f"islands.{field}[{i}].{name}", f"weight {w!r} is not a number >= 0")
    if isl.models and not text:
        raise ConfigError("islands.models", "numeric tasks call no model", "remove islands.models")
    if sel.parents not in select.PARENT_RULES:
        raise ConfigError("select.parents", f"unknown rule {sel.parents!r}", f"use one of {list(select.PARENT_RULES)}")
    if sel.inspirations not in select.INSPIRATION_RULES:
        raise ConfigError("select.inspirations", f"unknown rule {sel.inspirations!r}",
                          f"use one of {list(select.INSPIRATION_RULES)}")
    if sel.inspirations == "islands" and isl.count < 2:
        raise ConfigError("select.inspirations", "islands needs other islands", "set islands.count >= 2")
    if sch.rule not in RULES:
        raise ConfigError("scheduler.rule", f"unknown rule {sch.rule!r}", f"use one of {list(RULES)}")
    if sch.arms not in ARM_KINDS:
        raise ConfigError("scheduler.arms", f"unknown arms {sch.arms!r}", f"use one of {list(ARM_KINDS)}")
    if sch.cost not in COSTS:
        raise ConfigError("scheduler.cost", f"unknown cost {sch.cost!r}", f"use one of {list(COSTS)}")
    if sch.cost == "usd" and text and not any(m.price_in or m.price_out for m in cfg.llm.models):
        raise ConfigError("scheduler.cost", "usd needs prices", "set llm.models[i].price_in/price_out, or cost=calls")
    if (isl.mix or isl.models) and sch.rule != "fixed":
        raise ConfigError("islands.mix", f"per-island mixes are fixed weights; scheduler.rule={sch.rule} learns them",
                          "use scheduler=fixed, or drop islands.mix/models")
    if not text:
        for group in ("meta", "gate"):
            if cfg[group].enabled:
                raise ConfigError(f"{group}.enabled", "works on LLM text tasks only", f"use {group}=none")
    if cfg.cycle.metrics:
        if describer is not None:
            raise ConfigError("cycle.metrics", "CycleQD sets the descriptors itself", "use descriptor=task")
        if cfg.archive.kind != "grid":
            raise ConfigError("cycle.metrics", f"CycleQD builds grids, not archive={cfg.archive.kind}",
                              "use archive=grid")
    build_cycle(cfg)
    _meta_factory(cfg, "")
    try:
        build_gate_settings(cfg)
    except ValueError as e:
        raise _fail_on(e, "gate") from None


def build_cycle(cfg: DictConfig) -> CyclicObjective | None:
    c = cfg.cycle
    if not c.metrics:
        return None
    try:
        return CyclicObjective.create(c.metrics, c.lower, c.upper, c.bins, c.every)
    except ValueError as e:
        raise _fail_on(e, "cycle") from None


def build_gate_settings(cfg: DictConfig) -> dict[str, Any] | None:
    """The gate's checked arguments (None when off); the gate itself needs the encoder."""
    g = cfg.gate
    if not g.enabled:
        return None
    from qd.search.gate import NoveltyGate

    settings = {"threshold": g.threshold, "against": tuple(g.against), "resample": g.resample}
    NoveltyGate(None, **settings)  # checks them
    return settings


def build_arms(cfg: DictConfig, operators: list[tuple[Any, float]], labels: list[str]) -> list[Arm]:
    """One arm per operator entry, or per (entry, model) with ``scheduler.arms=operators_models``
    or per-island model weights (``islands.models``)."""
    per_model = cfg.scheduler.arms == "operators_models" or bool(cfg.islands.models)
    by_model = per_model and len(cfg.llm.models) > 1
    models = [(m.name, m.weight) for m in cfg.llm.models] if by_model else [(None, 1.0)]
    total = sum(w for _, w in models)
    return [Arm(op, model, weight * share / total, label)
            for (op, weight), label in zip(operators, labels) for model, share in models]


def _island_weights(cfg: DictConfig, arms: list[Arm]) -> list[np.ndarray]:
    """Per island, the fixed weight of each arm (``islands.mix`` x ``islands.models``)."""
    out = []
    for i in range(cfg.islands.count):
        mix = OmegaConf.to_container(cfg.islands.mix[i]) if cfg.islands.mix else None
        models = OmegaConf.to_container(cfg.islands.models[i]) if cfg.islands.models else None
        w = np.asarray([
            (mix.get(a.label, 0.0) if mix is not None else a.weight) * (models.get(a.model, 0.0) if models else 1.0)
            for a in arms
        ])
        if w.sum() <= 0:
            raise ConfigError(f"islands.mix[{i}]", "gives every arm weight 0",
                              f"name operators by label: {sorted({a.label for a in arms})}")
        out.append(w)
    return out


def build_strategy(cfg: DictConfig, arms: list[Arm], task: Any) -> Strategy:
    """The run's Strategy (checked by :func:`check_strategy` first)."""
    sch = cfg.scheduler
    if cfg.islands.mix or cfg.islands.models:
        bandits = tuple(make_bandit("fixed", len(arms), weights=w) for w in _island_weights(cfg, arms))
    elif sch.rule == "fixed":
        bandits = None
    else:
        params = {"ucb1": {"c": sch.c}, "epsilon_greedy": {"epsilon": sch.epsilon}}.get(sch.rule, {})
        try:
            bandits = (make_bandit(sch.rule, len(arms), decay=sch.decay, **params),)
        except ValueError as e:
            raise _fail_on(e, "scheduler") from None
    isl = cfg.islands
    return Strategy(
        scheduler=bandits,
        cost=sch.cost,
        islands=IslandPolicy(isl.migrate_every, isl.topology, isl.migrants, isl.reset_patience),
        selection=Selection(cfg.select.parents, cfg.select.inspirations, cfg.select.temperature, cfg.select.k),
        meta=_meta_factory(cfg, getattr(task, "description", "")),
        meta_model=cfg.meta.model,
        gate=_gate_factory(cfg),
        cycle=build_cycle(cfg),
    )


def _meta_factory(cfg: DictConfig, task_description: str) -> Callable[[Any], Any] | None:
    """store -> InstructionPool, its settings checked now (the store comes with the engine)."""
    m = cfg.meta
    if not m.enabled:
        return None
    from operators.meta import DEFAULT_SEEDS, InstructionPool

    settings = dict(seeds=list(m.seeds) or DEFAULT_SEEDS, size=m.size, evolve_every=m.evolve_every,
                    hyper=m.hyper, task=task_description)
    try:
        InstructionPool(None, **settings)
    except ValueError as e:
        raise _fail_on(e, "meta") from None
    return functools.partial(InstructionPool, **settings)


def _gate_factory(cfg: DictConfig) -> Callable[[Any], Any] | None:
    """store -> NoveltyGate over MiniLM embeddings cached in that store."""
    settings = build_gate_settings(cfg)
    if settings is None:
        return None

    def make(store: Any) -> Any:
        from descriptors.embedding import EmbeddingCache, Encoder
        from qd.search.gate import NoveltyGate

        return NoveltyGate(EmbeddingCache(Encoder(), store).embed, **settings)

    return make


def operator_labels(cfg: DictConfig) -> list[str]:
    """Each ``operators.mix`` entry's arm label (``label``, else its operator name), unique."""
    labels = [o.label or o.name for o in cfg.operators.mix]
    for i, label in enumerate(labels):
        if labels.index(label) != i:
            raise ConfigError(f"operators.mix[{i}].label", f"{label!r} names two entries",
                              "give each entry of the same operator its own label")
    return labels

