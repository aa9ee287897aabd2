"""The one way qd talks to a model: ``LLMClient``, the policy around a transport.

The client decides everything but the wire: which model (by weight, reproducibly
from ``(seed, sample_index)``), the concurrency limit, the per-attempt timeout,
retries (exponential backoff, full jitter, every attempt counted in the ledger),
the response cache (``qd.llm.cache``: a rerun replays the same answers and the
same budget offline) and the ledger of calls, tokens and cost by role (operator,
judge, meta, agent) and model, in the client's own ledger and the run's tally.

The wire is a transport (``qd.llm.transport``), injected: ``LLMClient(settings)``
talks to the OpenAI-compatible endpoint at ``settings.base_url``
(``qd.llm.http``); ``LLMClient(settings, transport=ChatTransport(chat))`` talks
to a ``qd.contract.ChatClient`` the caller made (their own API client, a test's
scripted one). A transport rather than a second client class, so that a caller's
client gets every rule here, ``runner.max_llm_calls`` included, with no copy of them.

The failure policy, one for every caller: a call that spends its retries, or
that the server rejects (HTTP 400, a prompt too long), raises ``CallFailed`` and
fails only what asked for it; so does a reasoning model's answer with no text
(``SpentOnReasoning``: its budget went to reasoning, and a retry would spend it
the same way), once, its tokens counted. A server's Retry-After is waited in
full, never cut short: one asking for more than ``retry_after_max_s`` fails the
call at once (with what it asked) rather than being retried early. Only what
no retry can fix raises ``LLMDown`` and marks the client down: 401/403/404, or
no call answered for ``give_up_after_s`` (a flaky server that answers now and
then keeps the run alive; a dead one ends it).
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from qd.contract import CallFailed, Completion, LLMDown, LLMError
from qd.llm.cache import ResponseCache
from qd.llm.ledger import Ledger, current_tally
from qd.llm.transport import Reply, Retryable, SpentOnReasoning, Transport

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model the run may call, its share of calls and its price."""

    name: str  # model id sent to the server
    weight: float = 1.0  # share of calls when several models
    price_in: float = 0.0  # USD per million prompt tokens
    price_out: float = 0.0  # USD per million completion tokens


@dataclasses.dataclass(frozen=True)
class LLMSettings:
    """Where the server is and how hard to push it; never holds the key itself."""

    base_url: str | None  # None: no HTTP endpoint (a caller's ChatClient, or the local server unstarted)
    models: tuple[ModelSpec, ...]
    api_key_env: str | None = None  # NAME of the env var holding the key; None -> dummy key
    concurrency: int = 8  # calls in flight at most
    timeout_s: float = 60.0  # per attempt
    max_retries: int = 5
    backoff_s: float = 0.5  # exponential backoff base, full jitter
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0  # the longest Retry-After waited; a longer one fails the call
    give_up_after_s: float = 300.0  # no call answered for this long: the server is down, the run stops
    temperature: float = 0.8
    max_tokens: int = 512
    # set: sent as ``max_completion_tokens`` instead of ``max_tokens`` (reasoning models: the
    # answer's whole budget, reasoning included; OpenAI's o-series and gpt-5 refuse max_tokens)
    max_completion_tokens: int | None = None
    # fields added to every request body, e.g. the provider's reasoning setting
    # ({"reasoning_effort": "high"}; ``qd.llm.plan`` writes each provider's shape)
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: int | None = None  # if set, each call sends a seed derived from (seed, sample_index)
    cache_dir: str | None = None  # on-disk response cache; None = off


def _derived_seed(seed: int, sample_index: int) -> int:
    """A per-sample seed, stable across runs and platforms, in the int32 range servers accept."""
    digest = hashlib.sha256(f"{seed}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class LLMClient:
    """Chat completions with a concurrency limit, retries, a token/cost ledger and a cache.

    ``transport`` carries each attempt (``qd.llm.transport``); None: the HTTP
    endpoint at ``settings.base_url``, whose key env var is then checked here.
    """

    def __init__(self, settings: LLMSettings, transport: Transport | None = None):
        if not settings.models:
            raise LLMError("llm: no models configured (set llm.models)")
        self.settings = settings
        self.ledger = Ledger()
        self.down: str | None = None  # why no call can succeed any more (LLMDown's message)
        self._answered_at: float | None = None  # monotonic time of the last answer, or of the first try
        self._models = {m.name: m for m in settings.models}
        self._weights = np.array([m.weight for m in settings.models], dtype=float)
        if (self._weights < 0).any() or self._weights.sum() <= 0:
            raise LLMError("llm: model weights must be >= 0 with a positive sum (check llm.models[*].weight)")
        self._weights /= self._weights.sum()
        self._cumulative = np.cumsum(self._weights).tolist()
        self._sem = asyncio.Semaphore(settings.concurrency)
        self._jitter = random.Random()  # jitter only spreads retries; it never affects results
        if transport is None:  # (imported here: openai costs ~0.7 s, which a caller's client never needs)
            from qd.llm.http import HTTPTransport

            transport = HTTPTransport(settings.base_url, settings.api_key_env, settings.timeout_s)
        self._transport = transport
        self._cache = ResponseCache(settings.cache_dir) if settings.cache_dir else None

    def __repr__(self) -> str:
        names = ",".join(self._models)
        where, key_env = self._transport.where, self.settings.api_key_env
        return f"LLMClient({where!r}, models={names!r}, key_env={key_env!r})"

    def pick_model(self, rng: np.random.Generator) -> str:
        """Choose a model name with probability proportional to its weight (one model: no draw)."""
        if len(self._weights) == 1:
            return self.settings.models[0].name
        return self.settings.models[int(rng.choice(len(self._weights), p=self._weights))].name

    def _model_for_sample(self, sample_index: int) -> str:
        """A weighted pick that depends only on (seed, sample_index), so reruns and caches agree."""
        digest = hashlib.sha256(f"model:{self.settings.seed}:{sample_index}".encode()).digest()
        u = int.from_bytes(digest[:8], "little") / 2.0**64
        i = min(bisect.bisect_right(self._cumulative, u), len(self._cumulative) - 1)
        return self.settings.models[i].name

    async def complete(
        self,
        messages: list[dict],
        *,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        sample_index: int = 0,
        stop: list[str] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        role: str = "operator",
    ) -> Completion:
        """Answer ``messages``; ``model=None`` picks by weight, reproducibly from (seed, sample_index).

        ``logprobs``/``top_logprobs`` are the OpenAI chat fields: ask for the top
        ``top_logprobs`` alternatives at each generated token (``Completion.top_logprobs``).
        ``role`` (one of ``ROLES``) is who asks: the ledger splits calls by it.

        Raises:
            CallFailed: this call failed; another may succeed.
            LLMDown: no call can succeed (``self.down`` says why).
        """
        s = self.settings
        if top_logprobs is not None and not (logprobs and 0 <= top_logprobs <= 20):
            raise ValueError(f"llm: top_logprobs={top_logprobs} needs logprobs=True and a value in 0..20")
        if model is None:
            model = self._model_for_sample(sample_index)
        spec = self._models.get(model)
        if spec is None:
            raise self._fall(
                LLMDown(
                    f"llm: model {model!r} is not in llm.models "
                    f"(add it there or pick one of {list(self._models)})"
                )
            )
        budget_field, budget = (
            ("max_tokens", s.max_tokens)
            if s.max_completion_tokens is None
            else ("max_completion_tokens", s.max_completion_tokens)
        )
        request: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": s.temperature if temperature is None else temperature,
            budget_field: budget if max_tokens is None else max_tokens,
            **s.extra_body,  # (only when set, so existing cache keys stay valid)
        }
        if stop is not None:
            request["stop"] = stop
        if logprobs:  # only when asked, so existing cache keys stay valid
            request["logprobs"] = True
            if top_logprobs is not None:
                request["top_logprobs"] = top_logprobs
        if s.seed is not None:
            request["seed"] = _derived_seed(s.seed, sample_index)
        key = None if self._cache is None else self._cache.key(request, s.seed, sample_index)

        ledgers = [self.ledger] + [t for t in (current_tally(),) if t is not None]
        hit = None if key is None else self._cache.get(key)
        if hit is not None:
            for ledger in ledgers:
                ledger.add(hit, role)
            return hit
        if self.down is not None:
            raise LLMDown(self.down)

        t0 = time.perf_counter()
        async with self._sem:
            try:
                reply = await self._with_retries(request, sample_index, role, ledgers)
            except LLMError as err:
                paid = self._completion(spec, err.reply, t0) if isinstance(err, SpentOnReasoning) else None
                for ledger in ledgers:
                    ledger.fail(role, model, paid)
                raise
        result = self._completion(spec, reply, t0)
        if key is not None:
            self._cache.put(key, result)
        for ledger in ledgers:
            ledger.add(result, role)
        return result

    async def aclose(self) -> None:
        await self._transport.aclose()
        if self._cache is not None:
            self._cache.close()

    def _completion(self, spec: ModelSpec, reply: Reply, t0: float) -> Completion:
        return Completion(
            text=reply.text,
            model=spec.name,
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            cost=self._cost(spec, reply),
            cached=False,
            finish_reason=reply.finish_reason,
            seconds=time.perf_counter() - t0,
            top_logprobs=reply.top_logprobs,
            reasoning_tokens=reply.reasoning_tokens,
        )

    @staticmethod
    def _cost(spec: ModelSpec, reply: Reply) -> float:
        """USD by the model's prices; a model priced at nothing costs what the transport says."""
        if spec.price_in or spec.price_out:
            return (reply.tokens_in * spec.price_in + reply.tokens_out * spec.price_out) / 1e6
        return reply.cost

    def _fall(self, err: LLMDown) -> LLMDown:
        """Marks the client down (the first reason wins) and returns ``err`` to raise."""
        if self.down is None:
            self.down = str(err)
        return err

    async def _with_retries(
        self, request: dict, sample_index: int, role: str, ledgers: list[Ledger]
    ) -> Reply:
        """Attempts until one answers; a failure after ``max_retries`` fails the call, and
        one that finds no answer for ``give_up_after_s`` (this call's or any other's) fails them all."""
        s = self.settings
        attempt = 0
        if self._answered_at is None:
            self._answered_at = time.monotonic()
        while True:
            try:
                reply = await self._attempt(request, sample_index, role)
                self._answered_at = time.monotonic()
                return reply
            except LLMDown as err:
                raise self._fall(err) from None
            except Retryable as err:
                if self.down is not None:
                    raise LLMDown(self.down) from None
                where = self._transport.where
                quiet = time.monotonic() - self._answered_at
                if quiet >= s.give_up_after_s:
                    raise self._fall(
                        LLMDown(
                            f"llm: {where} answered no call for {quiet:.0f}s (last: {err.cause}) "
                            "(is the server running? raise llm.give_up_after_s to wait longer)"
                        )
                    ) from None
                if attempt >= s.max_retries:
                    raise CallFailed(
                        f"llm: {where} {err.what} after {attempt} retries ({err.cause}) ({err.fix})"
                    ) from None
                if err.retry_after is not None and err.retry_after > s.retry_after_max_s:
                    raise CallFailed(
                        f"llm: {where} {err.what} and asked to wait {err.retry_after:.0f}s, more than "
                        f"llm.retry_after_max_s={s.retry_after_max_s:g} ({err.cause}) (raise "
                        "llm.retry_after_max_s to wait that long, or lower llm.concurrency)"
                    ) from None
                attempt += 1
                for ledger in ledgers:
                    ledger.retry(role, request["model"])
                delay = self._jitter.uniform(0.0, min(s.backoff_max_s, s.backoff_s * 2 ** (attempt - 1)))
                if err.retry_after is not None:
                    delay = max(delay, err.retry_after)
                log.debug("llm: retry %d/%d after %s in %.2fs", attempt, s.max_retries, err.cause, delay)
                await asyncio.sleep(delay)

    async def _attempt(self, request: dict, sample_index: int, role: str) -> Reply:
        """One attempt through the transport, within ``timeout_s`` and counted in flight."""
        self.ledger.in_flight += 1
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                return await self._transport.send(request, sample_index=sample_index, role=role)
        except TimeoutError:
            raise Retryable.timed_out(self.settings.timeout_s) from None
        finally:
            self.ledger.in_flight -= 1
