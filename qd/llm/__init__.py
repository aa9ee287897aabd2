"""The run's model access: one client (``client``) and the embedded llama.cpp server (``server``).

Every LLM call qd makes goes through ``LLMClient``: the concurrency limit,
retries, timeouts, the response cache, the failure policy and the ledger of
calls, tokens and cost by (role, model).
"""

from qd.contract import CallFailed, Completion, LLMDown, LLMError
from qd.llm.client import ROLES, Ledger, LLMClient, LLMSettings, ModelSpec, Usage, tally

__all__ = [
    "CallFailed", "Completion", "LLMDown", "LLMError", "ROLES", "Ledger", "LLMClient", "LLMSettings",
    "ModelSpec", "Usage", "tally",
]
