"""One evaluation's access to the run's model: a budget, cache keys, the ledger role, a trace.

An agent (LLM-written code defining ``forward(task, llm)``) runs only in the
sandbox; its ``llm(messages, **sampling)`` travels to the host, where a
``ModelGateway`` answers it through the run's client (``qd.llm.LLMClient``: the
same cache, ledger, concurrency limit and retries as every other call), within a
``CallBudget`` enforced here, on the host, where the agent cannot touch it::

    gateway = ModelGateway(client, CallBudget(calls=8), candidate_key(text, "eval"))
    result = await sandbox.run(text, args, calls=gateway)   # the entry gets llm=...
    gateway.trace, gateway.calls, gateway.tokens            # what the agent asked and got

A call past the budget, after the time is up, or malformed gets an error answer
(``ModelCallError`` inside the agent), never a model call; a failed model call
(``LLMError``) too. Trusted host code (a prompt's fixed solver, run in a worker
thread) uses ``gateway.blocking(loop)`` instead, with the same budget.

Imports no ``openai``: the client is anything with ``qd.contract.ChatClient``'s
``complete``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from qd.contract import ChatClient, LLMError
from qd.llm.ledger import counting, current_tally
from qd.sandbox.protocol import ModelCallError, answer_of

MAX_CALLS = 4096  # per evaluation: a call's number takes 12 bits of its sample index
KEY_BITS = 48
_ROLES = ("system", "user", "assistant")
_SAMPLING = ("temperature", "max_tokens", "stop", "model", "top_logprobs")
_TRACE_REFUSED = 64  # refused or invalid calls kept in the trace (all are counted in ``refused``)
_TRACE_CHARS = 1 << 16  # a refused call's messages are kept in the trace only up to this size


@dataclasses.dataclass(frozen=True)
class CallBudget:
    """Model calls one evaluation may make (all its stages together)."""

    calls: int = 16  # calls at most
    # prompt + completion tokens at most (prompt estimated as chars/4 before the call, then counted exactly)
    tokens: int = 32_000
    max_tokens: int = 256  # per call: a larger max_tokens asked for is clamped to this
    seconds: float | None = (
        None  # no call starts after this many seconds from the gateway's start (None: no limit)
    )

    def __post_init__(self) -> None:
        def whole(name: str, value: Any, low: int, top: int | None = None) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (top and value > top):
                span = f"{low}..{top}" if top else f"a whole number >= {low}"
                raise ValueError(f"budget.{name}: {value!r} is not allowed (use {span})")

        whole("calls", self.calls, 0, MAX_CALLS)  # 0 (or tokens 0): what a spent budget leaves a later stage
        whole("tokens", self.tokens, 0)
        whole("max_tokens", self.max_tokens, 1)
        if self.seconds is not None and (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, (int, float))
            or not self.seconds > 0
        ):
            raise ValueError(
                f"budget.seconds: {self.seconds!r} is not allowed (use a number > 0, or None: no limit)"
            )


def call_index(key: int, n: int) -> int:
    """The sample index (the client's cache key and seed) of an evaluation's ``n``-th call.

    ``(1 << 62) | (key << 12) | n``: above every operator call's index
    (``qd.contract.sample_index``: below 2**62), unique per (key, n)."""
    if not 0 <= key < 1 << KEY_BITS:
        raise ValueError(f"key: {key!r} is outside 0..2**{KEY_BITS}-1 (use candidate_key)")
    if not 0 <= n < MAX_CALLS:
        raise ValueError(f"n: {n!r} is outside 0..{MAX_CALLS - 1}")
    return (1 << 62) | (key << 12) | n


def candidate_key(text: str, stage: str = "") -> int:
    """48 bits of sha256(text, stage): the same agent text gets the same keys in a rerun
    (so its calls hit the cache), a different one different keys."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass") + b"\0" + stage.encode()).digest()
    return int.from_bytes(digest[: KEY_BITS // 8], "big")


class _Refused(Exception):
    """A call answered with an error without asking the model; the message is the answer."""


def _messages(value: Any) -> list[dict]:
    """The chat messages of a request, or _Refused naming the problem and the fix."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _Refused(
            f"llm: messages: got {type(value).__name__}{' (empty)' if value == [] else ''} "
            "(pass a str, or a non-empty list of {'role', 'content'} dicts)"
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise _Refused(
                f"llm: messages[{i}]: not a dict of exactly 'role' and 'content' "
                "(write {'role': 'user', 'content': '...'})"
            )
        if m["role"] not in _ROLES:
            raise _Refused(
                f"llm: messages[{i}].role: {str(m['role'])[:40]!r} is not a role "
                "(use system, user or assistant)"
            )
        if not isinstance(m["content"], str):
            raise _Refused(f"llm: messages[{i}].content: got {type(m['content']).__name__} (pass a str)")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _sampling(value: Any, budget: CallBudget, models: Sequence[str]) -> dict:
    """temperature, max_tokens (clamped to the budget's), stop, model (one of ``models``) and
    top_logprobs, or _Refused."""
    if not isinstance(value, dict):
        raise _Refused("llm: sampling: not keyword arguments (pass temperature=, max_tokens=, stop=)")
    for name in value:
        if name not in _SAMPLING:
            raise _Refused(f"llm: {str(name)[:40]}: not a sampling option (use {', '.join(_SAMPLING)})")
    out: dict[str, Any] = {
        "temperature": None,
        "max_tokens": budget.max_tokens,
        "stop": None,
        "model": None,
        "top_logprobs": None,
    }
    t = value.get("temperature")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
            raise _Refused(f"llm: temperature: {str(t)[:40]} is not in [0, 2] (pass a number from 0 to 2)")
        out["temperature"] = float(t)
    m = value.get("max_tokens")
    if m is not None:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise _Refused(
                f"llm: max_tokens: {str(m)[:40]} is not a whole number >= 1 (pass e.g. max_tokens=128)"
            )
        out["max_tokens"] = min(m, budget.max_tokens)
    stop = value.get("stop")
    if stop is not None:
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
            raise _Refused("llm: stop: not a list of at most 4 str (pass e.g. stop=['\\n\\n'])")
        out["stop"] = list(stop)
    model = value.get("model")
    if model is not None:
        if not isinstance(model, str) or model not in models:
            raise _Refused(
                f"llm: model: {str(model)[:60]!r} is not one of the run's models {list(models)} "
                "(pass one of them, or leave model out for the run's choice)"
            )
        out["model"] = model
    k = value.get("top_logprobs")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 20:
            raise _Refused(f"llm: top_logprobs: {str(k)[:40]} is not a whole number in 1..20 (pass e.g. 10)")
        out["top_logprobs"] = k
    return out


def _chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages)


class ModelGateway:
    """One evaluation's access to the run's model: budget, cache key, ledger role, trace.

    ``await gateway(request)`` answers one call (``{"n", "messages", "sampling"}`` ->
    ``{"n", "text"}`` or ``{"n", "error"}``): it is the ``calls`` handler of
    ``Sandbox.run``. ``key`` (``candidate_key``) makes the calls' sample indices;
    ``role`` is the ledger's; ``model``/``temperature`` default to the client's choice.
    Calls are counted in the client's ledger and in the tally (``qd.llm.ledger``) that
    was current when the gateway was made, wherever they are answered from.

    ``calls``, ``tokens``: spent so far (calls that reached the model; their real
    tokens). ``refused``: calls answered with an error without asking the model.
    ``trace``: one dict per call, in order (refused ones: the first 64).
    ``close()``: the evaluation is over; later calls are refused.
    """

    def __init__(
        self,
        client: ChatClient,
        budget: CallBudget,
        key: int,
        *,
        role: str = "agent",
        model: str | None = None,
        temperature: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        call_index(key, 0)  # ValueError for a bad key
        self.client, self.budget, self.key, self.role = client, budget, key, role
        self.model, self.temperature, self.clock = model, temperature, clock
        self.tally = current_tally()  # the proposal's, where the gateway is made
        self.started = clock()
        self.trace: list[dict] = []
        self.calls = 0
        self.tokens = 0
        self.refused = 0
        self.closed = False
        self._reserved = 0  # tokens set aside for calls in flight (their prompt estimate + max_tokens)
        self._waiting: set[concurrent.futures.Future] = set()  # blocking() calls under way

    def __repr__(self) -> str:
        b = self.budget
        return (
            f"ModelGateway(role={self.role!r}, calls={self.calls}/{b.calls}, "
            f"tokens={self.tokens}/{b.tokens}, refused={self.refused})"
        )

    def _deadline_passed(self) -> bool:
        return self.budget.seconds is not None and self.clock() - self.started >= self.budget.seconds

    def _final(self) -> str | None:
        """Why no further call may start, ever (time up, calls spent), or None."""
        b = self.budget
        if self.closed:
            return "llm: the evaluation is over (no more model calls)"
        if self._deadline_passed():
            return f"llm: time is up (no call starts after {b.seconds:g} s of the evaluation)"
        if self.calls >= b.calls:
            return f"llm: call budget spent ({b.calls} call{'s' * (b.calls != 1)} per evaluation)"
        return None

    def _refusal(self, prompt: int, max_tokens: int) -> str | None:
        """Why this call may not start now, or None."""
        b = self.budget
        if why := self._final():
            return why
        left = b.tokens - self.tokens - self._reserved
        if prompt + max_tokens > left:
            return (
                f"llm: token budget: this call may take ~{prompt + max_tokens} tokens (prompt ~{prompt} "
                f"+ max_tokens {max_tokens}), {max(left, 0)} of {b.tokens} per evaluation are left "
                "(shorten the prompt or lower max_tokens)"
            )
        return None

    def _note(self, entry: dict, model_call: bool) -> None:
        if model_call:
            self.trace.append(entry)
            return
        self.refused += 1
        if self.refused <= _TRACE_REFUSED:
            self.trace.append(entry)

    async def __call__(self, request: dict) -> dict:
        """Answer one call: ``{"n", "messages", "sampling"}`` -> ``{"n", "text"}`` or ``{"n", "error"}``."""
        n = request.get("n") if isinstance(request, dict) else None
        entry: dict[str, Any] = {
            "n": n,
            "messages": None,
            "sampling": None,
            "model": None,
            "tokens_in": 0,
            "tokens_out": 0,
            "cached": False,
            "seconds": 0.0,
        }
        item = request.get("item") if isinstance(request, dict) else None
        if isinstance(item, int) and not isinstance(item, bool) or isinstance(item, str):
            entry["item"] = item if isinstance(item, int) else item[:200]  # which task item (the entry says)
        try:
            if not isinstance(request, dict):
                raise _Refused("llm: request: not a dict (a bug in the caller)")
            sampling = _sampling(request.get("sampling", {}), self.budget, self._models())
            entry["sampling"] = sampling
            messages = _messages(request.get("messages"))
            chars = _chars(messages)
            if chars <= _TRACE_CHARS:
                entry["messages"] = messages
            prompt = -(-chars // 4)
            why = self._refusal(prompt, sampling["max_tokens"])
            if why:
                raise _Refused(why)
        except _Refused as e:
            entry["error"] = str(e)
            self._note(entry, model_call=False)
            if self._final():  # the sandbox answers the evaluation's later calls itself
                return {"n": n, "error": str(e), "final": True}
            return {"n": n, "error": str(e)}
        entry["messages"] = messages
        index, reserved = self.calls, prompt + sampling["max_tokens"]
        self.calls += 1
        self._reserved += reserved
        temperature = self.temperature if sampling["temperature"] is None else sampling["temperature"]
        start = self.clock()
        try:
            with counting(self.tally):
                if self.budget.seconds is None:
                    c = await self._complete(messages, temperature, sampling, index)
                else:  # a call under way when the time is up is cut short
                    left = self.budget.seconds - (start - self.started)
                    async with asyncio.timeout(max(left, 0.0)):
                        c = await self._complete(messages, temperature, sampling, index)
        except TimeoutError as e:
            if self.budget.seconds is None:  # not ours (the client times out as CallFailed)
                entry["error"] = f"llm: TimeoutError: {e}"
                raise
            entry["error"] = (
                f"llm: time is up (the call ran past {self.budget.seconds:g} s of the evaluation)"
            )
        except LLMError as e:
            entry["error"] = " ".join(str(e).split())
        except asyncio.CancelledError:
            entry["error"] = "llm: cancelled (the evaluation ended)"
            raise
        except BaseException as e:
            entry["error"] = f"llm: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            raise
        else:
            self.tokens += c.tokens_in + c.tokens_out
            entry.update(
                text=c.text, model=c.model, tokens_in=c.tokens_in, tokens_out=c.tokens_out, cached=c.cached
            )
            if sampling["top_logprobs"] is not None:
                entry["top_logprobs"] = c.top_logprobs or []
        finally:
            self._reserved -= reserved
            entry["seconds"] = self.clock() - start
            self._note(entry, model_call=True)
        if "error" in entry:
            return {"n": n, "error": entry["error"]}  # (not final: the next call may be refused otherwise)
        if "top_logprobs" in entry:
            return {"n": n, "text": entry["text"], "top_logprobs": entry["top_logprobs"]}
        return {"n": n, "text": entry["text"]}

    def _models(self) -> tuple[str, ...]:
        """The model names a call may ask for: the run's (the client's settings)."""
        settings = getattr(self.client, "settings", None)
        return tuple(m.name for m in getattr(settings, "models", ())) or ((self.model,) if self.model else ())

    async def _complete(self, messages: list[dict], temperature: float | None, sampling: dict, index: int):
        k = sampling["top_logprobs"]
        return await self.client.complete(
            messages,
            model=sampling["model"] or self.model,
            temperature=temperature,
            max_tokens=sampling["max_tokens"],
            stop=sampling["stop"],
            sample_index=call_index(self.key, index),
            logprobs=k is not None,
            top_logprobs=k,
            role=self.role,
        )

    def close(self) -> None:
        """The evaluation is over: every later call is refused, and blocking calls still under
        way are cancelled (their callers get ``ModelCallError``). Call it on the loop's thread."""
        self.closed = True
        for fut in list(self._waiting):
            fut.cancel()

    def blocking(self, loop: asyncio.AbstractEventLoop) -> Callable[..., str]:
        """A blocking ``llm(messages, **sampling) -> str`` for trusted host code in a worker
        thread: each call runs on ``loop`` (which must be running, in another thread) with
        this gateway's budget; an error answer raises ``ModelCallError``."""
        numbers = itertools.count()

        def llm(messages: Any, **sampling: Any) -> str:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError(
                    "llm: blocking() called on its own event loop's thread (it would wait "
                    "forever; run the caller in a thread, e.g. asyncio.to_thread)"
                )
            if self.closed:  # (a thread left behind; the loop may be gone)
                raise ModelCallError(self._final())
            request = {"n": next(numbers), "messages": messages, "sampling": sampling}
            fut = asyncio.run_coroutine_threadsafe(self(request), loop)
            self._waiting.add(fut)
            try:
                answer = fut.result()
            except concurrent.futures.CancelledError:
                raise ModelCallError("llm: cancelled (the evaluation ended)") from None
            except Exception as e:  # a bug on the host: the same answer the sandbox's callers get
                raise ModelCallError(
                    " ".join(f"llm: the host failed: {type(e).__name__}: {e}".split())[:500]
                ) from e
            finally:
                self._waiting.discard(fut)
            if "error" in answer:
                raise ModelCallError(answer["error"])
            return answer_of(answer)

        llm.__doc__ = (
            "llm(messages, temperature=, max_tokens=, stop=, model=, top_logprobs=) -> str (a dict "
            "{'text', 'top_logprobs'} with top_logprobs=): the run's model, within "
            f"this evaluation's budget ({self.budget.calls} calls, {self.budget.tokens} tokens); "
            "raises ModelCallError when refused or failed"
        )
        return llm
