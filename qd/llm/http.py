"""An OpenAI-compatible chat endpoint over HTTP: ``LLMClient``'s default transport.

One ``openai.AsyncOpenAI`` client per run, with the library's own retries off
(the client retries, so that every attempt is counted in the ledger) and a
server on this machine reached through ``qd.llm.loopback``. One attempt sends
the request to the raw endpoint and reads the body itself: what the server
answers is turned into a :class:`~qd.llm.transport.Reply`, or into the failure
the client acts on (retry, fail the call, or go down), with the fix in its message.
Only this module and ``loopback`` import ``openai`` (~0.7 s), so a run whose
model client is the caller's never pays for it.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import openai

from qd.contract import CallFailed, LLMDown, LLMError
from qd.llm.loopback import ChatEndpoint, chat_client
from qd.llm.transport import Reply, Retryable, SpentOnReasoning, one_line

_DUMMY_KEY = "sk-no-key"  # local servers ignore the key but the client requires one
_RETRY_STATUS = {408, 409, 429}  # plus every 5xx
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Where servers put a reasoning model's hidden text (DeepSeek, llama.cpp, vLLM: reasoning_content;
# OpenRouter, newer vLLM: reasoning) and its token count (OpenAI, OpenRouter, DeepSeek, Gemini:
# completion_tokens_details; the Responses shape: output_tokens_details; a few: flat).
_REASONING_TEXT = ("reasoning_content", "reasoning")
_REASONING_DETAILS = ("completion_tokens_details", "output_tokens_details")


def _top_logprobs(logprobs: Any) -> list[dict[str, float]] | None:
    """``choices[0].logprobs.content[i].top_logprobs`` as one {token: logprob} per position.

    None when absent or not in the OpenAI shape: the text is still good, so the
    reply is not retried; the caller falls back to it. A token listed twice (two
    ids, one string) gets the total probability of both.
    """
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    positions: list[dict[str, float]] = []
    for entry in content:
        alternatives = entry.get("top_logprobs") if isinstance(entry, dict) else None
        if not isinstance(alternatives, list):
            return None
        top: dict[str, float] = {}
        for alt in alternatives:
            if not (
                isinstance(alt, dict)
                and isinstance(alt.get("token"), str)
                and isinstance(alt.get("logprob"), (int, float))
            ):
                return None
            token, lp = alt["token"], float(alt["logprob"])
            top[token] = float(np.logaddexp(top[token], lp)) if token in top else lp
        positions.append(top)
    return positions


def _estimate_tokens(text: str) -> int:
    """~4 characters per token: used only when a server omits ``usage``."""
    return max(1, len(text) // 4) if text else 0


def _malformed(cause: str) -> Retryable:
    return Retryable("sent malformed replies", cause, "is llm.base_url an OpenAI-compatible /v1 endpoint?")


def _reasoning_tokens(usage: dict, message: dict) -> int:
    """What the answer spent reasoning: the server's count in any of the usage shapes, else
    estimated from the reasoning text it sent (llama.cpp sends the text only), else 0."""
    for details in (usage.get(name) for name in _REASONING_DETAILS):
        if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
            return details["reasoning_tokens"]
    if isinstance(usage.get("reasoning_tokens"), int):
        return usage["reasoning_tokens"]
    text = next((message[k] for k in _REASONING_TEXT if isinstance(message.get(k), str)), "")
    return _estimate_tokens(text)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms`` (OpenAI's), else ``retry-after``
    in seconds or as an HTTP date; None when it says nothing readable."""
    try:
        return max(0.0, float(headers["retry-after-ms"]) / 1000)
    except (KeyError, ValueError):
        pass
    after = headers.get("retry-after")
    if not after:
        return None
    try:
        return max(0.0, float(after))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(after)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())  # (an HTTP date is GMT: never naive)


def _parse(body: bytes, request: dict, where: str) -> Reply:
    """Text, finish reason and token counts out of a reply body, or :class:`Retryable` saying why
    it is malformed. Missing ``usage`` is estimated (~4 characters a token) so budgets still move.
    An answer with no text whose tokens went to reasoning is :class:`SpentOnReasoning`."""
    try:
        data = json.loads(body)
    except ValueError:
        raise _malformed("body is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise _malformed("no 'choices' list")
    if not data["choices"]:
        raise _malformed("empty 'choices'")
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _malformed("no message")
    text = message.get("content")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    reasoning = _reasoning_tokens(usage, message)
    if not isinstance(text, str) and not reasoning:
        raise _malformed("no message content")
    text = text or ""
    t_in = usage.get("prompt_tokens")
    t_out = usage.get("completion_tokens")
    if not isinstance(t_in, int):
        t_in = _estimate_tokens("".join(str(m.get("content", "")) for m in request["messages"]))
    if not isinstance(t_out, int):
        t_out = _estimate_tokens(text) + reasoning
    top = _top_logprobs(choice.get("logprobs")) if request.get("logprobs") else None
    reply = Reply(text, choice.get("finish_reason"), t_in, t_out, top, reasoning_tokens=reasoning)
    if reasoning and not text.strip():
        raise SpentOnReasoning(where, reply)
    return reply


class HTTPTransport:
    """Chat requests to ``base_url``, an OpenAI-compatible ``/v1`` endpoint.

    The key is read from the env var named ``api_key_env`` (None: a dummy key,
    which local servers ignore) and never kept anywhere but the openai client.
    ``timeout_s`` is a backstop (the client's per-attempt limit comes first; it
    also catches a server that trickles bytes and never trips a read timeout).
    Remote endpoints keep openai's own HTTP client (TLS, HTTP/2, proxy env vars).
    """

    def __init__(self, base_url: str | None, api_key_env: str | None, timeout_s: float):
        if not base_url:  # openai would fall back to OPENAI_BASE_URL or its own API
            raise LLMError("llm: no base_url (set llm.base_url, or bring a ChatClient)")
        if api_key_env is None:
            key = _DUMMY_KEY
        else:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise LLMError(f"llm: env var {api_key_env} is not set (export it or set llm.api_key_env)")
        self.where, self.api_key_env, self.timeout_s = base_url, api_key_env, timeout_s
        options = dict(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s + 1.0)
        url = urlsplit(base_url)
        self._client = chat_client(url.hostname in _LOOPBACK and url.scheme == "http", **options)
        self._chat = ChatEndpoint(self._client)

    async def send(self, request: dict, *, sample_index: int, role: str) -> Reply:
        """One round trip (``sample_index`` and ``role`` are already in the request's seed, or nowhere)."""
        try:
            raw = await self._chat.post(request)
            body = raw.content
        except openai.APITimeoutError:
            raise Retryable.timed_out(self.timeout_s) from None
        except openai.APIConnectionError as err:
            raise Retryable(
                "unreachable",
                type(err.__cause__ or err).__name__,
                "is the server running? check llm.base_url",
            ) from None
        except openai.APIStatusError as err:
            raise self._status_failure(err, request["model"]) from None
        return _parse(body, request, self.where)

    async def aclose(self) -> None:
        await self._client.close()

    def _status_failure(self, err: openai.APIStatusError, model: str) -> Exception:
        """What an HTTP error status means: retry it, fail the call, or the server is out of reach."""
        code, url = err.status_code, self.where
        if code in _RETRY_STATUS or code >= 500:
            retry_after = _retry_after(err.response.headers)
            if code == 429:
                return Retryable(
                    "rate-limited", "HTTP 429", "lower llm.concurrency or raise llm.max_retries", retry_after
                )
            fix = "check the server's log; raise llm.max_retries if it is flaky"
            return Retryable("failed", f"HTTP {code}", fix, retry_after)
        detail = one_line(err.message.removeprefix(f"Error code: {code} - "))
        # A refused key or model: no retry and no other prompt fixes these, so the run stops.
        if code in (401, 403):
            env = self.api_key_env
            where = f"the key in env var {env}" if env else "llm.api_key_env: the server wants a key"
            return LLMDown(f"llm: {url} refused the API key (HTTP {code}: {detail}) (check {where})")
        if code == 404:
            return LLMDown(
                f"llm: {url} answered HTTP 404 for model {model!r} ({detail}) "
                "(check llm.models names and that llm.base_url ends in /v1)"
            )
        return CallFailed(
            f"llm: {url} rejected the request (HTTP {code}: {detail}) "
            "(check llm.max_tokens and the prompt length)"
        )
