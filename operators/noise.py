"""A numeric operator in one call, from its two halves (``draw`` the noise, ``apply`` it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def with_noise(draw: Callable[..., Any], apply: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """``op(key, parents f32[B, k, n], *params) = apply(parents, draw(key, B, n), *params)``, jitted.

    The host loop calls operators this way; the device loop calls the halves, so
    it can draw a whole call's noise at once.
    """

    @jax.jit
    def op(key: jax.Array, parents: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
        batch, _, dim = parents.shape
        return apply(parents, draw(key, batch, dim), *args, **kwargs)

    op.__doc__ = f"{apply.__name__} with noise drawn from ``key`` by {draw.__name__}."
    return op
