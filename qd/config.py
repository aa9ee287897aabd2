"""Structured configs: every field typed and validated before a run starts.

Hydra composes ``conf/``; these dataclasses are the schema it is merged into,
so an unknown key or a value of the wrong type fails at once, naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclasses.dataclass
class ExperimentConf:
    name: str = MISSING  # names the run directory outputs/<name>/
    task: str = MISSING  # folder in experiments/ with a task.py
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ArchiveConf:
    kind: str = "grid"  # grid | cvt
    bins: list[int] = dataclasses.field(default_factory=lambda: [100, 100])  # grid
    lower: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])
    upper: list[float] = dataclasses.field(default_factory=lambda: [1.0, 1.0])
    cells: int = 10_000  # cvt: number of centroids
    cvt_samples: int = 100_000  # cvt: k-means samples
    cvt_seed: int = 0
    learning_rate: float = 1.0  # CMA-MAE threshold learning rate
    threshold_min: float = -math.inf  # finite: soft thresholds (CMA-MAE)
    qd_offset: float = 0.0  # subtracted from each elite in qd_score


@dataclasses.dataclass
class IslandsConf:
    count: int = 1
    topology: str = "ring"  # ring | random | complete
    migrate_every: int = 0  # insert batches between migrations; 0 = off
    migrants: int = 1  # top-k elites sent per island


@dataclasses.dataclass
class OperatorConf:
    name: str = MISSING  # gaussian | isoline
    weight: float = 1.0
    sigma: Optional[float] = None  # gaussian step size
    iso_sigma: Optional[float] = None  # isoline isotropic step
    line_sigma: Optional[float] = None  # isoline step along the line


@dataclasses.dataclass
class OperatorsConf:
    mix: list[OperatorConf] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RunnerConf:
    name: str = "local"
    batch_size: int = 64  # children per proposal
    in_flight: int = 2  # proposals running at once
    evaluator: str = "inprocess"  # inprocess | pool
    workers: int = 2  # pool size
    max_evaluations: Optional[int] = 10_000
    max_seconds: Optional[float] = None
    checkpoint_every: int = 50  # insert batches between checkpoints
    progress: bool = True


@dataclasses.dataclass
class Config:
    experiment: ExperimentConf = dataclasses.field(default_factory=ExperimentConf)
    archive: ArchiveConf = dataclasses.field(default_factory=ArchiveConf)
    islands: IslandsConf = dataclasses.field(default_factory=IslandsConf)
    operators: OperatorsConf = dataclasses.field(default_factory=OperatorsConf)
    runner: RunnerConf = dataclasses.field(default_factory=RunnerConf)
    seed: int = 0
    resume: Optional[str] = None  # a run directory to continue


def register() -> None:
    ConfigStore.instance().store(name="qd_schema", node=Config)
