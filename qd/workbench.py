"""An agent operator's trials: a draft run on the first evaluation stage, paid for and kept.

The agent operator (``operators.agent``) may try a draft before it submits its child. The
proposer gives each child a :class:`TrialBench` (the contract's ``Workbench`` port), which runs
the draft on the evaluator's first stage (``Evaluator.first_stage``) and keeps the outcome as
the fields of a candidate of its own: the proposal stores it beside the child, so a trial is

- **counted**: it reserves an evaluation (and the model calls its evaluation may make) before
  it runs (``Spending.try_reserve_trial``), released when its proposal commits, and is then one
  of the run's evaluations (``runner.max_evaluations`` and the stop rules count it);
- **never placed**: ``valid`` is False and ``artifacts[TRIAL]`` marks it, so the archive,
  the describer and the duplicate index (``qd.search.gate.evaluated``) pass it by, while the
  broken-evaluator guard still sees a harness failure in its error.
"""

from __future__ import annotations

import math
from typing import Any

from qd.contract import Child, Trial
from qd.sandbox.protocol import HARNESS, exception_line
from qd.search.gate import TRIAL


class TrialBench:
    """One child's trials (``qd.contract.Workbench``).

    Args:
        evaluator: the run's (its ``first_stage`` runs a trial).
        spending: ``qd.budget.Spending`` (each trial reserves an evaluation there).
        operator: the store's ``operator`` of a trial, e.g. ``agent>trial``.
    """

    def __init__(self, evaluator: Any, spending: Any, operator: str):
        self.evaluator, self.spending, self.operator = evaluator, spending, operator
        self.tried: list[tuple[Child, dict[str, Any]]] = []  # each trial's child and candidate fields

    async def trial(self, text: str) -> Trial | None:
        if not self.spending.try_reserve_trial():
            return None
        try:
            ev = await self.evaluator.first_stage([text])
            metrics, error = _first(ev.metrics), _first(ev.error)
            fields = dict(
                fitness=float(ev.fitness[0]),
                descriptor=None,
                metrics=metrics,
                error=error,
                artifacts={**(_first(ev.artifacts) or {}), TRIAL: "first evaluation stage only"},
                eval_seconds=_first(ev.seconds),
                trace=_first(ev.traces),
            )
            trial = Trial(bool(ev.valid[0]), fields["fitness"], metrics, _feedback(error, ev))
        except Exception as e:  # a broken evaluation fails the trial; the run's guard sees it
            fields = dict(fitness=math.nan, descriptor=None, error=f"{HARNESS}trial: {exception_line(e)}")
            trial = Trial(False, math.nan, None, fields["error"])
        self.tried.append(
            (Child(text, None, self.operator, None, None, None, 0, 0, 0.0), {**fields, "valid": False})
        )
        return trial


def _first(values: list | None) -> Any:
    return values[0] if values else None


def _feedback(error: str | None, ev: Any) -> str | None:
    """The trial's error and output tails, as a parent's feedback reads (``qd.proposers.as_parent``)."""
    notes = [f"error: {error}"] if error else []
    notes += [f"{name}:\n{value}" for name, value in (_first(ev.artifacts) or {}).items()]
    return "\n".join(notes) or None
