"""The one way qd talks to a model: an OpenAI-compatible chat endpoint.

One ``openai.AsyncOpenAI`` client per run, with the library's own retries off:
this module retries itself (exponential backoff, full jitter) so that every
attempt is counted in the ledger, malformed replies are retried like server
errors, and the final failure is one line naming the cause and the fix.
Successful replies can be cached on disk, keyed by everything that determines
them, so a rerun replays the same answers (and the same budget) offline.

The failure policy, one for every caller: a call that spends its retries, or
that the server rejects (HTTP 400, a prompt too long), raises ``CallFailed`` and
fails only what asked for it. Only what no retry can fix raises ``LLMDown`` and
marks the client down: 401/403/404, or no call answered for ``give_up_after_s``
(a flaky server that answers now and then keeps the run alive; a dead one ends
it). The ledger counts every call by role (operator, judge, meta, agent) and model.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2  # openai's HTTP library
import numpy as np
import openai
from openai._models import FinalRequestOptions  # what ``AsyncOpenAI.post`` builds

from qd.contract import CallFailed, Completion, LLMDown, LLMError
from qd.llm.ledger import Ledger, current_tally

log = logging.getLogger(__name__)

_DUMMY_KEY = "sk-no-key"  # local servers ignore the key but the client requires one
_RETRY_STATUS = {408, 409, 429}  # plus every 5xx
_FATAL_STATUS = {401, 403, 404}  # no retry and no other prompt fixes these: the run stops
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


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

    base_url: str
    models: tuple[ModelSpec, ...]
    api_key_env: str | None = None  # NAME of the env var holding the key; None -> dummy key
    concurrency: int = 8  # calls in flight at most
    timeout_s: float = 60.0  # per attempt
    max_retries: int = 5
    backoff_s: float = 0.5  # exponential backoff base, full jitter
    backoff_max_s: float = 30.0
    give_up_after_s: float = 300.0  # no call answered for this long: the server is down, the run stops
    temperature: float = 0.8
    max_tokens: int = 512
    seed: int | None = None  # if set, each call sends a seed derived from (seed, sample_index)
    cache_dir: str | None = None  # on-disk response cache; None = off


_Parsed = tuple[str, str | None, int, int, list[dict[str, float]] | None]  # text, finish, in, out, top


class _LoopbackTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive on asyncio streams, for a server on this machine.

    httpcore and h11 cost about 1 ms of CPU per request (a pool probe, event
    objects, header validation per hop); this costs about 0.1 ms, which on a
    loopback server is most of what a call costs the loop. Plain HTTP only, one
    request per connection at a time; idle connections are kept in a list, so a
    pool of hundreds costs nothing per request. A connection the server has
    closed while idle is dropped before reuse, never written to; any other
    failure is raised as httpx's own error, so the openai client maps it (and
    :meth:`LLMClient._attempt` retries it) exactly as with its default transport.
    """

    def __init__(self) -> None:
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
        head += [b"%s: %s\r\n" % kv for kv in request.headers.raw]
        payload = b"".join(head) + b"\r\n" + body
        reader, writer = await self._connection(request)
        try:
            writer.write(payload)
            status, headers, content, keep = await self._response(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            writer.close()
            raise httpx2.ReadError(f"{type(err).__name__}: {err}", request=request) from err
        except BaseException:  # cancelled (the per-attempt timeout): the reply may still come, drop it
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return httpx2.Response(status, headers=headers, content=content, request=request)

    async def _connection(self, request: httpx2.Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not (reader.at_eof() or writer.is_closing()):
                return reader, writer
            writer.close()
        try:
            return await asyncio.open_connection(request.url.host, request.url.port or 80)
        except OSError as err:
            raise httpx2.ConnectError(f"{type(err).__name__}: {err}", request=request) from err

    @staticmethod
    async def _response(reader: asyncio.StreamReader) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        """Status, headers, body, and whether the connection may be reused."""
        lines = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
        version, code = lines[0].split(b" ", 2)[:2]
        headers = [(k.strip(), v.strip()) for k, v in (line.split(b":", 1) for line in lines[1:])]
        fields = {k.lower(): v.lower() for k, v in headers}
        if b"content-length" in fields:
            content = await reader.readexactly(int(fields[b"content-length"]))
        elif fields.get(b"transfer-encoding") == b"chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append((await reader.readexactly(size + 2))[:-2])
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                pass
            content = b"".join(parts)
        else:  # the body ends when the server closes
            return int(code), headers, await reader.read(), False
        return int(code), headers, content, version == b"HTTP/1.1" and fields.get(b"connection") != b"close"

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


class _LoopbackHTTP(httpx2.AsyncClient):
    """httpx's client sending straight to :class:`_LoopbackTransport`.

    ``AsyncClient.send`` runs per request an auth flow, a redirect loop, cookie
    extraction and timeout bookkeeping, none of which a loopback chat call uses
    (openai sets its own auth header; the per-attempt timeout is
    ``LLMClient._attempt``'s): a quarter of what the client side of a call cost. A
    redirect, which chat servers do not send, still goes through httpx's own path.
    """

    def __init__(self) -> None:
        self._loopback = _LoopbackTransport()
        super().__init__(transport=self._loopback, follow_redirects=True)

    async def send(self, request: httpx2.Request, *, stream: bool = False, **kwargs: Any) -> httpx2.Response:
        response = await self._loopback.handle_async_request(request)
        if response.has_redirect_location:
            return await super().send(request, stream=stream, **kwargs)
        return response


class _LoopbackOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` that builds :class:`LLMClient`'s chat requests from a kept one.

    openai builds every request from scratch (default headers merged and validated,
    the URL parsed and joined to the base URL, then httpx's Request, URL and
    Headers objects): half of what a call cost the loop. Those calls differ only
    in their JSON body, so the first one per (method, path, retry count) is built
    by openai and kept, and later ones are that request with their own body;
    ``request()`` (options, error mapping, status errors) runs as always. A
    request with options of its own (headers, query, files, raw content, extra
    JSON, a timeout) is built by openai as usual.
    """

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._kept: dict[tuple[str, str, int], tuple[httpx2.Request, list[tuple[bytes, bytes]]]] = {}

    @property
    def user_agent(self) -> str:
        """openai's (it names the client's class)."""
        return super().user_agent.replace(type(self).__name__, openai.AsyncOpenAI.__name__, 1)

    def _build_request(self, options: Any, *, retries_taken: int = 0) -> httpx2.Request:
        if (
            options.headers
            or options.params
            or options.files is not None
            or options.content is not None
            or options.extra_json
            or not isinstance(options.json_data, dict)
            or not isinstance(options.timeout, openai.NotGiven)
        ):
            return super()._build_request(options, retries_taken=retries_taken)
        key = (options.method, options.url, retries_taken)
        if key not in self._kept:
            first = super()._build_request(options, retries_taken=retries_taken)
            self._kept[key] = first, [(k, v) for k, v in first.headers.raw if k.lower() != b"content-length"]
        kept, headers = self._kept[key]
        body = json.dumps(
            options.json_data, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
        # (A stream, not content=: httpx would then re-derive the content headers, which is most of its cost.)
        return httpx2.Request(
            kept.method,
            kept.url,
            headers=[*headers, (b"Content-Length", b"%d" % len(body))],
            stream=httpx2.ByteStream(body),
            extensions=kept.extensions,
        )


class _Retryable(Exception):
    """An attempt that failed in a way worth retrying; ``cause`` ends up in the final message."""

    def __init__(self, kind: str, cause: str, retry_after: float | None = None):
        super().__init__(cause)
        self.kind, self.cause, self.retry_after = kind, cause, retry_after


def _one_line(s: object, limit: int = 160) -> str:
    text = " ".join(str(s).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _derived_seed(seed: int, sample_index: int) -> int:
    """A per-sample seed, stable across runs and platforms, in the int32 range servers accept."""
    digest = hashlib.sha256(f"{seed}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


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


class LLMClient:
    """Chat completions with a concurrency limit, retries, a token/cost ledger and a cache."""

    def __init__(self, settings: LLMSettings):
        if not settings.models:
            raise LLMError("llm: no models configured (set llm.models)")
        if settings.api_key_env is None:
            key = _DUMMY_KEY
        else:
            key = os.environ.get(settings.api_key_env, "")
            if not key:
                raise LLMError(
                    f"llm: env var {settings.api_key_env} is not set (export it or set llm.api_key_env)"
                )
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
        # The client's own timeout is a backstop; asyncio.timeout below is the per-attempt limit
        # (it also catches a server that trickles bytes and never trips a read timeout).
        # Remote endpoints keep openai's own HTTP client (TLS, HTTP/2, proxy env vars).
        url = urlsplit(settings.base_url)
        options = dict(
            base_url=settings.base_url, api_key=key, max_retries=0, timeout=settings.timeout_s + 1.0
        )
        if url.hostname in _LOOPBACK and url.scheme == "http":
            self._client: openai.AsyncOpenAI = _LoopbackOpenAI(**options, http_client=_LoopbackHTTP())
        else:
            self._client = openai.AsyncOpenAI(**options)
        self._chat = FinalRequestOptions.construct(
            method="post", url="/chat/completions", json_data=None, content=None, files=None
        )
        self._cache = Path(settings.cache_dir) if settings.cache_dir else None

    def __repr__(self) -> str:
        names = ",".join(self._models)
        return f"LLMClient(base_url={self.settings.base_url!r}, models={names!r}, key_env={self.settings.api_key_env!r})"

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
                    f"llm: model {model!r} is not in llm.models (add it there or pick one of {list(self._models)})"
                )
            )
        request: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": s.temperature if temperature is None else temperature,
            "max_tokens": s.max_tokens if max_tokens is None else max_tokens,
        }
        if stop is not None:
            request["stop"] = stop
        if logprobs:  # only when asked, so existing cache keys stay valid
            request["logprobs"] = True
            if top_logprobs is not None:
                request["top_logprobs"] = top_logprobs
        if s.seed is not None:
            request["seed"] = _derived_seed(s.seed, sample_index)
        key = (
            None
            if self._cache is None
            else hashlib.sha256(
                _canonical({**request, "stop": stop, "seed": s.seed, "sample_index": sample_index}).encode()
            ).hexdigest()
        )

        ledgers = [self.ledger] + [t for t in (current_tally(),) if t is not None]
        hit = self._cache_get(key)
        if hit is not None:
            for ledger in ledgers:
                ledger.add(hit, role)
            return hit
        if self.down is not None:
            raise LLMDown(self.down)

        t0 = time.perf_counter()
        async with self._sem:
            try:
                text, finish, t_in, t_out, top = await self._with_retries(request, role, ledgers)
            except LLMError:
                for ledger in ledgers:
                    ledger.fail(role, model)
                raise
        result = Completion(
            text=text,
            model=model,
            tokens_in=t_in,
            tokens_out=t_out,
            cost=(t_in * spec.price_in + t_out * spec.price_out) / 1e6,
            cached=False,
            finish_reason=finish,
            seconds=time.perf_counter() - t0,
            top_logprobs=top,
        )
        self._cache_put(key, result)
        for ledger in ledgers:
            ledger.add(result, role)
        return result

    async def aclose(self) -> None:
        await self._client.close()

    # -- network -------------------------------------------------------------------------------

    def _fall(self, err: LLMDown) -> LLMDown:
        """Marks the client down (the first reason wins) and returns ``err`` to raise."""
        if self.down is None:
            self.down = str(err)
        return err

    async def _with_retries(self, request: dict, role: str, ledgers: list[Ledger]) -> _Parsed:
        """Attempts until one answers; a failure after ``max_retries`` fails the call, and
        one that finds no answer for ``give_up_after_s`` (this call's or any other's) fails them all."""
        s = self.settings
        attempt = 0
        if self._answered_at is None:
            self._answered_at = time.monotonic()
        while True:
            try:
                parsed = await self._attempt(request)
                self._answered_at = time.monotonic()
                return parsed
            except _Retryable as err:
                if self.down is not None:
                    raise LLMDown(self.down) from None
                quiet = time.monotonic() - self._answered_at
                if quiet >= s.give_up_after_s:
                    raise self._fall(
                        LLMDown(
                            f"llm: {s.base_url} answered no call for {quiet:.0f}s (last: {err.cause}) "
                            "(is the server running? raise llm.give_up_after_s to wait longer)"
                        )
                    ) from None
                if attempt >= s.max_retries:
                    raise CallFailed(self._give_up_message(err, attempt)) from None
                attempt += 1
                for ledger in ledgers:
                    ledger.retry(role, request["model"])
                delay = self._jitter.uniform(0.0, min(s.backoff_max_s, s.backoff_s * 2 ** (attempt - 1)))
                if err.retry_after is not None:
                    delay = max(delay, min(err.retry_after, s.backoff_max_s))
                log.debug("llm: retry %d/%d after %s in %.2fs", attempt, s.max_retries, err.cause, delay)
                await asyncio.sleep(delay)

    async def _attempt(self, request: dict) -> _Parsed:
        """One HTTP round trip; retryable failures become ``_Retryable``, the rest ``LLMError``."""
        s = self.settings
        self.ledger.in_flight += 1
        try:
            async with asyncio.timeout(s.timeout_s):
                # The raw endpoint (openai's documented way to skip its typed-params transform,
                # which costs more CPU than the rest of the call): we parse and check the body.
                # ``post()`` with the options copied from a kept one (``post`` builds them anew: ~70 us).
                raw = await self._client.request(
                    httpx2.Response, self._chat.model_copy(update={"json_data": request})
                )
                body = raw.content
        except (TimeoutError, openai.APITimeoutError):
            raise _Retryable("timeout", f"no answer within {s.timeout_s:g}s") from None
        except openai.APIConnectionError as err:
            raise _Retryable("connect", type(err.__cause__ or err).__name__) from None
        except openai.APIStatusError as err:
            code = err.status_code
            if code in _RETRY_STATUS or code >= 500:
                after = err.response.headers.get("retry-after")
                try:
                    retry_after = float(after) if after else None
                except ValueError:
                    retry_after = None
                raise _Retryable("status", f"HTTP {code}", retry_after) from None
            message = self._status_message(code, request["model"], err)
            if code in _FATAL_STATUS:
                raise self._fall(LLMDown(message)) from None
            raise CallFailed(message) from None
        finally:
            self.ledger.in_flight -= 1
        return self._parse(body, request)

    def _parse(self, body: bytes, request: dict) -> _Parsed:
        """Pull text, finish reason and token counts out of a reply, or say why it is malformed."""
        try:
            data = json.loads(body)
        except ValueError:
            raise _Retryable("malformed", "body is not JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise _Retryable("malformed", "no 'choices' list")
        if not data["choices"]:
            raise _Retryable("malformed", "empty 'choices'")
        choice = data["choices"][0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise _Retryable("malformed", "no message content")
        text = message["content"]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        t_in = usage.get("prompt_tokens")
        t_out = usage.get("completion_tokens")
        # Some servers omit usage; estimate ~4 chars/token so budgets still move.
        if not isinstance(t_in, int):
            t_in = _estimate_tokens("".join(str(m.get("content", "")) for m in request["messages"]))
        if not isinstance(t_out, int):
            t_out = _estimate_tokens(text)
        top = _top_logprobs(choice.get("logprobs")) if request.get("logprobs") else None
        return text, choice.get("finish_reason"), t_in, t_out, top

    def _give_up_message(self, err: _Retryable, attempts: int) -> str:
        url, n = self.settings.base_url, f"after {attempts} retries"
        if err.kind == "connect":
            return f"llm: {url} unreachable {n} ({err.cause}) (is the server running? check llm.base_url)"
        if err.kind == "timeout":
            return f"llm: {url} timed out {n} ({err.cause}) (raise llm.timeout_s or lower llm.max_tokens)"
        if err.kind == "malformed":
            return (
                f"llm: {url} sent malformed replies {n} ({err.cause}) "
                "(is llm.base_url an OpenAI-compatible /v1 endpoint?)"
            )
        if err.cause == "HTTP 429":
            return f"llm: {url} rate-limited {n} (HTTP 429) (lower llm.concurrency or raise llm.max_retries)"
        return f"llm: {url} failed {n} ({err.cause}) (check the server's log; raise llm.max_retries if it is flaky)"

    def _status_message(self, code: int, model: str, err: openai.APIStatusError) -> str:
        url = self.settings.base_url
        detail = _one_line(err.message.removeprefix(f"Error code: {code} - "))
        if code in (401, 403):
            env = self.settings.api_key_env
            where = f"the key in env var {env}" if env else "llm.api_key_env: the server wants a key"
            return f"llm: {url} refused the API key (HTTP {code}: {detail}) (check {where})"
        if code == 404:
            return (
                f"llm: {url} answered HTTP 404 for model {model!r} ({detail}) "
                "(check llm.models names and that llm.base_url ends in /v1)"
            )
        return f"llm: {url} rejected the request (HTTP {code}: {detail}) (check llm.max_tokens and the prompt length)"

    # -- cache ---------------------------------------------------------------------------------

    def _cache_path(self, key: str) -> Path:
        assert self._cache is not None
        return self._cache / key[:2] / f"{key}.json"

    def _cache_get(self, key: str | None) -> Completion | None:
        if key is None:  # no cache
            return None
        try:
            return Completion(**{**json.loads(self._cache_path(key).read_text()), "cached": True})
        except (OSError, ValueError, TypeError):  # missing or unreadable entry: a miss, rewritten later
            return None

    def _cache_put(self, key: str | None, c: Completion) -> None:
        """Write atomically (temp file in the same folder, then rename) so readers never see half a file."""
        if key is None:
            return
        path = self._cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dataclasses.asdict(c), f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
