"""Two Rastrigin functions with shifted optima: QDax's MOME example as a qd task.

QDax's ``examples/mome.ipynb`` (Multi-Objective MAP-Elites, Pierrot et al. 2022):
100 variables in [-2, 4], one Rastrigin centred on 0 and one on 2.2, both
minimised, so no genome is best on both and every cell holds a trade-off front;
the descriptor is the first two variables. The objectives are reported in their
own units (a Rastrigin value, >= 0); the archive sees them negated, as QDax's
scorer returns them, so QDax's reference point (-150, -150) is (150, 150) here.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from qd.task import Evaluation

LOWER, UPPER = -2.0, 4.0


def _rastrigin(xp, x, centre: float):
    z = x - centre
    return 10 * x.shape[1] + xp.sum(z * z - 10 * xp.cos(2 * np.pi * z), axis=1)


@dataclasses.dataclass
class TwoRastrigins:
    """Minimise ``rastrigin(x)`` and ``rastrigin(x - lag)``; descriptor: ``x[:2]``.

    The scalar fitness (what a single-objective archive keeps) is minus their mean."""

    dim: int = 100
    lag: float = 2.2
    kind: str = "vector"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("x0", "x1")
    objectives: ClassVar[tuple[tuple[str, str], ...]] = (("rastrigin", "min"), ("rastrigin_lag", "min"))
    genome_bounds: ClassVar[tuple[float, float]] = (LOWER, UPPER)

    @property
    def genome_dim(self) -> int:
        return self.dim

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Uniform in the bounds, as the notebook's first batch."""
        return rng.uniform(LOWER, UPPER, (n, self.dim)).astype(np.float32)

    def evaluate(self, genomes: np.ndarray) -> Evaluation:
        x = np.asarray(genomes, np.float64)
        first, second = _rastrigin(np, x, 0.0), _rastrigin(np, x, self.lag)
        metrics = [{"rastrigin": float(a), "rastrigin_lag": float(b)} for a, b in zip(first, second)]
        return Evaluation(
            (-(first + second) / 2).astype(np.float32),
            np.clip(x[:, :2], LOWER, UPPER).astype(np.float32),
            np.all(np.isfinite(x), axis=1),
            metrics,
        )

    def evaluate_jax(self, genomes):
        """The scalar fitness, descriptor and validity in JAX (a single-objective device run)."""
        values, descriptor, valid = self.objectives_jax(genomes)
        return values.mean(axis=1), descriptor, valid

    def objectives_jax(self, genomes):
        """f32[B, 2] the objectives maximised (negated), the descriptor and validity, in JAX:
        what a Pareto archive's device run evaluates."""
        import jax.numpy as jnp

        values = -jnp.stack([_rastrigin(jnp, genomes, 0.0), _rastrigin(jnp, genomes, self.lag)], axis=1)
        descriptor = jnp.clip(genomes[:, :2], LOWER, UPPER)
        return values, descriptor, jnp.all(jnp.isfinite(genomes), axis=1)


def make_task(dim: int = 100, lag: float = 2.2) -> TwoRastrigins:
    return TwoRastrigins(dim=dim, lag=lag)
