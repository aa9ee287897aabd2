"""A run in one row: what ``qd show``'s header line and each row of ``qd compare`` say.

The archive numbers come from the snapshot (``RunDir.snapshot``), not from the last
commit event, so they hold for a run in progress, a crashed one and a finished one
alike, and are the archive a resume would continue from.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import OmegaConf

from qd import fronts
from qd.rundir import RunDir
from qd.views.render import fmt


def summary(run: RunDir) -> dict[str, Any]:
    """Run dir, experiment, archive shape, evaluations, elites, coverage, QD score, best,
    model calls and cost (the ledger), and wall time.

    ``coverage`` and ``qd_score`` treat the islands as one archive of islands x cells
    (the ``global`` numbers of the commit events); ``qd_score`` subtracts the run's
    ``archive.qd_offset`` from each elite. ``hypervolume``: a Pareto run's total over its
    fronts (``qd.fronts``; None for one elite per cell). ``wall_s`` adds up the sessions' elapsed
    times (a resumed run restarts its clock), so time spent stopped is not counted.
    """
    g, snap, cfg, events = run.geometry, run.snapshot(), run.config(), run.events()
    filled = snap.genome_id >= 0
    offset = float(OmegaConf.select(cfg, "archive.qd_offset", default=0.0) or 0.0)
    best = run.best()
    ledger = run.store.calls.totals()
    volume = fronts.reading_of(run)
    return {
        "run": str(run.path),
        "name": run.name,
        "experiment": OmegaConf.select(cfg, "experiment.name", default=None),
        "kind": g.kind,
        "islands": g.islands,
        "cells": g.cells,
        "genome": g.genome or "vector",
        "evaluations": evaluations(run, events),
        "elites": int(filled.sum()),
        "coverage": float(filled.sum() / (g.islands * g.cells)),
        "qd_score": float(np.sum(snap.fitness[filled] - offset)),
        "best": best["fitness"] if best else None,
        "best_id": best["id"] if best else None,
        "hypervolume": volume["total"] if volume else None,
        "llm_calls": int(sum(r[2] for r in ledger)),
        "cost": float(sum(r[8] for r in ledger)),
        "wall_s": wall_time(events),
    }


def evaluations(run: RunDir, events: list[dict[str, Any]]) -> int:
    """Candidates evaluated: the store's text and vector rows (meta instructions are not
    evaluations), or the commit events' count where it is larger: a device run that keeps
    only its elites (``runner.store=elites``) evaluated many more than it stored."""
    stored = run.store.count(kind="text") + run.store.count(kind="vector")
    logged = max(
        (int(e["evaluations"]) for e in events if e.get("event") == "commit" and "evaluations" in e),
        default=0,
    )
    return max(stored, logged)


def wall_time(events: list[dict[str, Any]]) -> float | None:
    """Seconds the run ran: each session's last ``elapsed_s``, summed (None before a commit)."""
    total, last = 0.0, None
    for e in events:
        if e.get("event") != "commit" or "elapsed_s" not in e:
            continue
        now = float(e["elapsed_s"])
        if last is not None and now < last:  # a new session (resume) restarted the clock
            total += last
        last = now
    return None if last is None else total + last


def header(s: dict[str, Any]) -> str:
    """The summary as one line: run dir, archive kind, islands x cells, evaluations, coverage, best."""
    best = "-" if s["best"] is None else f"{fmt(s['best'])} (#{s['best_id']})"
    volume = "" if s.get("hypervolume") is None else f", hypervolume {fmt(s['hypervolume'])}"
    return (
        f"{s['run']}: {s['experiment'] or '?'}, {s['kind']} archive {s['islands']} x {s['cells']}, "
        f"{s['evaluations']} evaluations, coverage {s['coverage']:.2%} ({s['elites']} elites), "
        f"QD score {fmt(s['qd_score'])}{volume}, best {best}"
    )
