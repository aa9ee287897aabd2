"""The operator interface the loop drives, and its numeric (vector genome) form.

An operator is an async callable: ``await op(key, parents, context)`` returns the
children. LLM operators (text) await a model; numeric ones are jitted functions
that return at once. ``num_parents`` says how many elites each child needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from operators.gaussian import gaussian, gaussian_apply, gaussian_noise
from operators.isoline import isoline, isoline_apply, isoline_noise
from operators.polynomial import (
    polynomial_crossover,
    polynomial_crossover_apply,
    polynomial_mutation,
    polynomial_mutation_apply,
    polynomial_noise,
)
from qd.contract import ConfigError, Operator


@dataclasses.dataclass(frozen=True)
class NumericOperator(Operator):
    """A jitted vector variation ``fn(key, parents f32[B, k, n], **params) -> f32[B, n]``,
    and the same as its two halves: ``draw(key, B, n)`` (the noise) and ``apply(parents,
    noise, **params)``, for callers that draw many batches' noise at once (the device loop)."""

    name: str
    num_parents: int
    fn: Callable[..., jax.Array]
    params: dict[str, Any]
    draw: Callable[..., Any]
    apply: Callable[..., jax.Array]

    async def __call__(self, key: jax.Array, parents: np.ndarray, context: Any = None) -> np.ndarray:
        """parents: f32[B, num_parents, n] -> children f32[B, n]."""
        return np.asarray(self.fn(key, parents, **self.params))


_NUMERIC = {
    "gaussian": ((gaussian, gaussian_noise, gaussian_apply), 1, ("sigma",)),
    "isoline": ((isoline, isoline_noise, isoline_apply), 2, ("iso_sigma", "line_sigma")),
    "polynomial_mutation": (
        (polynomial_mutation, polynomial_noise, polynomial_mutation_apply),
        1,
        ("eta", "proportion"),
    ),
    "polynomial_crossover": (
        (polynomial_crossover, polynomial_noise, polynomial_crossover_apply),
        2,
        ("proportion",),
    ),
}
# Operators whose steps are fractions of the genome's range: they need finite bounds.
_BOUNDED = ("polynomial_mutation",)


def check_numeric_operator(name: str, **params: float | None) -> dict[str, float]:
    """The params ``name`` uses, checked (a pure validator: builds nothing).

    Raises ConfigError naming the field relative to the operator entry
    (``name``, ``sigma``, ...); a builder puts it under ``operators.mix[i]``.
    """
    if name not in _NUMERIC:
        raise ConfigError("name", f"unknown operator {name!r}", f"use one of {sorted(_NUMERIC)}")
    _, _, required = _NUMERIC[name]
    missing = [p for p in required if params.get(p) is None]
    if missing:
        raise ConfigError(missing[0], f"required by the {name} operator")
    return {p: float(params[p]) for p in required}


def make_numeric_operator(
    name: str, lower: Any = -np.inf, upper: Any = np.inf, **params: float
) -> NumericOperator:
    """Builds a numeric operator by name; unknown names, missing params, or infinite bounds
    for an operator that needs them (``polynomial_mutation``) raise ConfigError."""
    kept = check_numeric_operator(name, **params)
    if name in _BOUNDED and not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))):
        raise ConfigError(
            "name", f"the {name} operator needs a task with finite genome bounds", "use another operator"
        )
    (fn, draw, apply), num_parents, _ = _NUMERIC[name]
    bounds = {"lower": np.asarray(lower, np.float32), "upper": np.asarray(upper, np.float32)}
    return NumericOperator(name, num_parents, fn, {**kept, **bounds}, draw, apply)
