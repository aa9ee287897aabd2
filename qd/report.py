"""What a run reports: the summary (returned by ``Engine.run``, the body of each ``commit`` event,
printed by ``qd-run --json``), the progress (``qd.progress``) and the lines a run ends with."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from qd import archive
from qd.budget import Budget
from qd.progress import Gauge, Status, binding, clock, eta

# a budget's unit (``qd.progress.Gauge``) -> its limit in ``qd.budget.Budget`` and ``runner.*``
LIMITS = {
    "evaluations": "max_evaluations",
    "LLM calls": "max_llm_calls",
    "tokens": "max_tokens",
    "cost": "max_cost",
    "seconds": "max_seconds",
}


class Report:
    """Archive statistics kept current after each change, and the views of them.

    The statistics are running sums over a host copy of the elites' fitness:
    :meth:`refresh` reads the whole archive (at the start, after a rebuild or an
    island move), :meth:`inserted` adds one insert's winners in O(batch), so a
    commit costs the same in a run of ten cells or a million. They follow
    ``qd.archive.stats`` and ``union_stats`` (summed in float64 rather than float32).

    Args:
        islands: the island count.
        qd_offset: subtracted from each elite's fitness in the QD score.
        union: report islands merged cell by cell (several islands of a cell archive).
        llm: the run's client (its live ledger), or None.
        describer: the run's describer, or None.
        cells: a cell archive (grid, CVT), whose inserts add up: each winner takes one
            cell and moves no other; otherwise every insert reads the archive again.
        budget: the run's limits, which the progress counts against.
    """

    def __init__(
        self,
        islands: int,
        qd_offset: float,
        union: bool,
        llm: Any = None,
        describer: Any = None,
        cells: bool = False,
        budget: Budget = Budget(),
    ):
        self.islands, self.qd_offset, self.llm, self.describer = islands, qd_offset, llm, describer
        self.union, self.add_up, self.budget = union, cells, budget
        self.start_session(0)

    def refresh(self, state: archive.ArchiveState) -> None:
        """Reads the whole archive: the host copy and every sum from scratch (of a Pareto
        archive, its best member per cell: ``qd.archive.best_per_cell``)."""
        state = archive.best_per_cell(state)
        fitness, ids = jax.device_get((state.fitness, state.genome_id))
        self._fitness = np.where(ids >= 0, fitness, -np.inf).astype(np.float64)  # -inf: empty
        filled = np.isfinite(self._fitness)
        self._num = filled.sum(1)
        self._sum = np.where(filled, self._fitness, 0.0).sum(1)
        self._best = self._fitness.max(1)
        if self.union:
            self._union_best = self._fitness.max(0)
        self._publish()

    def inserted(
        self,
        state: archive.ArchiveState,
        island: np.ndarray,
        fitness: np.ndarray,
        result: archive.InsertResult,
        moved: bool = False,
    ) -> None:
        """Adds an insert's winners: ``island`` and ``fitness`` are its offers, ``result`` its
        outcome. Reads ``state`` (the archive after it) instead when elites also ``moved``
        between islands since, or when inserts do not add up."""
        if moved or not self.add_up:
            return self.refresh(state)
        won = np.flatnonzero(np.asarray(result.is_elite))
        isl, cell = np.asarray(island)[won], np.asarray(result.cell)[won]
        new = np.asarray(fitness, np.float32)[won].astype(np.float64)
        old = self._fitness[isl, cell]
        was = np.isfinite(old)
        np.add.at(self._sum, isl, new - np.where(was, old, 0.0))
        np.add.at(self._num, isl, (~was).astype(self._num.dtype))
        self._fitness[isl, cell] = new
        lowered = np.unique(isl[was & (old >= self._best[isl]) & (new < old)])  # CMA-MAE: the best fell
        np.maximum.at(self._best, isl, new)
        self._best[lowered] = self._fitness[lowered].max(1)
        if self.union:
            cells = np.unique(cell)
            self._union_best[cells] = self._fitness[:, cells].max(0)
        self._publish()

    def _publish(self) -> None:
        """``stats`` (and ``union_stats``) as ``qd.archive.stats`` shapes them: per island, then global."""
        cells = self._fitness.shape[1]
        num = np.append(self._num, self._num.sum()).astype(np.float64)
        total = np.append(self._sum, self._sum.sum())
        best = np.append(self._best, self._best.max())
        size = np.append(np.full(self.islands, cells), cells * self.islands)
        self.stats = _stats(num, total, best, size, self.qd_offset)
        if self.union:
            filled = np.isfinite(self._union_best)
            self.union_stats = _stats(
                filled.sum()[None].astype(np.float64),
                np.where(filled, self._union_best, 0.0).sum()[None],
                self._union_best.max()[None],
                np.asarray([cells]),
                self.qd_offset,
            )

    def start_session(self, evaluations: int) -> None:
        """This session starts (a resume starts another): its pace is counted from here."""
        self.session_start, self.session_evals = time.monotonic(), evaluations
        self._session_spent = self._spent(evaluations, 0.0)

    def rate(self, evaluations: int) -> float:
        spent = time.monotonic() - self.session_start
        return (evaluations - self.session_evals) / spent if spent > 0 else 0.0

    def summary(
        self,
        evaluations: int,
        batches: int,
        elapsed: float,
        fits: int,
        stop_reason: str | None,
        counts: bool = True,
    ) -> dict[str, Any]:
        """The run so far (without ``evaluations`` and ``batches`` unless ``counts``)."""
        s, fields = self.stats, archive.ArchiveStats._fields
        out = {
            **({"evaluations": evaluations, "batches": batches} if counts else {}),
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

    def _spent(self, evaluations: int, elapsed: float) -> dict[str, float]:
        """What each budget counts, by its unit: evaluations, seconds and, with a model, the
        client's live ledger (calls, tokens, cost; a resumed run's stored calls included)."""
        out = {"evaluations": float(evaluations), "seconds": elapsed}
        if self.llm is not None:
            t = self.llm.ledger.total()
            out.update({"LLM calls": t.calls, "tokens": t.tokens_in + t.tokens_out, "cost": t.cost})
        return out

    def gauges(self, evaluations: int, elapsed: float) -> list[Gauge]:
        """Every budget counted, evaluations first, each with its ETA at this session's pace."""
        session, out = time.monotonic() - self.session_start, []
        for unit, done in self._spent(evaluations, elapsed).items():
            total = getattr(self.budget, LIMITS[unit])
            if unit == "seconds":
                left = None if total is None else max(0.0, total - done)
                out.append(Gauge(unit, done, total, left))
            else:
                out.append(Gauge(unit, done, total, eta(done, total, self._session_spent[unit], session)))
        return out

    def status(self, evaluations: int, elapsed: float, prefix: str = "") -> Status:
        """The progress after a commit: the budget that binds, then best so far, coverage, QD
        score, pace and the model's calls and cost, in that order of importance."""
        g, gauge = self.stats, binding(self.gauges(evaluations, elapsed))
        best = float(g.max_fitness[-1])
        fields = [
            f"best {best + 0.0:.4g}" if np.isfinite(best) else "no elite yet",  # + 0.0: -0 reads 0
            f"coverage {100 * float(g.coverage[-1]):.3g}%",
            f"QD score {float(g.qd_score[-1]):.4g}",
            f"{self.rate(evaluations):.3g} evals/s",
        ]
        if self.llm is not None:
            t = self.llm.ledger.total()
            calls = [] if gauge.unit == "LLM calls" else [f"{t.calls} LLM calls"]
            fields += [*calls, *([f"{t.failed} failed"] if t.failed else []), f"${t.cost:.4g}"]
        return Status(gauge, tuple(fields), self.status_line(evaluations, prefix))

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


def _stats(
    num: np.ndarray, total: np.ndarray, best: np.ndarray, cells: np.ndarray, offset: float
) -> archive.ArchiveStats:
    qd_score = total - num * offset
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / num  # NaN when empty, as qd.archive.stats
    return archive.ArchiveStats(
        num_elites=num,
        coverage=num / cells,
        qd_score=qd_score,
        norm_qd_score=qd_score / cells,
        max_fitness=best,
        mean_fitness=mean,
    )


def commit_lines(
    proposals: list[Any],
    result: archive.InsertResult,
    credits: list[dict | None],
    batches: int,
    evaluations: int,
) -> list[dict[str, Any]]:
    """Each proposal's own fields of its ``commit`` event (``qd.events``), for proposals
    committed together after ``batches`` before them, ``evaluations`` stored with them."""
    added, lines, end = np.asarray(result.status) > 0, [], 0
    before = evaluations - len(added)
    for k, (p, credit) in enumerate(zip(proposals, credits)):
        start, end = end, end + len(p.candidates)
        lines.append(
            {
                "step": batches + k + 1,
                "batches": batches + k + 1,
                "evaluations": before + end,
                "batch": end - start,
                "added": int(added[start:end].sum()),
                "wave": len(proposals),
                **(credit or {}),
            }
        )
    return lines


def closing_lines(summary: dict[str, Any], run_dir: Path, budget: Budget, valid: int | None) -> list[str]:
    """The end of a run as a person reads it, one aligned ``name  value`` line each: what it
    evaluated (``valid`` of them valid; None: the store keeps only elites), what the archive
    holds, what the model cost, why and when it stopped, and where its files are. The whole
    summary stays in ``events.jsonl`` and in ``qd-run --json``'s line."""
    g = summary["global"]
    rows = [
        ("evaluations", f"{summary['evaluations']}" + ("" if valid is None else f" ({valid} valid)")),
        ("coverage", f"{100 * g['coverage']:.3g}% ({int(g['num_elites'])} elites)"),
        ("QD score", f"{g['qd_score']:.6g}"),
    ]
    if "union" in summary:  # islands merged cell by cell: what the run found
        u = summary["union"]
        rows.append(("islands merged", f"coverage {100 * u['coverage']:.3g}%, QD score {u['qd_score']:.6g}"))
    if "descriptor" in summary:
        d = summary["descriptor"]
        rows.append(("descriptor", f"{d['name']} ({d['dim']} axes, {d['fits']} fits)"))
    if "llm" in summary:
        m = summary["llm"]
        tokens = f"{m['tokens_in'] + m['tokens_out']:,} ({m['tokens_in']:,} in, {m['tokens_out']:,} out)"
        rows += [
            ("LLM calls", f"{m['calls']} ({m['failed_calls']} failed, {m['cached_calls']} cached)"),
            ("tokens", tokens),
            ("cost", f"${m['cost']:.4g}"),
        ]
    rows += [
        ("stopped", stopped(summary, budget)),
        ("elapsed", clock(summary["elapsed_s"])),
        ("run dir", str(run_dir)),
    ]
    width = max(len(name) for name, _ in rows) + 2
    return [f"{name:<{width}}{value}" for name, value in rows]


def stopped(summary: dict[str, Any], budget: Budget) -> str:
    """Why a run ended: the reason it stopped on (a failure, or a stop rule met), else the first
    budget it reached, else a stop asked for (Ctrl-C, SIGTERM)."""
    if summary.get("stop_reason") or summary.get("stop"):
        return summary.get("stop_reason") or summary["stop"]
    llm = summary.get("llm", {})
    spent = {
        "max_evaluations": summary["evaluations"],
        "max_llm_calls": llm.get("calls", 0),
        "max_tokens": llm.get("tokens_in", 0) + llm.get("tokens_out", 0),
        "max_cost": llm.get("cost", 0.0),
        "max_seconds": summary["elapsed_s"],
    }
    for limit, value in spent.items():
        total = getattr(budget, limit)
        if total is not None and value >= total:
            return f"runner.{limit}={total:g} reached"
    return "asked to stop"
