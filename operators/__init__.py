"""Variation operators: parents (+ context) -> children.

The LLM operators are checked and built by name here (:func:`check_text_operator`,
:func:`build_text_operator`): ``agent`` (``operators.agent``, a tool loop) or one of
``operators.llm``'s single-call operators.
"""

from typing import Any

from operators.agent import AgentOperator, check_agent_operator
from operators.base import NumericOperator, check_numeric_operator, make_numeric_operator
from operators.gaussian import gaussian
from operators.isoline import isoline
from operators.llm import Child, LLMOperator, Parent, PromptContext, check_llm_operator, make_llm_operator
from operators.polynomial import polynomial_crossover, polynomial_mutation
from qd.contract import ChatClient, ConfigError, TextOperator

_AGENT_ONLY = ("max_steps", "max_trials", "max_conversation_tokens")


def check_text_operator(name: str, **settings: Any) -> dict[str, Any]:
    """An LLM operator's settings by name, checked (no client): the agent's or a single call's.

    Raises:
        ConfigError: the operator's own checks, or an agent-only setting (``max_steps``,
            ``max_trials``, ``max_conversation_tokens``) given to another operator.
    """
    if name == "agent":
        settings.pop("fallback_to_rewrite", None)  # (a diff's setting; the agent writes whole genomes)
        settings.pop("debug_rounds", None)
        return check_agent_operator(**settings)
    for field in _AGENT_ONLY:
        if settings.pop(field, None) is not None:
            raise ConfigError(field, f"only the agent operator takes it, not {name}", "remove it")
    return check_llm_operator(name, **settings)


def build_text_operator(client: ChatClient, params: dict[str, Any]) -> TextOperator:
    """The LLM operator of checked ``params`` (:func:`check_text_operator`) on ``client``."""
    kind = AgentOperator if params["name"] == "agent" else LLMOperator
    return kind(client=client, **params)


def make_text_operator(name: str, client: ChatClient, **settings: Any) -> TextOperator:
    """Builds an LLM operator by name (``settings``: see :func:`check_text_operator`)."""
    return build_text_operator(client, check_text_operator(name, **settings))


__all__ = [
    "AgentOperator",
    "Child",
    "LLMOperator",
    "NumericOperator",
    "Parent",
    "PromptContext",
    "build_text_operator",
    "check_llm_operator",
    "check_numeric_operator",
    "check_text_operator",
    "gaussian",
    "isoline",
    "make_llm_operator",
    "make_numeric_operator",
    "make_text_operator",
    "polynomial_crossover",
    "polynomial_mutation",
]
