"""Iso+LineDD variation (Vassiliades & Mouret, 2018) for vector genomes.

A child moves isotropically around one elite and along the line towards a
second elite: ``x_i + iso_sigma * N(0, I) + line_sigma * N(0, 1) * (x_j - x_i)``.
Elites are correlated in good regions, so the line term follows the "elite
hypervolume" and beats plain Gaussian mutation in high dimensions.

As with ``operators.gaussian``, drawing (:func:`isoline_noise`) and varying
(:func:`isoline_apply`) are apart so the device loop can draw a call's noise at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from operators.noise import with_noise


def isoline_noise(key: jax.Array, batch: int, dim: int) -> tuple[jax.Array, jax.Array]:
    """(iso f32[batch, dim], line f32[batch, 1]) standard normal noise."""
    iso_key, line_key = jax.random.split(key)
    return (
        jax.random.normal(iso_key, (batch, dim), jnp.float32),
        jax.random.normal(line_key, (batch, 1), jnp.float32),
    )


def isoline_apply(
    parents: jax.Array,
    noise: tuple[jax.Array, jax.Array],
    iso_sigma: float | jax.Array,
    line_sigma: float | jax.Array,
    lower: jax.Array | float = -jnp.inf,
    upper: jax.Array | float = jnp.inf,
) -> jax.Array:
    """Args:
        parents: f32[B, 2, n]: ``x_i = parents[:, 0]``, ``x_j = parents[:, 1]``.
        noise: :func:`isoline_noise`'s pair.
    Returns:
        f32[B, n] children clipped to ``[lower, upper]``.
    """
    x_i, x_j = parents[:, 0, :], parents[:, 1, :]
    iso, line = noise
    return jnp.clip(x_i + iso_sigma * iso + line_sigma * line * (x_j - x_i), lower, upper)


isoline = with_noise(isoline_noise, isoline_apply)
