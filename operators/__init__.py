"""Variation operators: parents (+ context) -> children."""

from operators.base import NumericOperator, check_numeric_operator, make_numeric_operator
from operators.gaussian import gaussian
from operators.isoline import isoline
from operators.llm import Child, LLMOperator, Parent, PromptContext, check_llm_operator, make_llm_operator

__all__ = [
    "Child",
    "LLMOperator",
    "NumericOperator",
    "Parent",
    "PromptContext",
    "check_llm_operator",
    "check_numeric_operator",
    "gaussian",
    "isoline",
    "make_llm_operator",
    "make_numeric_operator",
]
