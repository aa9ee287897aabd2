"""Uniform grid tessellation of descriptor space (pyribs's GridArchive geometry)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive.state import check_thresholds
from qd.contract import ConfigError


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class GridSpec:
    """Cells are ``bins[d]`` uniform intervals per dimension between ``lower`` and ``upper``.

    The spec is static (hashable): jitted functions specialize on it. Descriptors
    outside the bounds are clipped into the edge cells, as in pyribs.

    Attributes:
        bins: (D,) number of cells per dimension.
        lower: (D,) lower bound per dimension.
        upper: (D,) upper bound per dimension.
        epsilon: added before flooring, as pyribs does, so a descriptor exactly on a
            boundary lands in the upper cell despite float rounding.
        learning_rate, threshold_min: the CMA-MAE settings every spec carries
            (:func:`qd.archive.state.check_thresholds`); defaults: plain MAP-Elites.

    Bad arguments raise ConfigError naming the argument (``bins``, ``upper``); the
    config layer puts it under the config section they came from.
    """

    kind: ClassVar[str] = "grid"  # the run directory's name for it (``archive.json``)

    bins: tuple[int, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    epsilon: float = 1e-6
    learning_rate: float = 1.0
    threshold_min: float = -math.inf

    def __post_init__(self) -> None:
        thresholds = check_thresholds(self.learning_rate, self.threshold_min)
        object.__setattr__(self, "learning_rate", thresholds[0])
        object.__setattr__(self, "threshold_min", thresholds[1])
        object.__setattr__(self, "bins", tuple(int(b) for b in self.bins))
        object.__setattr__(self, "lower", tuple(float(x) for x in self.lower))
        object.__setattr__(self, "upper", tuple(float(x) for x in self.upper))
        if not (len(self.bins) == len(self.lower) == len(self.upper)):
            raise ConfigError(
                "bins",
                f"bins, lower and upper must have one entry per descriptor dimension; "
                f"got {len(self.bins)}, {len(self.lower)}, {len(self.upper)}",
            )
        if any(b < 1 for b in self.bins):
            raise ConfigError("bins", f"every entry must be >= 1, got {list(self.bins)}")
        if any(hi <= lo for lo, hi in zip(self.lower, self.upper)):
            raise ConfigError(
                "upper",
                f"must exceed lower in every dimension, "
                f"got lower={list(self.lower)} upper={list(self.upper)}",
            )

    @classmethod
    def create(cls, bins: Sequence[int], lower: Sequence[float], upper: Sequence[float]) -> "GridSpec":
        return cls(tuple(bins), tuple(lower), tuple(upper))

    @property
    def num_cells(self) -> int:
        return math.prod(self.bins)

    @property
    def descriptor_dim(self) -> int:
        return len(self.bins)

    def index(self, descriptor: jax.Array) -> jax.Array:
        """Flat (C-order) cell index of each descriptor.

        Args:
            descriptor: f32[B, D].
        Returns:
            i32[B] in ``[0, num_cells)``.
        """
        descriptor = descriptor.astype(jnp.float32)
        strides = [math.prod(self.bins[d + 1 :]) for d in range(len(self.bins))]
        # One column at a time: plain elementwise arithmetic that XLA fuses into
        # each consumer instead of materializing the index as a kernel of its own
        # (a reduction over the descriptor axis, or an int32 dot, would not fuse).
        index = 0
        for d, (bins, lower, upper) in enumerate(zip(self.bins, self.lower, self.upper)):
            # float32 bounds and width, rounded as pyribs's float32 archive rounds them.
            lower, width = np.float32(lower), np.float32(upper) - np.float32(lower)
            scaled = (bins * (descriptor[:, d] - lower) + self.epsilon) / width
            # Clip in float first so huge or infinite values cannot overflow the int cast.
            coord = jnp.clip(scaled, 0.0, bins - 1.0).astype(jnp.int32)
            index = index + coord * strides[d]
        return index
