"""Gaussian mutation for vector genomes (MAP-Elites's classic operator).

Split in two so a caller can draw the noise of many batches at once (the device
loop draws a whole call's noise in one kernel): :func:`gaussian_noise` draws,
:func:`gaussian_apply` varies; ``gaussian`` is both in one jitted call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from operators.noise import with_noise


def gaussian_noise(key: jax.Array, batch: int, dim: int) -> jax.Array:
    """The standard normal noise of ``batch`` children of ``dim`` genes: f32[batch, dim]."""
    return jax.random.normal(key, (batch, dim), jnp.float32)


def gaussian_apply(
    parents: jax.Array,
    noise: jax.Array,
    sigma: float | jax.Array,
    lower: jax.Array | float = -jnp.inf,
    upper: jax.Array | float = jnp.inf,
) -> jax.Array:
    """Children ``parent + sigma * noise``, clipped to ``[lower, upper]``.

    Args:
        parents: f32[B, 1, n] (one parent per child); noise: f32[B, n] standard normal.
        sigma: scalar or f32[n] step size.
    Returns:
        f32[B, n].
    """
    return jnp.clip(parents[:, 0, :] + sigma * noise, lower, upper)


gaussian = with_noise(gaussian_noise, gaussian_apply)
