"""The run's model access: one client (``client``) and the embedded llama.cpp server (``server``).

Every LLM call qd makes goes through ``LLMClient``: the concurrency limit,
retries, timeouts, the response cache (``cache``), the failure policy and the
ledger of calls, tokens and cost by (role, model) (``ledger``). What carries a
call is its transport (``transport``): the OpenAI-compatible endpoint of
``llm.base_url`` (``http``, over ``loopback`` for a server on this machine), or
a ``ChatClient`` the caller brings, wrapped as ``ChatTransport(chat)``. Only the
HTTP transport imports ``openai`` (~0.7 s), on the first client built without
a transport of its own, which runs that never call a model should not pay.
"""

from qd.contract import CallFailed, Completion, LLMDown, LLMError
from qd.llm.client import LLMClient, LLMSettings, ModelSpec
from qd.llm.ledger import ROLES, USAGE_FIELDS, Ledger, Usage, tally
from qd.llm.transport import ChatTransport, Reply, Retryable, SpentOnReasoning, Transport

__all__ = [
    "CallFailed",
    "ChatTransport",
    "Completion",
    "LLMDown",
    "LLMError",
    "ROLES",
    "Ledger",
    "LLMClient",
    "LLMSettings",
    "ModelSpec",
    "Reply",
    "Retryable",
    "SpentOnReasoning",
    "Transport",
    "USAGE_FIELDS",
    "Usage",
    "tally",
]
