"""Sphere / Rastrigin on a shifted optimum with linear-projection descriptors.

The standard benchmark of pyribs's tutorials (and CMA-ME / CMA-MAE papers): the
objective is normalized to [0, 100] and the two descriptors are sums of the
first and second half of the (clipped) coordinates.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from qd.contract import ConfigError
from qd.task import Evaluation

BOUND = 5.12


@dataclasses.dataclass
class SphereTask:
    dim: int = 100
    function: str = "sphere"
    kind: str = "vector"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("first-half sum", "second-half sum")

    def __post_init__(self) -> None:
        if self.function not in ("sphere", "rastrigin"):
            raise ConfigError(
                "experiment.params.function",
                f"unknown function {self.function!r}",
                "use sphere or rastrigin",
            )
        if self.dim < 2 or self.dim % 2:
            raise ConfigError("experiment.params.dim", f"must be an even number >= 2, got {self.dim}")
        self.shift = BOUND * 0.4
        self.worst = self._raw(np.full((1, self.dim), -BOUND))[0]

    @property
    def genome_dim(self) -> int:
        return self.dim

    @property
    def descriptor_bound(self) -> float:
        return self.dim * BOUND / 2

    def _raw(self, x: np.ndarray) -> np.ndarray:
        z = x - self.shift
        if self.function == "sphere":
            return np.sum(z * z, axis=1)
        return 10 * self.dim + np.sum(z * z - 10 * np.cos(2 * np.pi * z), axis=1)

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros((n, self.dim), np.float32)

    def evaluate(self, genomes: np.ndarray) -> Evaluation:
        x = np.asarray(genomes, np.float64)
        fitness = (self.worst - self._raw(x)) / self.worst * 100.0
        with np.errstate(divide="ignore"):
            clipped = np.where(np.abs(x) <= BOUND, x, BOUND / x)
        half = self.dim // 2
        descriptor = np.stack([clipped[:, :half].sum(1), clipped[:, half:].sum(1)], axis=1)
        valid = np.all(np.isfinite(x), axis=1)
        return Evaluation(fitness.astype(np.float32), descriptor.astype(np.float32), valid)

    def evaluate_jax(self, genomes):
        """:meth:`evaluate` as a pure JAX function (f32): the device loop fuses it into its step."""
        import jax.numpy as jnp

        x = genomes
        z = x - self.shift
        raw = (
            jnp.sum(z * z, 1)
            if self.function == "sphere"
            else (10 * self.dim + jnp.sum(z * z - 10 * jnp.cos(2 * jnp.pi * z), 1))
        )
        worst = float(self.worst)
        fitness = (worst - raw) / worst * 100.0
        clipped = jnp.where(jnp.abs(x) <= BOUND, x, BOUND / x)
        half = self.dim // 2
        descriptor = jnp.stack([clipped[:, :half].sum(1), clipped[:, half:].sum(1)], 1)
        return fitness, descriptor, jnp.all(jnp.isfinite(x), 1)


def make_task(dim: int = 100, function: str = "sphere") -> SphereTask:
    return SphereTask(dim=dim, function=function)
