"""qd from Python: compose a config with the CLI's names, build a run, run it, read what it found.

    import qd

    cfg = qd.compose(["experiment=sphere", "runner.max_evaluations=2048"])
    engine = qd.build(cfg, "runs/demo", on_commit=lambda event: print(event["global"]["qd_score"]))
    try:
        summary = engine.run()
    finally:
        engine.close()
    best = qd.elites("runs/demo")[0]

``compose`` takes exactly what ``qd-run`` takes on its command line (hydra
overrides), ``build`` is what ``qd-run`` builds (validated once into a plan, so
a bad field fails here with the CLI's one-line error), and ``on_commit`` sees
each ``commit`` event of ``events.jsonl`` (``qd.events``) as it is written:
benchmarks and notebooks follow a run through it instead of patching the engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig

from qd.contract import Candidate
from qd.loop import Engine
from qd.plan import compose, plan

__all__ = ["Elite", "build", "compose", "elites", "plan"]


def build(cfg: DictConfig, run_dir: str | Path, *, on_commit: Callable[[dict], Any] | None = None) -> Engine:
    """The run ``qd-run`` would make of ``cfg`` in ``run_dir`` (a resume if it holds one).

    Starts what the run needs (for text tasks the LLM server and the sandbox);
    ``Engine.close`` stops them. The config is saved as ``config.yaml`` beside the
    store, as ``qd-run`` does, so ``qd-run resume=RUN_DIR`` continues it.
    """
    from qd.run import build_engine

    return build_engine(cfg, Path(run_dir), on_commit=on_commit)


@dataclasses.dataclass(frozen=True)
class Elite:
    """One archive cell's elite: where it is, and the stored candidate (genome, lineage, metrics)."""

    island: int
    cell: int
    fitness: float
    descriptor: np.ndarray
    candidate: Candidate


def elites(run_dir: str | Path) -> list[Elite]:
    """The run's elites, best first: the archive a resume would rebuild (its last checkpoint
    and the store rows after it), so a run still going reads as well as a finished one."""
    from qd.rundir import RunDir

    with RunDir(run_dir) as run:
        snap = run.snapshot()
        return [Elite(i, k, float(snap.fitness[i, k]), snap.descriptor[i, k], c) for i, k, c in run.placed()]
