"""Three competing skills on one numeric genome: the CycleQD demo (no LLM).

A genome is ``dim`` numbers in [-1, 1]. Skill k scores how close the genome is
to its own hidden target t_k: ``exp(-|x - t_k|^2 / dim)`` in (0, 1]. The targets
pull apart, so no genome masters all three; CycleQD (``cycle=skills``) makes each
skill the quality in turn with the other two as descriptor axes. Without a cycle
the fitness is the mean skill and the descriptors are skills a and b.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from qd.contract import ConfigError
from qd.task import Evaluation

SKILLS = ("skill_a", "skill_b", "skill_c")


@dataclasses.dataclass
class SkillsTask:
    dim: int = 8
    seed: int = 0
    kind: str = "vector"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("skill a", "skill b")

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ConfigError("experiment.params.dim", f"must be >= 1, got {self.dim}")
        self.targets = np.random.default_rng(self.seed).uniform(-0.8, 0.8, (len(SKILLS), self.dim))

    @property
    def genome_dim(self) -> int:
        return self.dim

    @property
    def genome_bounds(self) -> tuple[float, float]:
        return (-1.0, 1.0)

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, (n, self.dim)).astype(np.float32)

    def evaluate(self, genomes: np.ndarray) -> Evaluation:
        x = np.clip(np.asarray(genomes, np.float64), -1.0, 1.0)
        gap = ((x[:, None, :] - self.targets[None]) ** 2).sum(-1) / self.dim  # [B, 3]
        skill = np.exp(-gap)
        valid = np.all(np.isfinite(np.asarray(genomes, np.float64)), axis=1)
        metrics = [{name: float(s) for name, s in zip(SKILLS, row)} for row in skill]
        return Evaluation(skill.mean(1).astype(np.float32), skill[:, :2].astype(np.float32), valid, metrics)


def make_task(dim: int = 8, seed: int = 0) -> SkillsTask:
    return SkillsTask(dim=dim, seed=seed)
