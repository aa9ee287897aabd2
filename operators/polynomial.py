"""Polynomial mutation and QDax's "polynomial" crossover for bounded vector genomes.

These are the variation of QDax's MOME example (``examples/mome.ipynb``), with the
semantics of QDax 0.5.0's ``polynomial_mutation`` and ``polynomial_crossover``, so qd
and QDax can be compared with the same search moves:

- ``polynomial_mutation`` (Deb's bounded polynomial mutation): a fixed share of each
  child's genes, ``int(proportion * n)`` of them picked without replacement, each moves by
  ``delta * (upper - lower)`` where ``delta`` follows a polynomial distribution of index
  ``eta`` (a larger ``eta`` keeps children nearer their parent), then is clipped to the bounds.
- ``polynomial_crossover``: despite QDax's name, a gene exchange (no blending, unlike
  SBX): ``int(proportion * n)`` gene indices are drawn with replacement and the child is
  the first parent with those genes taken from the second.

As with ``operators.gaussian``, drawing the noise (uniform numbers only) and applying
it are apart, so the device loop can draw a whole call's noise at once. The share of
genes is a parameter of ``apply`` (a traced number, not a shape): each child ranks its
genes by a uniform draw and changes the first ``int(proportion * n)`` in that order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from operators.noise import with_noise


def polynomial_noise(key: jax.Array, batch: int, dim: int) -> tuple[jax.Array, jax.Array]:
    """(order f32[batch, dim], shape f32[batch, dim]) uniform in [0, 1): which genes move
    (the smallest ``order`` first) and each moved gene's draw of the polynomial distribution."""
    order_key, shape_key = jax.random.split(key)
    return (
        jax.random.uniform(order_key, (batch, dim), jnp.float32),
        jax.random.uniform(shape_key, (batch, dim), jnp.float32),
    )


def _count(proportion: float | jax.Array, dim: int) -> jax.Array:
    """``int(proportion * dim)``, QDax's number of genes changed per child."""
    return jnp.floor(jnp.asarray(proportion, jnp.float32) * dim).astype(jnp.int32)


def polynomial_delta(x: jax.Array, u: jax.Array, eta: float | jax.Array, lower, upper) -> jax.Array:
    """The polynomial step of genes ``x`` in ``[lower, upper]`` for uniform draws ``u``, as a
    fraction of ``upper - lower`` (QDax's form; the caller clips the child to the bounds).

    Below ``u = 0.5`` the step is downwards, above it upwards, and it is 0 at ``u = 0.5``;
    a larger ``eta`` puts more of its mass near 0. QDax raises each gene's relative distance
    to its bound to the power ``eta + 1`` where Deb's textbook form raises one minus it, so
    as ``u`` nears 0 or 1 a step can pass the bound (hence the clip).
    """
    span = upper - lower
    power = 1.0 + eta
    to_lower = (x - lower) / span
    to_upper = (upper - x) / span
    down = (2.0 * u + (1.0 - 2.0 * u) * to_lower**power) ** (1.0 / power) - 1.0
    up = 1.0 - (2.0 * (1.0 - u) + 2.0 * (u - 0.5) * to_upper**power) ** (1.0 / power)
    return jnp.where(u < 0.5, down, up)


def polynomial_mutation_apply(
    parents: jax.Array,
    noise: tuple[jax.Array, jax.Array],
    eta: float | jax.Array,
    proportion: float | jax.Array,
    lower: jax.Array | float,
    upper: jax.Array | float,
) -> jax.Array:
    """Args:
        parents: f32[B, 1, n] (one parent per child); noise: :func:`polynomial_noise`'s pair.
        eta: the distribution index (>= 0); proportion: the share of genes moved, in [0, 1].
        lower, upper: finite bounds (scalars or f32[n]).
    Returns:
        f32[B, n] children within ``[lower, upper]``.
    """
    x = parents[:, 0, :]
    order, u = noise
    rank = jnp.argsort(jnp.argsort(order, axis=1), axis=1)  # a uniform permutation of the genes
    moved = rank < _count(proportion, x.shape[1])
    step = polynomial_delta(x, u, eta, lower, upper) * (upper - lower)
    return jnp.clip(jnp.where(moved, x + step, x), lower, upper)


def polynomial_crossover_apply(
    parents: jax.Array,
    noise: tuple[jax.Array, jax.Array],
    proportion: float | jax.Array,
    lower: jax.Array | float = -jnp.inf,
    upper: jax.Array | float = jnp.inf,
) -> jax.Array:
    """Args:
        parents: f32[B, 2, n]: the child is ``parents[:, 0]`` with some genes of ``parents[:, 1]``.
        noise: :func:`polynomial_noise`'s pair; its first half draws the gene indices
            (``floor(order * n)``, with replacement), the first ``int(proportion * n)`` of them.
        proportion: in [0, 1].
    Returns:
        f32[B, n] children clipped to ``[lower, upper]`` (they are if their parents are).
    """
    first, second = parents[:, 0, :], parents[:, 1, :]
    batch, dim = first.shape
    index = jnp.minimum((noise[0] * dim).astype(jnp.int32), dim - 1)
    drawn = (jnp.arange(dim) < _count(proportion, dim))[None, :]
    taken = jnp.zeros((batch, dim), bool).at[jnp.arange(batch)[:, None], index].max(drawn)
    return jnp.clip(jnp.where(taken, second, first), lower, upper)


polynomial_mutation = with_noise(polynomial_noise, polynomial_mutation_apply)
polynomial_crossover = with_noise(polynomial_noise, polynomial_crossover_apply)
