"""Variation operators: parents (+ context) -> children."""

from operators.base import NumericOperator, make_numeric_operator
from operators.gaussian import gaussian
from operators.isoline import isoline

__all__ = ["NumericOperator", "gaussian", "isoline", "make_numeric_operator"]
