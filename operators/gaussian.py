"""Gaussian mutation for vector genomes (MAP-Elites's classic operator)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def gaussian(
    key: jax.Array,
    parents: jax.Array,
    sigma: float | jax.Array,
    lower: jax.Array | float = -jnp.inf,
    upper: jax.Array | float = jnp.inf,
) -> jax.Array:
    """Children ``parent + sigma * N(0, I)``, clipped to ``[lower, upper]``.

    Args:
        parents: f32[B, 1, n] (one parent per child).
        sigma: scalar or f32[n] step size.
    Returns:
        f32[B, n].
    """
    x = parents[:, 0, :]
    noise = jax.random.normal(key, x.shape, x.dtype)
    return jnp.clip(x + sigma * noise, lower, upper)
