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

from operators.gaussian import gaussian
from operators.isoline import isoline


@dataclasses.dataclass(frozen=True)
class NumericOperator:
    """A jitted vector variation ``fn(key, parents f32[B, k, n], **params) -> f32[B, n]``."""

    name: str
    num_parents: int
    fn: Callable[..., jax.Array]
    params: dict[str, Any]

    async def __call__(self, key: jax.Array, parents: np.ndarray, context: Any = None) -> np.ndarray:
        """parents: f32[B, num_parents, n] -> children f32[B, n]."""
        return np.asarray(self.fn(key, parents, **self.params))


_NUMERIC = {
    "gaussian": (gaussian, 1, ("sigma",)),
    "isoline": (isoline, 2, ("iso_sigma", "line_sigma")),
}


def make_numeric_operator(
    name: str, lower: Any = -np.inf, upper: Any = np.inf, **params: float
) -> NumericOperator:
    """Builds a numeric operator by name; unknown names or missing params raise ValueError."""
    if name not in _NUMERIC:
        raise ValueError(f"name: unknown operator {name!r} (use one of {sorted(_NUMERIC)})")
    fn, num_parents, required = _NUMERIC[name]
    missing = [p for p in required if params.get(p) is None]
    if missing:
        raise ValueError(f"{missing[0]}: required by the {name} operator")
    kept = {p: float(params[p]) for p in required}
    bounds = {"lower": np.asarray(lower, np.float32), "upper": np.asarray(upper, np.float32)}
    return NumericOperator(name, num_parents, fn, {**kept, **bounds})
