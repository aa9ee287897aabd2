"""The run's limits and the one ledger that checks them.

``Spending`` knows what is committed (evaluations in the store, LLM calls in the
store's ``llm_calls`` table) and what work in flight has reserved, so no budget
is ever exceeded by evaluations or calls: a proposal is sized to what is left,
and a gate resample reserves its call before it is made. Tokens and cost are
known only when a call returns, so calls already in flight may overshoot those two.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable
from typing import Any, TypeVar

from qd.llm.ledger import Ledger, tally

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Budget:
    """The run stops cleanly at the first limit reached (None = no limit)."""

    max_evaluations: int | None = None
    max_seconds: float | None = None
    max_llm_calls: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None


class Spending:
    """Committed and reserved work against a :class:`Budget`.

    Args:
        budget: the limits.
        evaluations: candidates already in the store (a resumed run's).
        spent: the LLM calls already in the store.
        calls_per_child: LLM calls one text child may cost (its operator call, a
            judge call per AI-feedback axis, and the calls its evaluation may make:
            ``eval_llm.calls``); 0 for numeric tasks.
        calls_per_trial: LLM calls an agent's trial (a draft on the first evaluation stage,
            ``qd.workbench``) may cost: its evaluation's.
    """

    def __init__(
        self, budget: Budget, evaluations: int, spent: Ledger, calls_per_child: int, calls_per_trial: int = 0
    ):
        self.budget, self.evaluations, self.spent = budget, evaluations, spent
        self.calls_per_child, self.calls_per_trial = calls_per_child, calls_per_trial
        self.reserved = 0  # children (and gate resamples) started and not yet committed
        self.trials = 0  # trial evaluations started and not yet committed
        self.stopping = False  # the driver stopped: reserve nothing more

    def size(self, batch_size: int) -> int:
        """Children the next proposal may have: the batch size, cut to what the budgets leave."""
        size = batch_size
        if self.budget.max_evaluations is not None:
            size = min(size, self.budget.max_evaluations - self.evaluations - self.reserved - self.trials)
        if self.calls_per_child:
            size = min(size, self.calls_left() // self.calls_per_child)
        return max(0, int(size))

    def calls_left(self) -> float:
        """LLM calls the budget leaves after the committed ones and the reserved ones."""
        if self.budget.max_llm_calls is None:
            return math.inf
        reserved = self.reserved * self.calls_per_child + self.trials * self.calls_per_trial
        return self.budget.max_llm_calls - self.spent.calls - reserved

    def reserve(self, units: int) -> None:
        """Holds ``units`` children (or resamples) until :meth:`commit` releases them."""
        self.reserved += units

    def stop(self) -> None:
        """The run is stopping: no gate resample may reserve another call."""
        self.stopping = True

    def try_reserve_call(self) -> bool:
        """Reserves one more LLM call (a gate resample) if the budgets leave room."""
        if self.stopping or self.calls_left() < 1:
            return False
        self.reserved += 1
        return True

    def try_reserve_trial(self) -> bool:
        """Reserves one trial evaluation (an agent's) with its calls if the budgets leave room;
        :meth:`commit` releases it with the proposal that made it."""
        evaluations = self.budget.max_evaluations
        if self.stopping or self.calls_left() < self.calls_per_trial:
            return False
        if evaluations is not None and evaluations - self.evaluations - self.reserved - self.trials < 1:
            return False
        self.trials += 1
        return True

    def commit(self, candidates: int, reserved: int, calls: Ledger, trials: int = 0) -> None:
        """A proposal's candidates and calls are in the store; its reservation (``reserved``
        units, ``trials`` trials) is released."""
        self.evaluations += candidates
        self.reserved -= reserved
        self.trials -= trials
        self.spent.merge(calls)

    def exhausted(self, elapsed: float, live: Ledger | None) -> bool:
        """A limit checked against time and the client's live ledger (tokens, cost) is reached."""
        b = self.budget
        if b.max_seconds is not None and elapsed >= b.max_seconds:
            return True
        if live is not None:
            if b.max_tokens is not None and live.tokens >= b.max_tokens:
                return True
            if b.max_cost is not None and live.cost >= b.max_cost:
                return True
        return False

    async def counted(self, work: Awaitable[T], store: Any) -> T:
        """Awaits ``work`` (a refit, a meta mutation: LLM calls outside any proposal) and
        records the calls it made in the store and the budget, even when it fails."""
        with tally() as calls:
            try:
                return await work
            finally:
                if calls.cells:
                    store.calls.add(calls.rows())
                    self.spent.merge(calls)
