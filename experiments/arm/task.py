"""Planar robotic arm repertoire (Cully et al. 2015; Vassiliades & Mouret 2018).

A genome is ``dof`` joint angles in [-pi, pi]; links have equal length and the
arm has total length 1. Descriptors are the end effector's (x, y) in [-1, 1]^2;
fitness is minus the variance of the joint angles (smooth arms are preferred).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from qd.contract import ConfigError
from qd.task import Evaluation


@dataclasses.dataclass
class ArmTask:
    dof: int = 12
    kind: str = "vector"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("end effector x", "end effector y")

    def __post_init__(self) -> None:
        if self.dof < 1:
            raise ConfigError("experiment.params.dof", f"must be >= 1, got {self.dof}")

    @property
    def genome_dim(self) -> int:
        return self.dof

    @property
    def genome_bounds(self) -> tuple[float, float]:
        return (-np.pi, np.pi)

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(-np.pi, np.pi, (n, self.dof)).astype(np.float32)

    def evaluate(self, genomes: np.ndarray) -> Evaluation:
        angles = np.asarray(genomes, np.float64)
        cumulative = np.cumsum(angles, axis=1)
        link = 1.0 / self.dof
        x = link * np.cos(cumulative).sum(1)
        y = link * np.sin(cumulative).sum(1)
        fitness = -np.var(angles, axis=1)
        valid = np.all(np.isfinite(angles), axis=1)
        return Evaluation(fitness.astype(np.float32), np.stack([x, y], 1).astype(np.float32), valid)

    def evaluate_jax(self, genomes):
        """:meth:`evaluate` as a pure JAX function (f32): the device loop fuses it into its step."""
        import jax.numpy as jnp

        cumulative = jnp.cumsum(genomes, 1)
        link = 1.0 / self.dof
        position = jnp.stack([link * jnp.cos(cumulative).sum(1), link * jnp.sin(cumulative).sum(1)], 1)
        return -jnp.var(genomes, 1), position, jnp.all(jnp.isfinite(genomes), 1)


def make_task(dof: int = 12) -> ArmTask:
    return ArmTask(dof=dof)
