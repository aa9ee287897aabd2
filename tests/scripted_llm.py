"""A scripted OpenAI-compatible chat server for tests and benchmarks (never a default for users).

Real HTTP/1.1 with keep-alive on loopback, written on asyncio streams and the
standard library only, so it is light enough for hundreds of concurrent requests
and starts fast in a fresh process. Rules map a regex on the prompt to a reply
or an injected fault; the first matching rule that still has uses left wins.

Run it in a background thread (``start()``, the test default: ``requests`` is
the live list) or in its own process (``start(in_process=True)``: its CPU does
not share the caller's GIL; rules must then be picklable, so a callable reply
must be a module-level function). ``stats()`` and ``requests`` work in both
modes. ``python tests/scripted_llm.py --port 8000 --latency 0.1`` serves the
default reply from the command line.

Providers' quirks (docs/providers.md) a rule reproduces: a reasoning model's
hidden text (``reasoning``, in the message field a provider uses or in none) and
its token count in each usage shape, an answer whose budget reasoning spent
(content empty, finish_reason ``length``), a null content, and extra response
headers such as a 429's Retry-After in each of its forms.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

FAULTS = (
    "429",
    "500",
    "hang",
    "truncate",
    "malformed_content",
    "empty_choices",
    "bad_json",
    "wrong_shape",
    "close_connection",
    "no_usage",
)  # any other three-digit string is answered as that HTTP status with an error body
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclasses.dataclass
class Rule:
    """Answer requests whose concatenated message contents match ``pattern`` ("" matches all)."""

    pattern: str
    # content to answer; a callable gets the request JSON; None: a null content
    reply: str | Callable[[dict], str] | None = ""
    fault: str | None = None  # None, one of FAULTS, or an HTTP status such as "401"
    times: int | None = None  # apply to the first N matching requests only, then fall through
    # per generated token {token: logprob} of the top alternatives, sent when a request asks for
    # logprobs (the highest is the sampled token; at most the request's top_logprobs are sent)
    logprobs: list[dict[str, float]] | None = None
    # faults taken in turn by successive matching requests (None: a valid reply), e.g.
    # ("429", "500", None): a flaky server; overrides ``fault``
    rotation: tuple[str | None, ...] = ()
    # a reasoning model's hidden text, spent before the reply out of the request's budget
    # (max_completion_tokens or max_tokens): a budget it exhausts leaves the content empty
    reasoning: str = ""
    # the message field that carries it (DeepSeek, llama.cpp, vLLM: reasoning_content; OpenRouter:
    # reasoning); None: not sent (OpenAI, Anthropic, Gemini send the count only)
    reasoning_field: str | None = "reasoning_content"
    # where usage counts it: "details" (completion_tokens_details.reasoning_tokens), "flat"
    # (usage.reasoning_tokens) or "none" (llama.cpp: the text only)
    reasoning_usage: str = "details"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)  # on this rule's answers

    def __post_init__(self) -> None:
        for fault in (self.fault, *self.rotation):
            if fault is not None and fault not in FAULTS and not re.fullmatch(r"\d{3}", fault):
                raise ValueError(f"unknown fault {fault!r}; one of {FAULTS} or an HTTP status")

    def fault_for(self, use: int) -> str | None:
        """The fault of this rule's ``use``-th matching request (0-based)."""
        return self.rotation[use % len(self.rotation)] if self.rotation else self.fault


def _tokens(text: str) -> int:
    """~4 characters per token, at least 1: deterministic and cheap."""
    return max(1, len(text) // 4)


def _logprobs(positions: list[dict[str, float]] | None, top: Any) -> dict | None:
    """The OpenAI (and llama.cpp) ``choices[0].logprobs`` shape; None as llama.cpp sends without data."""
    if positions is None:
        return None
    content = []
    for alternatives in positions:
        ranked = sorted(alternatives.items(), key=lambda kv: -kv[1])
        listed = [
            {"token": t, "logprob": lp, "bytes": None}
            for t, lp in ranked[: top if isinstance(top, int) else 0]
        ]
        token, lp = ranked[0]
        content.append({"token": token, "logprob": lp, "bytes": None, "top_logprobs": listed})
    return {"content": content, "refusal": None}


class _Server:
    """The asyncio side: HTTP parsing, rule matching, counters."""

    def __init__(self, rules: list[Rule], latency_s: float, default_reply: str, record: bool = True):
        self.rules, self.latency_s, self.default_reply = list(rules), latency_s, default_reply
        self.used = [0] * len(self.rules)
        self.requests: list[dict] = []
        self.record = record  # False: count requests but keep no bodies (long soak runs)
        self.count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task] = set()

    def stats(self) -> dict:
        return {"requests": self.count, "max_in_flight": self.max_in_flight, "in_flight": self.in_flight}

    def match(self, body: dict) -> tuple[Rule | None, str | None]:
        """The first rule with uses left that matches, and the fault it answers with."""
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        for i, rule in enumerate(self.rules):
            if (rule.times is None or self.used[i] < rule.times) and re.search(rule.pattern, prompt):
                self.used[i] += 1
                return rule, rule.fault_for(self.used[i] - 1)
        return None, None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                }
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                keep = headers.get("connection", "").lower() != "close"
                if not await self.route(method, path.split("?", 1)[0], raw, reader, writer):
                    return
                if not keep:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.writers.discard(writer)
            self.tasks.discard(task)
            writer.close()

    async def route(
        self, method: str, path: str, raw: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False closes the connection."""
        if method == "GET" and path == "/v1/models":
            return await self.send(
                writer, 200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
            )
        if method == "GET" and path == "/_stats":
            return await self.send(writer, 200, self.stats())
        if method == "GET" and path == "/_requests":
            return await self.send(writer, 200, self.requests)
        if method == "POST" and path == "/v1/chat/completions":
            body = json.loads(raw or b"{}")
            self.count += 1
            if self.record:
                self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self.chat(body, reader, writer)
            finally:
                self.in_flight -= 1
        return await self.send(writer, 404, {"error": {"message": f"no route {method} {path}"}})

    async def chat(self, body: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        rule, fault = self.match(body)
        if fault == "hang":
            await reader.read()  # until the client gives up and closes
            return False
        if fault == "close_connection":
            return False
        if fault == "bad_json":
            return await self.send(writer, 200, b'{"choices": [{"message": ')
        headers = rule.headers if rule is not None else {}
        if fault is not None and fault.isdigit():
            return await self.send(
                writer, int(fault), {"error": {"message": f"scripted {fault}", "code": fault}}, headers
            )
        if fault == "wrong_shape":
            return await self.send(writer, 200, {"result": {"text": "not a chat completion"}})

        if rule is None:
            text = self.default_reply
        else:
            text = rule.reply(body) if callable(rule.reply) else rule.reply
        finish = "stop"
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        reasoning = rule.reasoning if rule is not None else ""
        thought = _tokens(reasoning) if reasoning else 0
        if isinstance(limit, int) and thought >= limit:  # the budget went to reasoning
            reasoning, thought, finish = reasoning[: 4 * limit], limit, "length"
            text = None if text is None else ""
        elif isinstance(limit, int):
            limit -= thought
        if text is None:
            pass
        elif fault == "truncate":
            text, finish = text[: len(text) // 2], "length"
        elif isinstance(limit, int) and _tokens(text) > limit:
            text, finish = text[: 4 * limit], "length"  # as a real server cuts at max_tokens
        if fault == "malformed_content":
            text = "\x00<<garbled>> ]]} ```"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning and rule is not None and rule.reasoning_field is not None:
            message[rule.reasoning_field] = reasoning
        choices = (
            [] if fault == "empty_choices" else [{"index": 0, "message": message, "finish_reason": finish}]
        )
        if choices and body.get("logprobs"):
            choices[0]["logprobs"] = _logprobs(rule.logprobs if rule else None, body.get("top_logprobs"))
        prompt = "".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        reply: dict[str, Any] = {
            "id": f"chatcmpl-{self.count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": choices,
        }
        if fault != "no_usage":
            completion = (0 if text is None or (thought and not text) else _tokens(text)) + thought
            usage: dict[str, Any] = {
                "prompt_tokens": _tokens(prompt),
                "completion_tokens": completion,
                "total_tokens": _tokens(prompt) + completion,
            }
            shape = rule.reasoning_usage if rule is not None and thought else "none"
            if shape == "details":
                usage["completion_tokens_details"] = {"reasoning_tokens": thought}
            elif shape == "flat":
                usage["reasoning_tokens"] = thought
            reply["usage"] = usage
        return await self.send(writer, 200, reply, headers)

    @staticmethod
    async def send(
        writer: asyncio.StreamWriter, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> bool:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        return True


async def _serve(
    server: _Server, host: str, port: int, started: Callable[[int], None], stop: asyncio.Event
) -> None:
    srv = await asyncio.start_server(server.handle, host, port, backlog=1024)
    started(srv.sockets[0].getsockname()[1])
    async with srv:
        await stop.wait()
        srv.close()  # no new connections; handlers of those already accepted may still start
        for _ in range(3):  # let handlers finish so none is destroyed pending
            await asyncio.sleep(0)
            for w in list(server.writers):
                w.close()  # also ends handlers parked on "hang"
            if not server.tasks:
                break
            _, pending = await asyncio.wait(list(server.tasks), timeout=1.0)
            for t in pending:
                t.cancel()


def _process_main() -> None:
    """Entry point of the server process: config pickled on stdin, port printed, serve until stdin closes."""
    rules, latency_s, default_reply, host, *rest = pickle.load(sys.stdin.buffer)
    record = rest[0] if rest else True

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)  # EOF: the parent is done

        def started(port: int) -> None:
            print(port, flush=True)

        await _serve(_Server(rules, latency_s, default_reply, record), host, 0, started, stop)

    asyncio.run(main())


class ScriptedLLM:
    """An OpenAI-compatible server whose answers follow ``rules``; a context manager."""

    def __init__(
        self,
        rules: list[Rule] | tuple[Rule, ...] = (),
        *,
        latency_s: float = 0.0,
        default_reply: str = "...",
        host: str = "127.0.0.1",
        record: bool = True,
    ):
        self.rules, self.latency_s, self.default_reply, self.host = (
            list(rules),
            latency_s,
            default_reply,
            host,
        )
        self.record = record  # False: ``requests`` stays empty, ``stats()`` still counts (hour-long runs)
        self.base_url = ""
        self._server: _Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, *, in_process: bool = False) -> ScriptedLLM:
        """Serve from a background thread, or (``in_process=True``) from a separate process."""
        if in_process:
            # A plain subprocess rather than multiprocessing: the caller needs no __main__ guard.
            try:
                config = pickle.dumps(
                    (self.rules, self.latency_s, self.default_reply, self.host, self.record)
                )
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                raise TypeError(
                    f"in_process=True needs picklable rules (module-level reply functions): {err}"
                ) from None
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._proc = subprocess.Popen(
                [sys.executable, __file__, "--from-stdin"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(config)
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            if not line.strip().isdigit():
                self.stop()
                raise RuntimeError("scripted LLM process failed to start (its traceback is on stderr above)")
            port = int(line)
        else:
            ready = threading.Event()
            ports: list[int] = []
            self._server = _Server(self.rules, self.latency_s, self.default_reply, self.record)

            def run() -> None:
                self._loop = asyncio.new_event_loop()
                self._stop = asyncio.Event()

                def started(p: int) -> None:
                    ports.append(p)
                    ready.set()

                self._loop.run_until_complete(_serve(self._server, self.host, 0, started, self._stop))
                self._loop.close()

            self._thread = threading.Thread(target=run, name="scripted-llm", daemon=True)
            self._thread.start()
            if not ready.wait(30):
                raise RuntimeError("scripted LLM thread did not start within 30 s")
            port = ports[0]
        self.base_url = f"http://{self.host}:{port}/v1"
        return self

    def stop(self) -> None:
        """Shut down and wait for the thread or process; idempotent."""
        if self._thread is not None:
            assert self._loop is not None and self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
            self._thread = None
        if self._proc is not None:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + path, timeout=10) as r:
            return json.loads(r.read())

    @property
    def requests(self) -> list[dict]:
        """Chat request bodies received so far (the live list in thread mode, a snapshot otherwise)."""
        return self._server.requests if self._server is not None else self._get("/_requests")

    def stats(self) -> dict:
        """``{"requests": n, "max_in_flight": m, "in_flight": k}`` for chat requests."""
        return self._server.stats() if self._server is not None else self._get("/_stats")


if __name__ == "__main__" and sys.argv[1:] == ["--from-stdin"]:
    _process_main()
elif __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each chat answer")
    ap.add_argument("--reply", default="...", help="the content of every answer")
    args = ap.parse_args()
    print(f"scripted LLM on http://{args.host}:{args.port}/v1", flush=True)
    asyncio.run(
        _serve(_Server([], args.latency, args.reply), args.host, args.port, lambda p: None, asyncio.Event())
    )
