"""What carries one chat request to a model for :class:`qd.llm.LLMClient`, and a caller's client as one.

The client is policy (which model, the concurrency limit, retries and the give-up
clock, the cache, the ledger); a transport is one attempt: it sends the request
and returns a :class:`Reply`, or says how the attempt failed. Two exist:
``qd.llm.http.HTTPTransport`` (an OpenAI-compatible endpoint, the default) and
:class:`ChatTransport` (a :class:`qd.contract.ChatClient` the caller made). So
a caller's client is counted, budgeted, retried and cached exactly as qd's own.

How an attempt fails decides what the client does next:

- :class:`Retryable`: worth another attempt (a timeout, a refused connection, a
  5xx or 429, a malformed reply); it says what went wrong and how to fix it, for
  the one-line message of a call that spends its retries;
- ``CallFailed``: this call cannot succeed (HTTP 400, a prompt too long), or
  :class:`SpentOnReasoning`, an answer whose whole budget went to reasoning;
- ``LLMDown``: no call can (a refused key or model); the client goes down.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from qd.contract import CallFailed, ChatClient, Completion, LLMError


class Reply(NamedTuple):
    """One answered attempt. ``cost``: what the transport says it cost (an endpoint says nothing: 0),
    used for a model that ``llm.models`` gives no price."""

    text: str
    finish_reason: str | None
    tokens_in: int
    tokens_out: int
    top_logprobs: list[dict[str, float]] | None = None
    cost: float = 0.0
    reasoning_tokens: int = 0  # of ``tokens_out``, spent reasoning (0 where the server does not say)


class Retryable(Exception):
    """An attempt that failed in a way worth retrying.

    ``what`` and ``fix`` make the message of a call that spends its retries:
    ``llm: <where> <what> after N retries (<cause>) (<fix>)``.
    """

    def __init__(self, what: str, cause: str, fix: str, retry_after: float | None = None):
        super().__init__(cause)
        self.what, self.cause, self.fix, self.retry_after = what, cause, fix, retry_after

    @classmethod
    def timed_out(cls, seconds: float) -> Retryable:
        """No answer within the per-attempt limit (``llm.timeout_s``)."""
        return cls(
            "timed out", f"no answer within {seconds:g}s", "raise llm.timeout_s or lower llm.max_tokens"
        )


class SpentOnReasoning(CallFailed):
    """A reasoning model's answer with no visible text: its whole budget went to reasoning.

    A call failure, not a malformed reply: the same request would spend the same
    budget the same way, so it is not retried. ``reply`` holds what it cost (its
    tokens are paid for and counted in the ledger), with an empty text.
    """

    def __init__(self, where: str, reply: Reply):
        super().__init__(
            f"llm: {where} spent the answer's whole budget on reasoning ({reply.reasoning_tokens} "
            f"reasoning tokens, finish_reason {reply.finish_reason}) and answered no text "
            "(raise llm.max_completion_tokens, or lower llm.reasoning_effort)"
        )
        self.reply = reply


class Transport(Protocol):
    """One attempt at a chat request, for :class:`qd.llm.LLMClient`.

    ``request`` holds the OpenAI chat fields (``model``, ``messages``,
    ``temperature``, ``max_tokens`` or ``max_completion_tokens``; ``stop``,
    ``logprobs``, ``top_logprobs``, ``seed`` and the provider's reasoning fields
    when set); ``sample_index`` and ``role`` are the caller's, for
    a transport that passes them on. ``where`` names what answers, in messages.
    """

    where: str

    async def send(self, request: dict, *, sample_index: int, role: str) -> Reply: ...

    async def aclose(self) -> None: ...


def one_line(s: object, limit: int = 160) -> str:
    """``s`` on one line, cut to ``limit`` characters: failure messages are one line."""
    text = " ".join(str(s).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChatTransport:
    """A :class:`qd.contract.ChatClient` the caller brings, as :class:`qd.llm.LLMClient`'s transport.

    ``LLMClient(settings, transport=ChatTransport(chat))`` is the caller's client
    inside qd's policy: every call in the ledger and the run's tally (so
    ``runner.max_llm_calls`` binds), the concurrency limit, the per-attempt
    timeout, retries and the give-up clock, the response cache. ``chat.complete``
    gets every keyword of ``ChatClient.complete``, with the model the client chose
    from ``settings.models``; the seed derived from ``llm.seed`` stays out (the
    protocol has no such field: ``sample_index`` is there to seed from).

    What the caller's client raises: ``CallFailed`` fails the call and ``LLMDown``
    puts the client down, as their contract says (qd does not retry a call the
    caller's client gave up on); any other exception is retried like a server
    error. Its ``Completion.cost`` counts for a model without a price in
    ``settings.models`` (one with a price is priced by it); its ``top_logprobs`` are passed on
    when asked for (``logprobs=True``; the protocol cannot ask, so only a client
    that sends them anyway has them). ``aclose`` leaves the caller's client open:
    it is the caller's.
    """

    def __init__(self, chat: ChatClient, where: str | None = None):
        self.chat = chat
        self.where = where or f"the caller's {type(chat).__name__}"

    async def send(self, request: dict, *, sample_index: int, role: str) -> Reply:
        try:
            c = await self.chat.complete(
                request["messages"],
                model=request["model"],
                temperature=request["temperature"],
                max_tokens=request.get("max_completion_tokens", request.get("max_tokens")),
                sample_index=sample_index,
                stop=request.get("stop"),
                role=role,
            )
        except LLMError:
            raise
        except Exception as err:  # the caller's client failed in its own way: retried like a server error
            raise Retryable(
                "failed",
                one_line(f"{type(err).__name__}: {err}"),
                "its complete() raised this; raise llm.max_retries if it is flaky",
            ) from None
        if not (isinstance(c, Completion) and isinstance(c.text, str)):
            raise Retryable(
                "sent malformed replies",
                f"{type(c).__name__} is not a Completion with text",
                "complete() must return a qd.contract.Completion",
            )
        top = c.top_logprobs if request.get("logprobs") else None
        return Reply(c.text, c.finish_reason, c.tokens_in, c.tokens_out, top, c.cost, c.reasoning_tokens)

    async def aclose(self) -> None:
        """Nothing to close: the caller made the client and closes it."""
