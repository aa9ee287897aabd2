"""Cyclic objectives (CycleQD): the task's metrics take turns being the quality.

A task reports several metrics per candidate (``metrics`` dicts). With N listed
metrics there are N phases; in phase p, metric p is the fitness and the other
N-1 metrics, in their listed order, are the descriptor axes of a grid. The loop
moves to the next phase every ``every`` insertions and rebuilds the archive from
the store in one batched call: each stored candidate is re-scored from its
stored metrics, so nothing is evaluated twice and nothing is lost.

The store keeps the fitness and descriptor a candidate had when it was
committed; its metrics are what every later phase re-reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from qd.archive.grid import GridSpec
from qd.contract import ConfigError


@dataclasses.dataclass(frozen=True)
class CyclicObjective:
    """Metric names with the grid range and bins each has when it is an axis.

    Bad settings raise ConfigError naming the field (``bins``); the config plan
    puts it under ``cycle``.

    Attributes:
        metrics: the N >= 2 metric names the task reports.
        lower, upper: (N,) the range of each metric as a descriptor axis.
        bins: (N,) the grid bins of each metric as an axis.
        every: insertions (candidates offered) per phase.
    """

    metrics: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    bins: tuple[int, ...]
    every: int

    def __post_init__(self) -> None:
        n = len(self.metrics)
        if n < 2:
            raise ConfigError("metrics", f"needs at least 2 metrics, got {list(self.metrics)}")
        if len(set(self.metrics)) != n:
            raise ConfigError("metrics", f"names repeat in {list(self.metrics)}", "list each metric once")
        for name in ("lower", "upper", "bins"):
            if len(getattr(self, name)) != n:
                raise ConfigError(name, f"needs one entry per metric ({n}), got {len(getattr(self, name))}")
        if any(high <= low for low, high in zip(self.lower, self.upper)):
            raise ConfigError(
                "upper", f"must exceed lower for every metric, got {list(self.lower)} / {list(self.upper)}"
            )
        if any(b < 1 for b in self.bins):
            raise ConfigError("bins", f"every entry must be >= 1, got {list(self.bins)}")
        if self.every < 1:
            raise ConfigError("every", f"must be >= 1 insertions, got {self.every}")

    @classmethod
    def create(
        cls,
        metrics: Sequence[str],
        lower: Sequence[float],
        upper: Sequence[float],
        bins: Sequence[int],
        every: int,
    ) -> "CyclicObjective":
        return cls(
            tuple(metrics),
            tuple(map(float, lower)),
            tuple(map(float, upper)),
            tuple(map(int, bins)),
            int(every),
        )

    @property
    def descriptor_dim(self) -> int:
        return len(self.metrics) - 1

    def phase(self, insertions: int) -> int:
        """The phase after ``insertions`` candidates were offered to the archive."""
        return (insertions // self.every) % len(self.metrics)

    def quality(self, phase: int) -> str:
        return self.metrics[phase]

    def axes(self, phase: int) -> list[int]:
        """Indices (into ``metrics``) of the descriptor axes in ``phase``."""
        return [i for i in range(len(self.metrics)) if i != phase]

    def spec(self, phase: int) -> GridSpec:
        axes = self.axes(phase)
        return GridSpec(
            tuple(self.bins[i] for i in axes),
            tuple(self.lower[i] for i in axes),
            tuple(self.upper[i] for i in axes),
        )

    def score(
        self, phase: int, metrics: Sequence[dict | None], valid: Sequence[bool]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
        """Fitness and descriptors of candidates in ``phase``, from their metrics.

        Returns:
            fitness f32[B], descriptor f32[B, N-1], valid bool[B], and per candidate
            the reason it became invalid here (a listed metric missing or not a
            finite number), else None. Already invalid candidates stay invalid.
        """
        count = len(metrics)
        table = np.full((count, len(self.metrics)), np.nan, np.float64)
        errors: list[str | None] = [None] * count
        ok = np.asarray(valid, bool).copy()
        for j, m in enumerate(metrics):
            if not ok[j]:
                continue
            for i, name in enumerate(self.metrics):
                value = (m or {}).get(name)
                if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(float(value)):
                    table[j, i] = float(value)
                else:
                    errors[j] = f"cycle: metric {name!r} is {value!r}, not a finite number"
                    ok[j] = False
                    break
        fitness = np.where(ok, table[:, phase], np.nan).astype(np.float32)
        descriptor = table[:, self.axes(phase)].astype(np.float32)
        return fitness, descriptor, ok, errors
