"""Runs untrusted, LLM-written code: pre-forked workers, one sandboxed fork per run.

Each worker process imports the entry module once; every run gets a fresh child
of it (own process group, rlimits, unprivileged uid, private /tmp, read-only
filesystem, no network where the kernel allows), forked and set up before its
request arrives, so a run costs a fork rather than a new interpreter, and waits
for little of it. The child runs ``function(text, **args)`` and sends back JSON.
What is and is not isolated: ``docs/sandbox.md``.

The host's side of a run is kept to one frame written and one read: a worker's
replies are read by a reader callback registered once, not per run.

A run may let its entry call a model (``run(..., calls=handler)``): the child's
calls travel over the worker's pipes to the host, where ``handler`` (e.g. a
``qd.llm.gateway.ModelGateway``) answers each in a task of its own, in the
caller's context; the child never reaches the network.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import dataclasses
import fcntl
import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from qd.sandbox.protocol import (
    ANSWER,
    CALL,
    CANCEL,
    FINAL,
    HELLO,
    INIT,
    RUN,
    RUN_CALLS,
    encode,
    one_line,
    pack,
    read_reply,
    take_frame,
)

_WORKER = Path(__file__).with_name("worker.py")
_UID_BASE, _UID_SPAN = 61000, 4000  # children of root run as uid/gid 61000 + n, one per worker
_UIDS = itertools.count()
_READ_BYTES = 1 << 16  # per read of the worker's replies: a larger buffer is a fresh mmap every time
_PIPE_BYTES = 1 << 20  # the request pipe's buffer (Linux allows this much without privileges)
_REPLY_GRACE_S = 10.0  # the worker enforces wall_s; the parent gives up this much later
_START_TIMEOUT_S = 120.0  # importing the entry (e.g. jax) may take a while


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-run limits; see docs/sandbox.md for how each is enforced."""

    wall_s: float = 10.0  # wall-clock timeout: kill the whole process tree
    cpu_s: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE (the private /tmp holds 4x this)
    nproc: int = 32  # process-count limit
    output_kb: int = 64  # stdout/stderr kept per stream (head + tail)
    output_cap_mb: int = 8  # printing (or returning) more than this kills the run
    network: bool = False  # False: no network (own empty network namespace where possible)


@dataclasses.dataclass
class SandboxResult:
    """What one run did. ``error`` is one line; ``stderr`` holds any traceback."""

    ok: bool
    value: Any
    error: str | None
    stdout: str
    stderr: str
    seconds: float
    then: list | None = None  # the values of ``run(..., then=...)``'s later calls, up to a failed one
    then_error: str | None = None  # that failed call's one-line reason (None: all ran)


def _failed(error: str, seconds: float = 0.0) -> SandboxResult:
    return SandboxResult(False, None, error, "", "", seconds)


Calls = Callable[[dict], Awaitable[dict]]
"""A run's model-call handler: ``{"n", "messages", "sampling"}`` -> ``{"text"}`` (with ``"top_logprobs"``
when asked) or ``{"error"}``
(with ``"final": True``: every later call of the run gets this error too, from the worker)."""


class _RunCalls:
    """One run's model calls on the host: its handler, the caller's context, the tasks answering."""

    __slots__ = ("handler", "context", "tasks")

    def __init__(self, handler: Calls, context: contextvars.Context):
        self.handler, self.context, self.tasks = handler, context, set()

    async def answer(self, body: bytes) -> tuple[bytes, dict]:
        """The answer frame's kind and body for the model call ``body``; a handler that fails, or
        gives no answer, answers with the error."""
        n, kind = None, ANSWER
        try:
            request = json.loads(body)
            n = request["n"]
            got = await self.handler(request)
            if isinstance(got, dict) and isinstance(got.get("text"), str) and "error" not in got:
                answer = {"n": n, "text": got["text"]}
                if isinstance(got.get("top_logprobs"), list):
                    answer["top_logprobs"] = got["top_logprobs"]
            elif isinstance(got, dict) and "error" in got:
                answer = {"n": n, "error": one_line(str(got["error"]))}
                kind = FINAL if got.get("final") is True else ANSWER
            else:
                answer = {"n": n, "error": "llm: the host's handler gave no answer (a bug on the host)"}
        except Exception as e:
            answer = {"n": n, "error": one_line(f"llm: the host failed: {type(e).__name__}: {e}")}
        return kind, answer

    def end(self) -> None:
        """The run is over: cancel what is still being answered (its answers would be dropped)."""
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()


def _check_entry(entry: str) -> str:
    """``entry`` with a file path made absolute; ValueError naming the fix if malformed."""
    usage = "write 'path/to/file.py:function' or 'package.module:function'"
    if not isinstance(entry, str) or ":" not in entry:
        raise ValueError(f"entry: {entry!r} names no function ({usage})")
    target, _, name = entry.rpartition(":")
    if not name.isidentifier():
        raise ValueError(f"entry: {name!r} is not a function name ({usage})")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"entry: no file {path} ({usage}, with an existing file)")
        return f"{path}:{name}"
    if not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"entry: {target!r} is neither a .py file nor a module name ({usage})")
    return entry


class _WorkerDied(Exception):
    """The worker process ended or stopped answering."""


class _Worker:
    """One worker process, the parent's non-blocking ends of its pipes, and the futures
    waiting for its frames (its hello, or the reply to a run id).

    One reader callback, registered on the running event loop for as long as the worker
    lives (not once per run), reads its frames and hands each to its future.
    """

    def __init__(self, init: dict):
        self.init = init
        self.calls: dict[int, _RunCalls] = {}  # runs in flight that take model calls, by run id
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.rfd, self.wfd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        self.buf, self.hello, self.ended = bytearray(), None, False
        self.out = bytearray()  # written to the worker's stdin when it has room, in order
        self.loop: asyncio.AbstractEventLoop | None = None  # the one whose reader reads rfd
        self.waiting: dict[Any, asyncio.Future] = {}  # HELLO or a run id
        os.write(self.wfd, encode(INIT, 0, self.init))
        try:  # room for any usual request, so that sending one never waits
            fcntl.fcntl(self.wfd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)

    def shut_input(self) -> None:
        """EOF for the worker: it kills the run in flight and exits."""
        if self.wfd >= 0:
            self._drop_output()
            self.proc.stdin.close()
            self.wfd = -1

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop the worker (EOF, then SIGKILL after ``wait_s``); whoever waits for it gets _WorkerDied."""
        self.shut_input()
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.rfd >= 0:
            self._unlisten()
            self.proc.stdout.close()
            self.rfd = -1
        self._fail(_WorkerDied("worker stopped"))

    def restart(self) -> None:
        self.stop()
        self.start()

    def _listen(self) -> asyncio.AbstractEventLoop:
        """The running loop, reading this worker's output (registered once per loop), and
        writing what is left of its input."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self._unlisten()
            loop.add_reader(self.rfd, self._readable)
            if self.out:
                loop.add_writer(self.wfd, self._flush)
            self.loop = loop
        return loop

    def _unlisten(self) -> None:
        """Unregister the reader (and writer); before the descriptor closes, or a new one with its
        number breaks it."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.rfd)
            if self.out:
                self.loop.remove_writer(self.wfd)
        self.loop = None

    def write(self, data: bytes) -> None:
        """Send ``data`` (whole frames) to the worker, after everything sent before it.

        The one way to the worker's stdin (requests, cancels, answers), so frames never
        interleave: written at once when nothing is pending, else queued and written by a
        writer callback as the pipe empties. Never blocks; a worker that is gone drops it
        (and whoever waits for it gets ``_WorkerDied``)."""
        if self.wfd < 0 or self.ended:
            return
        if not self.out:
            try:
                n = os.write(self.wfd, data)
            except BlockingIOError:
                n = 0
            except OSError as e:
                self._broken(e)
                return
            if n == len(data):
                return
            data = memoryview(data)[n:]
            self._listen().add_writer(self.wfd, self._flush)
        self.out += data

    def _flush(self) -> None:
        try:
            n = os.write(self.wfd, self.out)
        except BlockingIOError:
            return
        except OSError as e:
            self._broken(e)
            return
        del self.out[:n]
        if not self.out and self.loop is not None:
            self.loop.remove_writer(self.wfd)

    def _drop_output(self) -> None:
        if self.out and self.loop is not None and not self.loop.is_closed():
            self.loop.remove_writer(self.wfd)
        self.out.clear()

    def _broken(self, e: OSError) -> None:
        """Writing failed (the worker is gone): nothing more is sent, its waiters fail."""
        self._drop_output()
        self.ended = True
        self._fail(_WorkerDied(str(e)))

    def _readable(self) -> None:
        try:
            self._read()
        except _WorkerDied as e:
            self._unlisten()
            self._fail(e)

    def _fail(self, error: _WorkerDied) -> None:
        for fut in self.waiting.values():
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_exception(error)
        self.waiting.clear()

    def _read(self) -> bool:
        """Read what is there and hand out the frames complete; False when nothing is ready yet."""
        try:
            chunk = os.read(self.rfd, _READ_BYTES)
        except BlockingIOError:
            return False
        except OSError as e:
            raise _WorkerDied(str(e)) from None
        if not chunk:
            self.ended = True
            raise _WorkerDied("worker exited")
        self.buf += chunk
        while (frame := take_frame(self.buf)) is not None:
            kind, run_id, body = frame
            if kind == CALL:
                self._call(run_id, body)
                continue
            if kind == HELLO:
                self.hello, run_id = json.loads(body), HELLO
            fut = self.waiting.pop(run_id, None)  # none for a cancelled run
            if fut is not None and not fut.done():
                fut.set_result(body)
        return True

    def _call(self, run_id: int, body: bytes) -> None:
        """A model call of run ``run_id``: answered by a task of its own (none for a run that ended)."""
        run = self.calls.get(run_id)
        if run is None or self.loop is None:
            return
        task = self.loop.create_task(self._answer(run_id, run, body), context=run.context.copy())
        run.tasks.add(task)
        task.add_done_callback(run.tasks.discard)

    async def _answer(self, run_id: int, run: _RunCalls, body: bytes) -> None:
        """Ask the run's handler, send its answer (a late one, for a run that has ended, is dropped)."""
        kind, answer = await run.answer(body)
        if self.calls.get(run_id) is run:
            self.write(encode(kind, run_id, answer))

    async def _expect(self, key: Any) -> bytes:
        """The body of the next frame for ``key``."""
        if self.ended or self.rfd < 0:
            raise _WorkerDied("worker exited")
        fut = self.waiting[key] = self._listen().create_future()
        try:
            return await fut
        finally:
            if self.waiting.get(key) is fut:
                del self.waiting[key]

    async def reply(self, run_id: int) -> dict:
        return read_reply(await self._expect(run_id))

    def cancel(self, run_id: int) -> None:
        """Ask the worker to kill run ``run_id``; its late reply finds no one waiting."""
        self.write(pack(CANCEL, run_id, b""))

    def check_hello(self) -> dict:
        """The worker's report; ValueError when its entry cannot be used."""
        if "error" in self.hello:
            raise ValueError(self.hello["error"])
        return self.hello

    def no_hello(self, e: Exception) -> ValueError:
        """Why there is no hello. Not kept: the next run starts a fresh worker."""
        what = f"did not start within {_START_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError) else "exited"
        return ValueError(
            f"entry: the sandbox worker {what} while importing {self.init['entry']} (see its stderr)"
        )

    async def ready(self) -> None:
        """Wait for the worker's hello (its report, or why the entry cannot be used)."""
        if self.hello is None:
            try:
                async with asyncio.timeout(_START_TIMEOUT_S):
                    await self._expect(HELLO)
            except (_WorkerDied, TimeoutError) as e:
                self.stop()
                raise self.no_hello(e) from None
        self.check_hello()

    def ready_sync(self) -> None:
        """``ready`` for a caller outside the event loop."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while self.hello is None:
                if (
                    not self._read()
                    and not select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))[0]
                ):
                    raise TimeoutError
        except (_WorkerDied, TimeoutError) as e:
            self.stop()
            raise self.no_hello(e) from None
        self.check_hello()


_NO_ARGS: dict = {}  # one object for every run without args: one memo entry, not one per run


class _ArgsJSON:
    """The JSON of the args a caller passes run after run, encoded once.

    A cascade's stages pass the same points for every candidate (function_fit: 71
    floats), and encoding them is most of a request's encoding, which the event loop
    pays per run. A hit is the very object encoded before and still equal to a copy
    taken then (a caller may change its dict between runs: then it is encoded again).
    The copy is taken the second time an object comes, so args made fresh for each run
    (a Ray node's, unpickled per call) cost no more than their encoding. The memo holds
    what it encoded, so an id it keys on cannot be reused while it is there; it is
    emptied when full."""

    def __init__(self, size: int = 64):
        self._size = size
        self._memo: dict[int, tuple[dict, dict | None, str]] = {}

    def __call__(self, args: dict) -> str:
        hit = self._memo.get(id(args))
        seen = hit is not None and hit[0] is args
        if seen and hit[1] is not None and hit[1] == args:
            return hit[2]
        encoded = json.dumps(args)  # TypeError: the caller's
        if len(self._memo) >= self._size:
            self._memo.clear()
        self._memo[id(args)] = (args, copy.deepcopy(args) if seen else None, encoded)
        return encoded


class Sandbox:
    """Runs ``function(text, **args)`` from ``entry`` for untrusted ``text``, isolated.

    ``entry`` is ``"path/to/file.py:function"`` or ``"package.module:function"``
    (imported once per worker; it is trusted, the text is not). At most
    ``workers`` runs proceed at once; ``run`` never raises because of what the
    candidate does.
    """

    def __init__(self, entry: str, *, workers: int = 2, limits: Limits = Limits()):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: {workers!r} is not a positive integer (use workers >= 1)")
        self.entry, self.limits = _check_entry(entry), limits
        init = {
            "entry": self.entry,
            "sys_path": sys.path,
            "cwd": os.getcwd(),
            "limits": dataclasses.asdict(limits),
        }
        self._workers = [_Worker(dict(init, uid=_UID_BASE + next(_UIDS) % _UID_SPAN)) for _ in range(workers)]
        self._idle = list(self._workers)
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._closed = False
        self._ids = itertools.count()
        self._args_json = _ArgsJSON()

    runs_stages_together = True  # ``run`` takes ``then`` (``qd.evaluator.StagedEvaluator`` asks)

    async def run(
        self,
        text: str,
        args: dict | None = None,
        *,
        calls: Calls | None = None,
        then: list[dict] | None = None,
    ) -> SandboxResult:
        """Call the entry on ``text`` in a fresh sandboxed process and report what happened.

        ``calls``: the entry is called as ``function(text, llm=llm, **args)``, and each
        ``llm(messages, **sampling)`` in the child is answered on the host by ``await
        calls({"n", "messages", "sampling"})`` (``{"text": ...}`` or ``{"error": ...}``),
        in a task of its own that sees the caller's context variables; the tasks still
        running when the run ends are cancelled.

        ``then`` (no ``calls``): after a call that returned, the same process calls the entry
        again on each of these args, in order, until one fails: one fork, one process and one
        set of limits for a cascade's cheap stages (``Stage.same_visit``). Their values are
        the result's ``then``; a failed one's reason, ``then_error``."""
        run_id = next(self._ids)
        if then is not None and calls is not None:
            raise ValueError("then: later calls in one visit take no model calls (pass calls= or then=)")
        if calls is None:
            # The request's JSON, its args from the memo (its text is new every time).
            body = f'{{"text": {json.dumps(text)}, "args": {self._args_json(args or _NO_ARGS)}'
            if then is not None:
                body += f', "then": [{", ".join(self._args_json(a) for a in then)}]'
            request = pack(RUN, run_id, (body + "}").encode())
        else:
            if not callable(calls):
                raise TypeError(f"calls: {calls!r} is not callable (pass an async calls(request) -> dict)")
            if args and "llm" in args:
                raise ValueError("args: 'llm' is the model callable's name when calls= is given (rename it)")
            run_calls = _RunCalls(calls, contextvars.copy_context())
            request = encode(RUN_CALLS, run_id, {"text": text, "args": args or {}, "llm": True})
        worker = await self._acquire()
        if worker is None:
            return _failed("sandbox closed")
        try:
            if calls is None:
                return await self._run_on(worker, run_id, request)
            worker.calls[run_id] = run_calls
            try:
                return await self._run_on(worker, run_id, request)
            finally:
                worker.calls.pop(run_id, None)
                run_calls.end()
        finally:
            self._release(worker)

    async def _run_on(self, worker: _Worker, run_id: int, request: bytes) -> SandboxResult:
        start = time.monotonic()
        if worker.ended or worker.proc.poll() is not None:  # died while idle: replace it before using it
            worker.restart()
        sent = False
        try:
            await worker.ready()
            worker.write(request)  # queued behind anything unsent: never half-written, never waits
            sent = True
            async with asyncio.timeout(self.limits.wall_s + _REPLY_GRACE_S):
                return SandboxResult(**await worker.reply(run_id))
        except asyncio.CancelledError:
            if not self._closed and sent:
                worker.cancel(run_id)
            raise
        except (_WorkerDied, TimeoutError) as e:
            if self._closed:
                return _failed("sandbox closed", time.monotonic() - start)
            worker.restart()
            what = "stopped answering" if isinstance(e, TimeoutError) else "died"
            return _failed(f"sandbox worker {what} (restarted)", time.monotonic() - start)
        finally:
            if self._closed:
                worker.stop()

    async def _acquire(self) -> _Worker | None:
        if self._closed:
            return None
        if self._idle:
            return self._idle.pop()
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result() is not None:
                self._release(fut.result())
            raise

    def _release(self, worker: _Worker) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None if self._closed else worker)
                return
        self._idle.append(worker)

    def isolation(self) -> dict[str, bool]:
        """What isolation is in force here, as probed by the first worker (waits for it to start)."""
        worker = self._workers[0]
        if worker.hello is None and (worker.ended or worker.proc.poll() is not None):
            worker.restart()
        worker.ready_sync()
        return dict(worker.hello["isolation"])

    async def aclose(self) -> None:
        """Stop the workers (and whatever they run) without blocking the event loop."""
        self._shut()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in self._workers):
            await asyncio.sleep(0.01)
        self.close()

    def close(self) -> None:
        """Stop the workers and whatever they run; safe to call twice (from the loop's thread)."""
        self._shut()
        for worker in self._workers:
            worker.stop(wait_s=2.0)

    def _shut(self) -> None:
        self._closed = True
        for worker in self._workers:
            worker.shut_input()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
