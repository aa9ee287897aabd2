"""A lean HTTP path to a chat server on this machine, for ``qd.llm.http.HTTPTransport``.

On a loopback server the client side of a call is most of what a call costs the
loop, and most of that is generic work a chat call does not need: httpcore's
connection pool and h11, httpx's per-request auth, redirect and cookie handling,
and openai building every request from scratch. These three classes skip each,
and fall back to the library's own path wherever a request is not the plain
chat call (a redirect, a request with options of its own).

This module is also the one place that knows which openai is installed, so
that qd works on every openai its floor allows: ``httpx`` is the HTTP library
openai is built on (httpx before openai 3, httpx2 from 3 on: one API under two
names), read from openai's public ``DefaultAsyncHttpxClient``; and
:func:`chat_endpoint` takes the request-building shortcut (openai's private
``FinalRequestOptions`` and ``_build_request``) only where this openai has
them, else the public ``client.post``. Both are decided once, at import.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from types import ModuleType
from typing import Any

import openai


def _openai_httpx() -> ModuleType:
    """The HTTP library under openai: the one whose ``AsyncClient`` its public client class extends."""
    for cls in openai.DefaultAsyncHttpxClient.__mro__:
        if cls.__name__ == "AsyncClient":
            return importlib.import_module(cls.__module__.partition(".")[0])
    raise ImportError(f"openai {openai.__version__}: its DefaultAsyncHttpxClient is no httpx AsyncClient")


def _request_options() -> Any:
    """openai's private ``FinalRequestOptions`` where this openai has all the shortcut uses, else None."""
    try:
        from openai._models import FinalRequestOptions
    except ImportError:
        return None
    used = (hasattr(FinalRequestOptions, name) for name in ("construct", "model_copy"))
    return FinalRequestOptions if all(used) and hasattr(openai.AsyncOpenAI, "_build_request") else None


httpx = _openai_httpx()
_OPTIONS = _request_options()


class LoopbackStreams(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive on asyncio streams, for a server on this machine.

    httpcore and h11 cost about 1 ms of CPU per request (a pool probe, event
    objects, header validation per hop); this costs about 0.1 ms, which on a
    loopback server is most of what a call costs the loop. Plain HTTP only, one
    request per connection at a time; idle connections are kept in a list, so a
    pool of hundreds costs nothing per request. A connection the server has
    closed while idle is dropped before reuse, never written to; any other
    failure is raised as httpx's own error, so the openai client maps it (and
    ``LLMClient`` retries it) exactly as with httpx's default transport.
    """

    def __init__(self) -> None:
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
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
            raise httpx.ReadError(f"{type(err).__name__}: {err}", request=request) from err
        except BaseException:  # cancelled (the per-attempt timeout): the reply may still come, drop it
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def _connection(self, request: httpx.Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not (reader.at_eof() or writer.is_closing()):
                return reader, writer
            writer.close()
        try:
            return await asyncio.open_connection(request.url.host, request.url.port or 80)
        except OSError as err:
            raise httpx.ConnectError(f"{type(err).__name__}: {err}", request=request) from err

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


class LoopbackHTTP(httpx.AsyncClient):
    """httpx's client sending straight to :class:`LoopbackStreams`.

    ``AsyncClient.send`` runs per request an auth flow, a redirect loop, cookie
    extraction and timeout bookkeeping, none of which a loopback chat call uses
    (openai sets its own auth header; the per-attempt timeout is
    ``LLMClient``'s): a quarter of what the client side of a call cost. A
    redirect, which chat servers do not send, still goes through httpx's own path.
    """

    def __init__(self) -> None:
        self._loopback = LoopbackStreams()
        super().__init__(transport=self._loopback, follow_redirects=True)

    async def send(self, request: httpx.Request, *, stream: bool = False, **kwargs: Any) -> httpx.Response:
        response = await self._loopback.handle_async_request(request)
        if response.has_redirect_location:
            return await super().send(request, stream=stream, **kwargs)
        return response


class LoopbackOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` that builds chat requests from a kept one.

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
        self._kept: dict[tuple[str, str, int], tuple[httpx.Request, list[tuple[bytes, bytes]]]] = {}

    @property
    def user_agent(self) -> str:
        """openai's (it names the client's class)."""
        return super().user_agent.replace(type(self).__name__, openai.AsyncOpenAI.__name__, 1)

    def _build_request(self, options: Any, **kwargs: Any) -> httpx.Request:
        # (``kwargs``: ``retries_taken`` where this openai passes it, which goes into a header)
        if (
            options.headers
            or options.params
            or options.files is not None
            or getattr(options, "content", None) is not None  # (a field since openai 1.5x)
            or options.extra_json
            or not isinstance(options.json_data, dict)
            or not isinstance(options.timeout, openai.NotGiven)
        ):
            return super()._build_request(options, **kwargs)
        key = (options.method, options.url, kwargs.get("retries_taken", 0))
        if key not in self._kept:
            first = super()._build_request(options, **kwargs)
            self._kept[key] = first, [(k, v) for k, v in first.headers.raw if k.lower() != b"content-length"]
        kept, headers = self._kept[key]
        body = json.dumps(
            options.json_data, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
        # (A stream, not content=: httpx would then re-derive the content headers, which is most of its cost.)
        return httpx.Request(
            kept.method,
            kept.url,
            headers=[*headers, (b"Content-Length", b"%d" % len(body))],
            stream=httpx.ByteStream(body),
            extensions=kept.extensions,
        )


class ChatEndpoint:
    """``POST /chat/completions`` on an openai client, answered raw (``httpx.Response``).

    The raw endpoint is openai's documented way to skip its typed-params transform,
    which costs more CPU than the rest of the call (``HTTPTransport`` parses and
    checks the body itself). Where this openai has the private pieces, options are
    copied from kept ones (``post`` builds them anew: ~70 us); elsewhere ``post``.
    """

    def __init__(self, client: openai.AsyncOpenAI):
        self._client = client
        self._options = (
            None
            if _OPTIONS is None
            else _OPTIONS.construct(method="post", url="/chat/completions", json_data=None, files=None)
        )

    async def post(self, request: dict) -> httpx.Response:
        if self._options is None:
            return await self._client.post("/chat/completions", cast_to=httpx.Response, body=request)
        return await self._client.request(
            httpx.Response, self._options.model_copy(update={"json_data": request})
        )


def chat_client(loopback: bool, **options: Any) -> openai.AsyncOpenAI:
    """An openai client with ``options``; for a server on this machine (``loopback``), on the lean path."""
    if not loopback:
        return openai.AsyncOpenAI(**options)
    lean = LoopbackOpenAI if _OPTIONS is not None else openai.AsyncOpenAI
    return lean(**options, http_client=LoopbackHTTP())
