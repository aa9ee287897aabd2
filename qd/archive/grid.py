"""Uniform grid tessellation of descriptor space (pyribs's GridArchive geometry)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

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

    Bad arguments raise ConfigError naming the argument (``bins``, ``upper``); the
    config layer puts it under the config section they came from.
    """

    bins: tuple[int, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "bins", tuple(int(b) for b in self.bins))
        object.__setattr__(self, "lower", tuple(float(x) for x in self.lower))
        object.__setattr__(self, "upper", tuple(float(x) for x in self.upper))
        if not (len(self.bins) == len(self.lower) == len(self.upper)):
            raise ConfigError(
                "bins", f"bins, lower and upper must have one entry per descriptor dimension; "
                f"got {len(self.bins)}, {len(self.lower)}, {len(self.upper)}"
            )
        if any(b < 1 for b in self.bins):
            raise ConfigError("bins", f"every entry must be >= 1, got {list(self.bins)}")
        if any(u <= l for l, u in zip(self.lower, self.upper)):
            raise ConfigError(
                "upper", f"must exceed lower in every dimension, got lower={list(self.lower)} upper={list(self.upper)}"
            )

    @classmethod
    def create(
        cls, bins: Sequence[int], lower: Sequence[float], upper: Sequence[float]
    ) -> "GridSpec":
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
        bins = jnp.asarray(self.bins, jnp.float32)
        lower = jnp.asarray(self.lower, jnp.float32)
        width = jnp.asarray(self.upper, jnp.float32) - lower
        scaled = (bins * (descriptor.astype(jnp.float32) - lower) + self.epsilon) / width
        # Clip in float first so huge or infinite values cannot overflow the int cast.
        scaled = jnp.clip(scaled, 0.0, bins - 1.0)
        coords = scaled.astype(jnp.int32)
        strides = [math.prod(self.bins[d + 1 :]) for d in range(len(self.bins))]
        # An elementwise sum fuses with the arithmetic above; an int32 dot would not.
        return jnp.sum(coords * jnp.asarray(strides, jnp.int32), axis=1)
