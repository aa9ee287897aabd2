"""Circle packing: 26 circles in the unit square, maximize the sum of radii.

The AlphaEvolve problem (best known ~2.6359). The validator is strict and runs
on the host: exactly N triples of finite numbers, positive radii, every circle
inside the square and no two overlapping, with tolerance 1e-9. An invalid
packing is an invalid candidate with the reason, never a number.

Descriptors come from the evaluator's metrics for now: the spread of the radii
(std) and the fraction of circles touching the square's sides.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from qd.task import Scored, Stage

_HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-9

SEED = '''import math

# EVOLVE-BLOCK-START
def pack():
    """26 equal circles on a 6 x 5 grid (the last row short)."""
    r = 1 / 12
    circles = []
    for i in range(26):
        row, col = divmod(i, 6)
        circles.append((r + 2 * r * col, 0.1 + 0.2 * row, r))
    return circles
# EVOLVE-BLOCK-END
'''


def validate(circles: Any, n: int) -> tuple[np.ndarray | None, str | None]:
    """(array f64[n, 3], None) for a valid packing, else (None, the first violation)."""
    if not isinstance(circles, list) or len(circles) != n:
        got = len(circles) if isinstance(circles, list) else type(circles).__name__
        return None, f"expected {n} circles, got {got}"
    for i, c in enumerate(circles):
        if (
            not isinstance(c, list)
            or len(c) != 3
            or any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in c)
        ):
            return None, f"circle {i} is not three finite numbers (x, y, r)"
    a = np.asarray(circles, np.float64)
    x, y, r = a[:, 0], a[:, 1], a[:, 2]
    if np.any(r <= 0):
        return None, f"circle {int(np.argmax(r <= 0))} has radius <= 0"
    outside = (x - r < -TOLERANCE) | (x + r > 1 + TOLERANCE) | (y - r < -TOLERANCE) | (y + r > 1 + TOLERANCE)
    if np.any(outside):
        return None, f"circle {int(np.argmax(outside))} is not inside the unit square"
    dist = np.hypot(x[:, None] - x[None, :], y[:, None] - y[None, :])
    overlap = dist < r[:, None] + r[None, :] - TOLERANCE
    np.fill_diagonal(overlap, False)
    if np.any(overlap):
        i, j = np.argwhere(overlap)[0]
        return None, f"circles {i} and {j} overlap"
    return a, None


@dataclasses.dataclass
class CirclePackingTask:
    circles: int = 26
    kind: str = "text"
    language: str = "python"
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("radius std", "boundary fraction")

    def __post_init__(self) -> None:
        self.description = (
            f"Place {self.circles} non-overlapping circles inside the unit square [0,1]x[0,1] "
            "to maximize the sum of their radii. Write pack() returning a list of "
            f"{self.circles} (x, y, r) tuples. Circles must not overlap or leave the square."
        )
        self.sandbox_entry = f"{_HERE / 'entry.py'}:run"
        self.stages = [Stage(name="pack")]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        return [SEED.replace("26", str(self.circles))] * n

    def score(self, text: str, outputs: list[Any]) -> Scored:
        a, problem = validate(outputs[-1], self.circles)
        if problem:
            return Scored(math.nan, None, False, error=f"invalid packing: {problem}")
        x, y, r = a.T
        touching = (np.minimum.reduce([x - r, 1 - x - r, y - r, 1 - y - r]) <= 1e-6).mean()
        metrics = {
            "sum_radii": float(r.sum()),
            "min_r": float(r.min()),
            "max_r": float(r.max()),
            "radius_std": float(r.std()),
            "boundary_fraction": float(touching),
        }
        return Scored(float(r.sum()), [metrics["radius_std"], metrics["boundary_fraction"]], True, metrics)


def make_task(**params: Any) -> CirclePackingTask:
    return CirclePackingTask(**params)
