"""What ``qd.optimize`` returns: the best candidate, the elites as rows, the held-out score,
the ledger and the run directory, read back from the run directory once the run has ended
(so a continued run's result covers both calls)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from qd.llm import Ledger

__all__ = ["Best", "OptimizeResult", "read_result"]


@dataclasses.dataclass(frozen=True)
class Best:
    """The best elite: its text, fitness, the evaluator's metrics and its id in the store."""

    text: str
    fitness: float
    metrics: dict[str, Any]
    id: int


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """A finished (or interrupted) ``qd.optimize`` run.

    Attributes:
        best: the best elite (None: nothing valid was found).
        elites: one flat dict per archive elite, best first (``pandas.DataFrame(result.elites)``):
            id, island, cell, fitness, text, operator, the descriptor as ``d0, d1, ...`` (or the
            run's axis names) and the evaluator's numeric metrics.
        heldout: (score, (low, high)) on the dataset's test split, a 95 % bootstrap interval;
            None without a test split.
        ledger: the run's model calls, tokens and cost by (role, model) (``ledger.split("role")``).
        run_dir: the run's folder (``qd show``, ``qd explore``, ``qd export``, ``run_dir=``).
        summary: the engine's final summary (evaluations, coverage, QD score, ``stop_reason``).
    """

    best: Best | None
    elites: list[dict[str, Any]]
    heldout: tuple[float, tuple[float, float]] | None
    ledger: Ledger
    run_dir: Path
    summary: dict[str, Any]

    def __repr__(self) -> str:
        best = "none" if self.best is None else f"{self.best.fitness:.4g} (id {self.best.id})"
        held = "" if self.heldout is None else f", heldout={self.heldout[0]:.3g} [{self.heldout[1][0]:.3g}, "
        held += "" if self.heldout is None else f"{self.heldout[1][1]:.3g}]"
        return (
            f"OptimizeResult(best={best}, elites={len(self.elites)}{held}, "
            f"llm_calls={self.ledger.calls}, run_dir='{self.run_dir}')"
        )


def read_result(
    run_dir: Path, summary: dict[str, Any], heldout: Any, scoring: Ledger | None
) -> OptimizeResult:
    """The result of the run in ``run_dir``: its archive's elites and its committed calls, with
    the held-out score's calls (``scoring``, role ``heldout``) beside them."""
    from qd.api import elites
    from qd.rundir import RunDir

    found = elites(run_dir)
    with RunDir(run_dir) as run:
        ledger = Ledger.from_rows(run.store.calls.totals())
        axes = run.geometry.axes
    if scoring is not None:
        ledger.merge(scoring)
    rows = [_row(e, axes) for e in found]
    best = None
    if found:
        c = found[0].candidate
        best = Best(c.text or "", float(found[0].fitness), dict(c.metrics or {}), int(c.id))
    return OptimizeResult(best, rows, heldout, ledger, Path(run_dir), summary)


def _row(elite: Any, axes: tuple[str, ...]) -> dict[str, Any]:
    c = elite.candidate
    row = {
        "id": c.id,
        "island": elite.island,
        "cell": elite.cell,
        "fitness": elite.fitness,
        "text": c.text,
        "operator": c.operator,
    }
    row.update({str(a): float(x) for a, x in zip(axes, elite.descriptor)})
    numbers = {k: v for k, v in (c.metrics or {}).items() if isinstance(v, (int, float)) and k not in row}
    return row | numbers
