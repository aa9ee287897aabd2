"""The sandbox's frame protocol, defined once for the host (``pool``) and the worker.

The host and a worker talk in frames over the worker's stdin/stdout: a header (kind,
run id, body length) and a JSON body. A run's child talks to its worker the same way
over its model-call pipes. This module is the only place the header and the kinds are
written, and the only place an answer frame is turned into what ``llm(...)`` gives its
caller (``answer_of``, ``ModelCallError``), whether the caller is an entry in the
sandbox or trusted host code (``qd.llm.gateway``).

Standard library only, and no import of its siblings: the worker loads it under
``python -I`` without ``qd`` (see ``worker.py``), and the host imports it as
``qd.sandbox.protocol``.
"""

import json
import os
import struct

HEADER = struct.Struct(">cQI")  # kind, run id, body length
CHUNK = 1 << 16  # bytes per read of a pipe

# Frames from the host: the init (the first frame), a run, a run whose entry gets ``llm``,
# a cancel, the answer to a model call ({"n", "text"} or {"n", "error"}), and a final answer
# ({"n", "error"}: the same error for every later call of the run, answered by the worker).
INIT, RUN, RUN_CALLS, CANCEL, ANSWER, FINAL = b"I", b"R", b"M", b"C", b"A", b"F"
# Frames to the host: the hello, a run's reply, a model call ({"n", "messages", "sampling"}).
# A child writes CALL frames ({"messages", "sampling"}, run id 0) on its call pipe; its worker
# writes the host's ANSWER frames, as they came, on its answer pipe.
HELLO, REPLY, CALL = b"H", b"R", b"L"


def pack(kind: bytes, run_id: int, body: bytes) -> bytes:
    """One frame: ``body`` (JSON already encoded) behind its header."""
    return HEADER.pack(kind, run_id, len(body)) + body


def encode(kind: bytes, run_id: int, obj) -> bytes:
    """One frame: ``obj`` as JSON behind its header."""
    return pack(kind, run_id, json.dumps(obj).encode())


def take_frame(buf: bytearray):
    """The first frame in ``buf`` as (kind, run id, body), removed from it; None while it is
    incomplete (a non-blocking reader appends what it reads and takes frames out)."""
    if len(buf) < HEADER.size:
        return None
    kind, run_id, size = HEADER.unpack_from(buf)
    end = HEADER.size + size
    if len(buf) < end:
        return None
    body = bytes(buf[HEADER.size : end])
    del buf[:end]
    return kind, run_id, body


def read_frame(fd: int):
    """Next frame from the blocking ``fd`` as (kind, run id, body), or None at EOF."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    kind, run_id, size = HEADER.unpack(head)
    body = read_exact(fd, size)
    return None if body is None else (kind, run_id, body)


def read_exact(fd: int, n: int):
    """``n`` bytes from ``fd``, or None at EOF before them."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the blocking ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, kind: bytes, run_id: int, obj) -> None:
    write_all(fd, encode(kind, run_id, obj))


def pack_reply(run_id: int, message: dict, result: bytes = b"") -> bytes:
    """A run's REPLY frame: ``message`` as JSON, then a newline and the child's result as the
    child wrote it. The worker forwards a result without reading it (decoding the values and
    encoding them again wrote 36 of the ~232 pages it writes per run, now 9: each page is a
    fault while the next child lives); the host, which decodes them anyway, judges it:
    :func:`read_reply`."""
    return pack(REPLY, run_id, json.dumps(message).encode() + (b"\n" + result if result else b""))


def read_reply(body: bytes) -> dict:
    """The message of a REPLY frame's body, with the verdict on its forwarded result, if any."""
    head, _, result = body.partition(b"\n")  # (JSON text from json.dumps holds no raw newline)
    message = json.loads(head)
    if result:
        message.update(result_verdict(result))
    return message


def result_verdict(result: bytes) -> dict:
    """ok/value/error from what a child that exited cleanly wrote on its result pipe."""
    try:
        envelope = json.loads(result)
    except ValueError as e:
        return {"error": f"result is not JSON: {exception_line(e)}"}
    if isinstance(envelope, dict) and isinstance(envelope.get("values"), list) and envelope["values"]:
        values, error = envelope["values"], envelope.get("error")  # one visit, several stages' calls
        later = {"then": values[1:], "then_error": None if error is None else one_line(str(error))}
        return {"ok": True, "value": values[0], **later}
    if not isinstance(envelope, dict) or len(envelope) != 1 or not {"value", "error"} & envelope.keys():
        return {"error": "result is not JSON: not a result envelope (was the result pipe written to?)"}
    if "error" in envelope:
        return {"error": one_line(str(envelope["error"]))}
    return {"ok": True, "value": envelope["value"]}


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line, at most ``limit`` characters: errors cross the pipes as one line."""
    return " ".join(text.split())[:limit]


def exception_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (just the type when its message will not print)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return one_line(text)


HARNESS = "harness: "  # starts the error of an evaluation that failed outside the candidate's own code


def harness_failure(error: str | None) -> bool:
    """Whether ``error`` is an evaluation's failure outside the candidate's own code (its entry,
    the evaluator, their imports, the task's scoring): a broken harness, not a bad candidate."""
    return error is not None and error.startswith(HARNESS)


def raised_by_candidate(exc: BaseException, cwd: str) -> bool:
    """Whether the candidate is to blame for ``exc``, raised by the entry it was handed to.

    The candidate's code is what the entry compiled from its text (a file name that is not an
    absolute path: ``candidate.py``, ``<string>``) or wrote under the run's working directory
    ``cwd`` (``program.py``). It is to blame when its text does not parse (a ``SyntaxError`` in such
    a file), when one of its frames is on the traceback, or when the entry function raised the
    error itself, in its own frame (its verdict on the candidate: "defines no function f"), an
    ``ImportError`` apart. Anything else (an import the entry or the evaluator makes, their own
    bugs) is the harness's.
    """

    def candidates(filename: str | None) -> bool:
        name = filename or "<unknown>"
        inside = os.path.isabs(name) and os.path.commonpath([name, cwd]) == cwd
        return inside or not (os.path.isabs(name) or name.startswith("<frozen"))

    if isinstance(exc, SyntaxError):
        return candidates(exc.filename)
    entry = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # the entry's frame
    tb = entry
    while tb is not None:
        if candidates(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    return entry is not None and entry.tb_next is None and not isinstance(exc, ImportError)


class ModelCallError(RuntimeError):
    """A model call that did not succeed: refused by the evaluation's budget, invalid, failed
    on the host, or cut off because the evaluation is ending. The message is one line."""


def answer_of(answer: dict):
    """What ``llm(...)`` returns for a successful answer frame: the text, or with ``top_logprobs=``
    the dict ``{"text", "top_logprobs"}`` (per generated token, {token: logprob})."""
    if "top_logprobs" in answer:
        return {"text": answer["text"], "top_logprobs": answer["top_logprobs"]}
    return answer["text"]
