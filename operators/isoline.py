"""Iso+LineDD variation (Vassiliades & Mouret, 2018) for vector genomes.

A child moves isotropically around one elite and along the line towards a
second elite: ``x_i + iso_sigma * N(0, I) + line_sigma * N(0, 1) * (x_j - x_i)``.
Elites are correlated in good regions, so the line term follows the "elite
hypervolume" and beats plain Gaussian mutation in high dimensions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def isoline(
    key: jax.Array,
    parents: jax.Array,
    iso_sigma: float | jax.Array,
    line_sigma: float | jax.Array,
    lower: jax.Array | float = -jnp.inf,
    upper: jax.Array | float = jnp.inf,
) -> jax.Array:
    """Args:
        parents: f32[B, 2, n]: ``x_i = parents[:, 0]``, ``x_j = parents[:, 1]``.
    Returns:
        f32[B, n] children clipped to ``[lower, upper]``.
    """
    x_i, x_j = parents[:, 0, :], parents[:, 1, :]
    iso_key, line_key = jax.random.split(key)
    iso = iso_sigma * jax.random.normal(iso_key, x_i.shape, x_i.dtype)
    line = line_sigma * jax.random.normal(line_key, (x_i.shape[0], 1), x_i.dtype)
    return jnp.clip(x_i + iso + line * (x_j - x_i), lower, upper)
