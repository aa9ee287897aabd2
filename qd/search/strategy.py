"""How a run searches, beyond its archive: one dataclass of switchable strategies.

The engine reads every search choice from a :class:`Strategy`: the island
policy (migration, stagnation reset), how parents and inspirations are drawn,
the scheduler choosing an arm (operator, model) per proposal, meta-prompt
evolution, the novelty gate and cyclic objectives. The defaults are plain
MAP-Elites. ``qd.run`` builds one from the hydra groups ``islands``, ``select``,
``scheduler``, ``meta``, ``gate`` and ``cycle``.

Credit. The scheduler and the instruction pool are paid in archive
improvement: a child's credit is its contribution to the QD score (a new cell:
fitness − ``qd_offset``; an improved cell: the fitness gain), floored at 0;
children that did not enter earn 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from qd import archive
from qd.search.cycle import CyclicObjective

COSTS = ("calls", "tokens", "usd")


@dataclasses.dataclass(frozen=True)
class Arm:
    """What a proposal is made with: an operator and (for LLM operators) a model.

    ``model`` None lets the operator's client pick (by ``llm.models`` weights).
    """

    operator: Any
    model: str | None = None
    weight: float = 1.0  # the ``fixed`` scheduler's share
    label: str = ""

    @property
    def name(self) -> str:
        base = self.label or self.operator.name
        return f"{base}@{self.model}" if self.model else base


@dataclasses.dataclass(frozen=True)
class IslandPolicy:
    """Migration every ``migrate_every`` insertions per island (0 = never) to its
    ``topology`` targets, ``migrants`` elites each; a reset of the weakest half
    after ``reset_patience`` insertions without a new best (0 = never)."""

    migrate_every: int = 0
    topology: str = "ring"
    migrants: int = 1
    reset_patience: int = 0


@dataclasses.dataclass(frozen=True)
class Selection:
    """Rules of ``qd.search.select``: ``parents`` and ``inspirations``, with their knobs, and
    what the rules of ``qd.search.criteria`` read: the task's named ``objectives`` and the
    hypervolume ``reference`` point (each objective in its own units; None: derived)."""

    parents: str = "uniform"
    inspirations: str = "uniform"
    temperature: float = 1.0
    k: int = 5
    objectives: tuple[tuple[str, str], ...] = ()
    reference: tuple[float, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Strategy:
    """Everything the engine needs to decide how to search (defaults: MAP-Elites).

    Attributes:
        scheduler: a ``qd.search.scheduler.Bandit`` per island (one shared object when
            the islands share one), or None for the arms' fixed weights.
        cost: what credit is divided by: LLM ``calls``, ``tokens`` or ``usd``
            (numeric tasks: evaluations).
        islands, selection: see :class:`IslandPolicy`, :class:`Selection`.
        meta: candidate log (the run's store) -> ``operators.meta.InstructionPool``
            (the pool keeps its instructions there), or None; ``meta_model`` mutates them
            (None: the client's pick).
        gate: cache (``store.cache``) -> ``qd.search.gate.NoveltyGate`` (its embeddings
            are cached there), or None. Exact duplicates are reused whatever the gate.
        cycle: a ``CyclicObjective`` or None.
        tiebreak: llm -> ``qd.search.tiebreak.PairwiseJudge`` (settles a child's tie with
            its cell's incumbent), or None.
    """

    scheduler: tuple[Any, ...] | None = None
    cost: str = "calls"
    islands: IslandPolicy = IslandPolicy()
    selection: Selection = Selection()
    meta: Callable[[Any], Any] | None = None
    meta_model: str | None = None
    gate: Callable[[Any], Any] | None = None
    cycle: CyclicObjective | None = None
    tiebreak: Callable[[Any], Any] | None = None


def child_credit(result: archive.InsertResult, fitness: np.ndarray, qd_offset: float) -> np.ndarray:
    """f32[B]: each candidate's contribution to the QD score, floored at 0 (see module doc)."""
    status = np.asarray(result.status)
    gain = np.where(
        status == archive.NEW_CELL,
        np.asarray(fitness, np.float64) - qd_offset,
        np.where(status == archive.IMPROVED, np.asarray(result.improvement, np.float64), 0.0),
    )
    return np.maximum(np.nan_to_num(gain, nan=0.0), 0.0).astype(np.float32)


def proposal_cost(candidates: list[Any], cost: str) -> float:
    """What a proposal spent, in the scheduler's unit (numeric tasks: evaluations)."""
    llm = [c for c in candidates if c.model is not None]
    if not llm:
        return float(len(candidates))
    if cost == "tokens":
        return float(sum(c.tokens_in + c.tokens_out for c in llm))
    if cost == "usd":
        return float(sum(c.cost for c in llm))
    return float(len(llm))
