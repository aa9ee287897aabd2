"""What a run reports: the summary (returned by ``Engine.run``, printed by ``qd-run``,
the body of each ``commit`` event) and the progress line."""

from __future__ import annotations

import time
from typing import Any

import jax

from qd import archive


class Report:
    """Archive statistics kept current after each change, and the views of them.

    Args:
        islands: the island count.
        qd_offset: subtracted from each elite's fitness in the QD score.
        union: report islands merged cell by cell (several islands of a cell archive).
        llm: the run's client (its live ledger), or None.
        describer: the run's describer, or None.
    """

    def __init__(self, islands: int, qd_offset: float, union: bool, llm: Any = None, describer: Any = None):
        self.islands, self.qd_offset, self.union, self.llm, self.describer = islands, qd_offset, union, llm, describer
        self.session_start, self.session_evals = time.monotonic(), 0

    def refresh(self, state: archive.ArchiveState) -> None:
        """Reads the archive's statistics (once per change, not per view)."""
        self.stats = jax.device_get(archive.stats(state, self.qd_offset))
        if self.union:
            self.union_stats = jax.device_get(archive.union_stats(state, self.qd_offset))

    def start_session(self, evaluations: int) -> None:
        self.session_start, self.session_evals = time.monotonic(), evaluations

    def rate(self, evaluations: int) -> float:
        spent = time.monotonic() - self.session_start
        return (evaluations - self.session_evals) / spent if spent > 0 else 0.0

    def summary(self, evaluations: int, batches: int, elapsed: float, fits: int,
                stop_reason: str | None) -> dict[str, Any]:
        s, fields = self.stats, archive.ArchiveStats._fields
        out = {
            "evaluations": evaluations,
            "batches": batches,
            "elapsed_s": round(elapsed, 3),
            "global": {f: float(getattr(s, f)[-1]) for f in fields},
            "islands": [{f: float(getattr(s, f)[i]) for f in fields} for i in range(self.islands)],
        }
        if self.union:  # "global" counts a cell once per island holding it
            out["union"] = {f: float(getattr(self.union_stats, f)[0]) for f in fields}
        if self.llm is not None:
            out["llm"] = self.llm.ledger.as_dict()
        if self.describer is not None:
            out["descriptor"] = {"name": self.describer.name, "dim": self.describer.dim, "fits": fits}
        if stop_reason:
            out["stop_reason"] = stop_reason
        return out

    def status_line(self, evaluations: int, prefix: str = "") -> str:
        g = self.stats
        return (
            f"{prefix} evals={evaluations} evals/s={self.rate(evaluations):.3g} "
            f"qd_score={float(g.qd_score[-1]):.4g} coverage={float(g.coverage[-1]):.3f} "
            f"best={float(g.max_fitness[-1]):.4g}{self._llm_status()}"
        ).strip()

    def _llm_status(self) -> str:
        if self.llm is None:
            return ""
        ledger = self.llm.ledger
        t, roles = ledger.total(), ledger.split("role")
        split = "" if len(roles) < 2 else " (" + " ".join(f"{r}={u.calls}" for r, u in roles.items()) + ")"
        return (
            f" llm_calls={t.calls}{split} failed={t.failed} in_flight={ledger.in_flight} "
            f"tokens={t.tokens_in + t.tokens_out} cost=${t.cost:.4f}"
        )
