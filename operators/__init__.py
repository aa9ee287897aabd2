"""Variation operators: parents (+ context) -> children."""

from operators.base import NumericOperator, make_numeric_operator
from operators.gaussian import gaussian
from operators.isoline import isoline
from operators.llm import Child, LLMOperator, Parent, PromptContext, make_llm_operator

__all__ = [
    "Child",
    "LLMOperator",
    "NumericOperator",
    "Parent",
    "PromptContext",
    "gaussian",
    "isoline",
    "make_llm_operator",
    "make_numeric_operator",
]
