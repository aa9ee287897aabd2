"""The run's model access: one client (``client``) and the embedded llama.cpp server (``server``).

Every LLM call qd makes goes through ``LLMClient``: the concurrency limit,
retries, timeouts, the response cache, the failure policy and the ledger of
calls, tokens and cost by (role, model) (``ledger``). The client's names are
imported on first use: ``openai`` takes ~0.7 s to import, which runs that never
call a model should not pay.
"""

from qd.contract import CallFailed, Completion, LLMDown, LLMError
from qd.llm.ledger import ROLES, Ledger, Usage, tally

__all__ = [
    "CallFailed",
    "Completion",
    "LLMDown",
    "LLMError",
    "ROLES",
    "Ledger",
    "LLMClient",
    "LLMSettings",
    "ModelSpec",
    "Usage",
    "tally",
]
_CLIENT = ("LLMClient", "LLMSettings", "ModelSpec")


def __getattr__(name: str) -> object:
    if name in _CLIENT:
        from qd.llm import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
