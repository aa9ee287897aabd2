"""A run's model calls on both ends of its pipes: the child's ``llm`` and the worker's relay.

In the child, the entry's ``llm`` (``ModelCalls``) writes each call as a frame on a
call pipe and blocks on an answer pipe. In the worker, ``CallChannel`` numbers the
calls, forwards them to the host (``CALL`` frames), and passes the host's ``ANSWER``
frames back without ever blocking on the child; the host answers (model, budget). A
malformed or oversized call, or a child that does not read its answers, ends the run.
Nothing here calls a model or knows the budget.

Standard library only (the worker runs it under ``python -I``; see ``worker.py``).
"""

import fcntl
import json
import os
import threading

from .protocol import (
    ANSWER,
    CALL,
    CHUNK,
    HEADER,
    ModelCallError,
    answer_of,
    exception_line,
    one_line,
    pack,
    read_frame,
    take_frame,
    write_all,
)

MAX_PENDING = 32  # calls forwarded but not answered, at most; then the call pipe waits (backpressure)
ANSWER_PIPE_BYTES = 1 << 20  # the answer pipe's buffer: answers are written without blocking


class ModelCalls:
    """``llm(messages, **sampling) -> str``: the evaluation's model, answered by the host.

    ``messages`` is a str (one user message) or a list of ``{"role", "content"}`` dicts
    (roles system, user, assistant); ``sampling`` may hold ``temperature``,
    ``max_tokens``, ``stop``, ``model`` (one of the run's models) and ``top_logprobs``
    (1..20: then the answer is ``{"text", "top_logprobs"}``). Returns the answer's text;
    raises ``ModelCallError``
    (also ``llm.Error``) with the host's one-line reason when the call is refused (the
    budget is spent, the time is up, the request is invalid) or fails. Threads may call
    it at once; forked children share its pipes and should not.

    ``item``: the task item being answered (an int or a short str; None: not said). A
    task's entry sets it before each item, and the host's trace records it with each call,
    so what an agent did can be read back per item (``qd export --kind trajectory``).
    """

    Error = ModelCallError

    def __init__(self, call_fd: int, answer_fd: int):
        self.call_fd, self.answer_fd = call_fd, answer_fd
        self._send = threading.Lock()  # one frame at a time on the call pipe
        self._cond = threading.Condition(threading.Lock())
        self._sent = 0  # the worker numbers calls in the order they arrive: so do we
        self._answers: dict = {}  # n -> answer, read by whichever thread was reading
        self._reading = False
        self._broken = None
        self.item = None

    def __repr__(self) -> str:
        return (
            "<llm(messages, temperature=, max_tokens=, stop=, model=, top_logprobs=) -> str: "
            "the run's model, via the host>"
        )

    def __call__(self, messages, **sampling) -> str:
        try:
            item = {} if self.item is None else {"item": self.item}
            body = json.dumps({"messages": messages, "sampling": sampling, **item}).encode()
        except (TypeError, ValueError) as e:
            raise ModelCallError(
                f"llm: request is not JSON: {exception_line(e)} (pass str messages and plain numbers)"
            ) from None
        with self._send:
            n, self._sent = self._sent, self._sent + 1
            try:
                write_all(self.call_fd, pack(CALL, 0, body))
            except OSError as e:
                raise ModelCallError(f"llm: the model channel is closed ({exception_line(e)})") from None
        answer = self._wait(n)
        if "error" in answer:
            raise ModelCallError(one_line(str(answer["error"]), 1000))
        return answer_of(answer)

    def _wait(self, n: int) -> dict:
        """Answer ``n``: one thread at a time reads the pipe and files what it reads."""
        with self._cond:
            while n not in self._answers:
                if self._broken:
                    raise ModelCallError(self._broken)
                if self._reading:
                    self._cond.wait()
                    continue
                self._reading = True
                self._cond.release()
                try:
                    frame = read_frame(self.answer_fd)
                    answer = json.loads(frame[2]) if frame is not None else None
                except (OSError, ValueError):
                    frame = answer = None
                finally:
                    self._cond.acquire()
                    self._reading = False
                    self._cond.notify_all()
                if not isinstance(answer, dict) or not isinstance(answer.get("n"), int):
                    self._broken = "llm: the model channel is closed (the evaluation is ending)"
                else:
                    self._answers[answer["n"]] = answer
            return self._answers.pop(n)


def _shallow(obj, depth: int) -> bool:
    """Nested at most ``depth`` deep (a valid call is 3 deep; a deep one could not be decoded on
    the host, whose stack is deeper than the worker's)."""
    if isinstance(obj, (list, dict)):
        return depth > 0 and all(
            _shallow(v, depth - 1) for v in (obj.values() if isinstance(obj, dict) else obj)
        )
    return True


class CallChannel:
    """The worker's side of one run's model calls: frames from the child's call pipe go to
    the host, numbered; the host's answers go to the child's answer pipe, never blocking.

    Each method returns None, or the reason to kill the run (one line)."""

    def __init__(self, call_r: int, answer_w: int, run_id: int, wfd: int, cap_mb: int):
        """``call_r``, ``answer_w``: the worker's ends of the child's call and answer pipes;
        ``wfd``: the pipe to the host."""
        self.fd, self.answer_w, self.run_id, self.wfd = call_r, answer_w, run_id, wfd
        self.cap_mb = cap_mb
        self.inbox = bytearray()
        self.n = 0  # the next call's number: assigned here, never taken from the child
        self.pending = 0  # forwarded, not yet answered
        self.open = True  # False once the pipe is at EOF or the run is being killed
        self.final = None  # the error for every further call (budget spent, time up): answered here
        try:  # room for every answer a well-behaved agent has not read yet
            fcntl.fcntl(self.answer_w, fcntl.F_SETPIPE_SZ, ANSWER_PIPE_BYTES)
        except OSError:
            pass
        os.set_blocking(self.answer_w, False)

    def readable(self):
        """Read from the call pipe; forward every complete call."""
        data = os.read(self.fd, CHUNK)
        if not data:
            self.open = False
            return None
        self.inbox += data
        while len(self.inbox) >= HEADER.size:
            kind, _, size = HEADER.unpack_from(self.inbox)
            if kind != CALL:
                return "malformed model call"
            if size > self.cap_mb << 20:
                return f"model call too large (> {self.cap_mb} MB)"
            if (taken := take_frame(self.inbox)) is None:
                break
            try:
                call = json.loads(taken[2])
                if not (
                    isinstance(call, dict)
                    and call.keys() - {"item"} == {"messages", "sampling"}
                    and isinstance(call["sampling"], dict)
                    and _shallow(call, 8)
                ):
                    return "malformed model call"
                frame = None if self.final is not None else json.dumps({"n": self.n, **call}).encode()
            except Exception:  # not JSON, too deep (RecursionError), ...
                return "malformed model call"
            if frame is None:  # the host has said no to every further call: it never sees them
                if why := self._to_child(json.dumps({"n": self.n, "error": self.final}).encode()):
                    return why
            else:
                write_all(self.wfd, pack(CALL, self.run_id, frame))
                self.pending += 1
            self.n += 1
        return None

    def answer(self, body: bytes, final: bool = False):
        """Hand the host's answer to the child; a final one also answers every later call."""
        self.pending -= 1
        if final:
            self.final = json.loads(body)["error"]
        return self._to_child(body)

    def _to_child(self, body: bytes):
        """Write an answer on the answer pipe, all of it at once or not at all."""
        data = pack(ANSWER, self.run_id, body)
        try:
            written = os.write(self.answer_w, data)
        except BlockingIOError:
            written = 0
        except OSError:  # no reader left (the child is gone): nobody to answer
            return None
        return None if written == len(data) else "agent does not read its model answers"
