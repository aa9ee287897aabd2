"""An example of your own task: many different good points on a bumpy landscape.

A genome is ``dim`` numbers in [-1, 1]. The fitness is a Rastrigin landscape
(many local optima) around a hidden optimum drawn from ``seed``, scaled to
[0, 100]; the two descriptors are the mean of the first and of the second half
of the coordinates, mapped to [0, 1], so the archive keeps the best point of each
region of the space, not just the global best.

It lives outside the qd package and needs no install: ``experiment.task`` names
this file (see docs/tasks.md for the contract and the commands).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qd.contract import ConfigError
from qd.task import Evaluation


@dataclasses.dataclass
class BumpyTask:
    dim: int = 8
    seed: int = 0
    kind: str = "vector"  # numeric: trusted, evaluated in qd's process, a whole batch at once
    descriptor_dim: int = 2
    genome_bounds: tuple[float, float] = (-1.0, 1.0)  # operators clip children to these

    def __post_init__(self) -> None:
        if self.dim < 2 or self.dim % 2:  # the two descriptors are the two halves
            raise ConfigError("experiment.params.dim", f"must be an even number >= 2, got {self.dim}")
        self.optimum = np.random.default_rng(self.seed).uniform(-0.5, 0.5, self.dim)
        self.worst = 10.0 * self.dim + self.dim * 5.12 ** 2 * 4  # above any value in the bounds

    @property
    def genome_dim(self) -> int:
        return self.dim

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, (n, self.dim)).astype(np.float32)

    def evaluate(self, genomes: np.ndarray) -> Evaluation:
        x = np.asarray(genomes, np.float64)
        z = (x - self.optimum) * 5.12  # Rastrigin's usual domain
        raw = 10.0 * self.dim + np.sum(z * z - 10.0 * np.cos(2.0 * np.pi * z), axis=1)
        fitness = 100.0 * (1.0 - raw / self.worst)
        half = self.dim // 2
        descriptor = np.stack([x[:, :half].mean(1), x[:, half:].mean(1)], axis=1) / 2.0 + 0.5
        valid = np.all(np.isfinite(x), axis=1)  # a bad genome is invalid, never an exception
        return Evaluation(fitness.astype(np.float32), descriptor.astype(np.float32), valid)


def make_task(**params) -> BumpyTask:
    """What qd calls, with ``experiment.params`` as keywords."""
    return BumpyTask(**params)
