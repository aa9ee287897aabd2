"""The sandbox worker: imports the entry once, then forks one sandboxed child per run.

`qd.sandbox` starts it as ``python -I worker.py`` and talks to it in frames over
stdin/stdout: a header (kind, run id, length) and a body the worker never has to
decode on the way in (a request's JSON is parsed by the child it is meant for).
It imports only the standard library before the entry, so a fork copies little.
Where the kernel allows, the worker is pid 1 of its own PID namespace (inside a
user namespace when not root), with its own network and mount namespaces set up
once: creating them per run would cost more than the fork. After each run it
kills every other process in its PID namespace and empties its private /tmp and
/dev/shm, so nothing a candidate starts or writes outlives its run.

Each run's child is forked *before* its request arrives, right after the previous
run's clean-up, and sets itself up (process group, descriptors, rlimits) while the
worker waits: a request then costs little more than the entry call and the exit.
The fork (the dearest part: every page either process then writes is copied) is
off the path between a request and its reply.

Model calls (a run sent as ``RUN_CALLS``): the child's entry gets an ``llm`` callable
that writes each call as a frame on a call pipe and blocks on an answer pipe. The
worker numbers the calls, forwards them to the host (``CALL`` frames), and passes
the host's ``ANSWER`` frames back without ever blocking on the child; the host
answers (model, budget). A malformed or oversized call, or a child that does not
read its answers, ends the run. Nothing here calls a model or knows the budget.
"""

import ctypes
import fcntl
import gc
import importlib
import importlib.util
import json
import linecache
import os
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 8, 36, 38
CAP_DAC_READ_SEARCH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every architecture
OPEN_TREE_CLONE, MOVE_MOUNT_F_EMPTY_PATH, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 1, 4, 0x8000, 1
AT_FDCWD = -100
CHUNK = 1 << 16
HEADER = struct.Struct(">cQI")  # kind, run id, body length; the same in pool.py
# frames from the host (after the first, the init): a run, a run whose entry gets ``llm``,
# a cancel, the answer to a model call ({"n", "text"} or {"n", "error"}), and a final answer
# ({"n", "error"}: the same error for every later call of the run, answered by the worker)
RUN, RUN_CALLS, CANCEL, ANSWER, FINAL = b"R", b"M", b"C", b"A", b"F"
# frames to the host: the hello, a run's reply, a model call ({"n", "messages", "sampling"})
HELLO, REPLY, CALL = b"H", b"R", b"L"
# The child writes CALL frames ({"messages", "sampling"}, run id 0) on its call pipe; the worker
# writes the host's ANSWER frames, as they came, on its answer pipe.
MAX_PENDING = 32  # calls forwarded but not answered, at most; then the call pipe waits (backpressure)
ANSWER_PIPE_BYTES = 1 << 20  # the answer pipe's buffer: answers are written without blocking
# QD_SANDBOX_NAMESPACES=0: no namespaces at all, for systems where they misbehave (and to test that path)
NAMESPACES = os.environ.get("QD_SANDBOX_NAMESPACES", "1") != "0"
DRAIN_S = 1.0  # how long to wait for output pipes to close once the child is gone
TMP_DIRS = [d for d in ("/tmp", "/dev/shm") if os.path.isdir(d)]

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _prctl(option: int, value: int) -> None:
    _check(
        _libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
        "prctl",
    )


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    def c(text):
        return None if text is None else text.encode()

    _check(_libc.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)), f"mount {target}")


def _syscall(number: int, *args) -> int:
    ret = _libc.syscall(ctypes.c_long(number), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syscall {number}: {os.strerror(err)}")
    return ret


def _read_only_except(writable: list[str]) -> None:
    """Make every mount of this (private) mount namespace read-only, except ``writable``."""
    for path, attr, flags in [
        ("/", _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0), AT_RECURSIVE),
        *((w, _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0), 0) for w in writable),
    ]:
        _syscall(
            SYS_MOUNT_SETATTR,
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )


def _needed_paths() -> list[str]:
    """Directories a candidate must read: the Python installation and sys.path (not /tmp: it is private)."""
    paths = set()
    for path in [*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]:
        for candidate in (os.path.abspath(path or "."), os.path.realpath(path or ".")):
            if (
                candidate != "/"
                and os.path.isdir(candidate)
                and not candidate.startswith(("/tmp/", "/dev/shm/"))
            ):
                paths.add(candidate)
    return sorted(paths)


def _hidden_directories(paths: list[str]) -> list[tuple[str, list[str]]]:
    """Directories other users cannot cross on the way to ``paths`` (e.g. /root, 0700,
    holding a pyenv Python), each with its entries that lead there; outermost first."""
    plan: dict[str, set[str]] = {}
    for path in paths:
        parent = "/"
        for name in path.strip("/").split("/"):
            child = os.path.join(parent, name)
            if not os.stat(parent).st_mode & 0o001:
                plan.setdefault(parent, set()).add(child)
            parent = child
    return [(d, sorted(plan[d])) for d in sorted(plan)]


def _reveal(plan: list[tuple[str, list[str]]]) -> None:
    """Cover each hidden directory with an empty tmpfs and mount back only the entries
    that lead to Python, so the sandbox uid can import but sees nothing else there."""
    trees = {
        keep: _syscall(
            SYS_OPEN_TREE,
            ctypes.c_int(AT_FDCWD),
            keep.encode(),
            ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC),
        )
        for _, keeps in plan
        for keep in keeps
    }
    for hidden, keeps in plan:
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for keep in keeps:
            os.mkdir(keep, 0o755)
            _syscall(
                SYS_MOVE_MOUNT,
                ctypes.c_int(trees[keep]),
                b"",
                ctypes.c_int(AT_FDCWD),
                keep.encode(),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
            )
            os.close(trees[keep])


def _set_capabilities(mask: int) -> None:
    """Keep only the capabilities in ``mask`` (effective and permitted; none inheritable)."""
    data = (_CapData * 2)(_CapData(mask, mask, 0))
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")


def _read_frame(fd: int):
    """Next frame from ``fd`` as (kind, run id, body), or None at EOF."""
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    kind, run_id, size = HEADER.unpack(head)
    body = _read_exact(fd, size)
    return None if body is None else (kind, run_id, body)


def _read_exact(fd: int, n: int):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_frame(fd: int, kind: bytes, run_id: int, obj) -> None:
    body = json.dumps(obj).encode()
    _write_all(fd, HEADER.pack(kind, run_id, len(body)) + body)


def _read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def _enter_namespaces() -> dict[str, bool]:
    """Become pid 1 of a new PID namespace (inside a new user namespace when not root),
    in a private mount namespace. Each is optional: returns which ones it got.

    The process that called this stays outside, waits for the new pid 1 and exits
    with its status; only pid 1 returns. Must run before any thread starts.
    """
    got = dict.fromkeys(("pid", "user", "mount"), False)
    if not NAMESPACES:
        return got
    uid, gid = os.geteuid(), os.getegid()
    try:
        if uid != 0:
            _unshare(CLONE_NEWUSER)
            got["user"] = True
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        _unshare(CLONE_NEWPID)
        got["pid"] = True
    except OSError:
        pass
    if got["pid"]:
        pid = os.fork()
        if pid:
            os.closerange(0, 2)  # the parent must see EOF as soon as pid 1 dies
            _, status = os.waitpid(pid, 0)
            os._exit(min(abs(os.waitstatus_to_exitcode(status)), 255))
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Mounts made later must not propagate back to the host: only a private namespace will do.
    got["mount"] = _succeeds(_unshare, CLONE_NEWNS) and _succeeds(
        _mount, None, "/", None, MS_REC | MS_PRIVATE
    )
    return got


def _load_entry(entry: str):
    """Import the entry function; raise ValueError('entry: ...') naming the fix."""
    target, _, name = entry.rpartition(":")
    try:
        if target.endswith(".py"):
            directory, stem = os.path.split(target)
            sys.path.insert(0, directory)
            spec = importlib.util.spec_from_file_location(f"_qd_sandbox_entry_{stem[:-3]}", target)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            # Keep its source for tracebacks: the child may not see the file (private /tmp);
            # an entry without mtime is one linecache never re-checks.
            linecache.cache[target] = (0, None, linecache.getlines(target), target)
        else:
            module = importlib.import_module(target)
    except Exception as e:
        traceback.print_exc()
        raise ValueError(
            f"entry: importing {target} failed: {_one_line(e)} "
            "(fix the module or the entry; the traceback is on stderr)"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"entry: {target} has no function {name} (define `def {name}(text, **args)` in it)")
    return fn


def _print_traceback(exc: BaseException) -> None:
    """The traceback from the entry function down, without the worker's own frame."""
    try:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    except BaseException:
        pass


def _succeeds(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except OSError:
        return False


def _one_line(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return " ".join(text.split())[:500]


class ModelCallError(RuntimeError):
    """A model call that did not succeed: refused by the evaluation's budget, invalid, failed
    on the host, or cut off because the evaluation is ending. The message is one line."""


def answer_of(answer: dict):
    """What ``llm(...)`` returns for a successful answer frame: the text, or with ``top_logprobs=``
    the dict ``{"text", "top_logprobs"}`` (per generated token, {token: logprob})."""
    if "top_logprobs" in answer:
        return {"text": answer["text"], "top_logprobs": answer["top_logprobs"]}
    return answer["text"]


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
            "<llm(messages, temperature=, max_tokens=, stop=, model=, top_logprobs=) -> str: the run's model, "
            "via the host>"
        )

    def __call__(self, messages, **sampling) -> str:
        try:
            item = {} if self.item is None else {"item": self.item}
            body = json.dumps({"messages": messages, "sampling": sampling, **item}).encode()
        except (TypeError, ValueError) as e:
            raise ModelCallError(
                f"llm: request is not JSON: {_one_line(e)} (pass str messages and plain numbers)"
            ) from None
        with self._send:
            n, self._sent = self._sent, self._sent + 1
            try:
                _write_all(self.call_fd, HEADER.pack(CALL, 0, len(body)) + body)
            except OSError as e:
                raise ModelCallError(f"llm: the model channel is closed ({_one_line(e)})") from None
        answer = self._wait(n)
        if "error" in answer:
            raise ModelCallError(" ".join(str(answer["error"]).split())[:1000])
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
                    frame = _read_frame(self.answer_fd)
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


class Child:
    """A forked child waiting for its request: its pid, a pidfd for it, and the worker's
    ends of its pipes (request; stdout, stderr, result; model calls in, answers out)."""

    def __init__(self, pid: int, request_w: int, outputs: list[int], call_r: int, answer_w: int):
        self.pid, self.request_w, self.outputs = pid, request_w, outputs
        self.call_r, self.answer_w = call_r, answer_w
        self.pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        for fd in (*self.outputs, self.call_r, self.answer_w, self.pidfd):
            os.close(fd)


class CallChannel:
    """The worker's side of one run's model calls: frames from the child's call pipe go to
    the host, numbered; the host's answers go to the child's answer pipe, never blocking.

    Each method returns None, or the reason to kill the run (one line)."""

    def __init__(self, child: Child, run_id: int, wfd: int, cap_mb: int):
        self.fd, self.answer_w, self.run_id, self.wfd = child.call_r, child.answer_w, run_id, wfd
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
            end = HEADER.size + size
            if len(self.inbox) < end:
                break
            body = bytes(self.inbox[HEADER.size : end])
            del self.inbox[:end]
            try:
                call = json.loads(body)
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
                _write_all(self.wfd, HEADER.pack(CALL, self.run_id, len(frame)) + frame)
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
        data = HEADER.pack(ANSWER, self.run_id, len(body)) + body
        try:
            written = os.write(self.answer_w, data)
        except BlockingIOError:
            written = 0
        except OSError:  # no reader left (the child is gone): nobody to answer
            return None
        return None if written == len(data) else "agent does not read its model answers"


class Worker:
    """Serves runs of one entry function, one at a time, each in a fresh child."""

    def __init__(self, init: dict, fn, namespaces: dict, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd
        self.queued: list[tuple] = []  # requests read while a run was being cancelled
        self.limits = init["limits"]
        root = os.geteuid() == 0 and not namespaces["user"]
        self.pid_ns, self.user_ns = namespaces["pid"], namespaces["user"]
        self.reaper = Reaper(self.pid_ns)
        if not self.pid_ns:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.network_off = False
        if NAMESPACES and not self.limits["network"]:
            self.network_off = _succeeds(_unshare, CLONE_NEWNET)
        needed = _needed_paths()
        self.hidden = _hidden_directories(needed) if root else []
        self.features = dict.fromkeys(("private_tmp", "private_proc", "read_only_fs"), False)
        revealed = not self.hidden
        if namespaces["mount"]:
            revealed = _succeeds(_reveal, self.hidden)
            self._private_filesystem()
        # Every run works in the same, freshly made directory: in the private tmpfs, or in
        # a directory of this worker's own (0711: the sandbox uid can enter, not list or add).
        self.base = None if self.features["private_tmp"] else tempfile.mkdtemp(prefix="qd-sandbox-")
        if self.base:
            os.chmod(self.base, 0o711)
        self.cwd = os.path.join(self.base or "/tmp", "work")
        self.side = ChildSide(
            fn, self.limits, self.cwd, init["uid"] if root else None, not revealed, self.pid_ns, needed
        )
        self.features["unprivileged_uid"] = self.side.switch_uid
        sys.stdout.reconfigure(line_buffering=True)  # a child killed mid-run keeps its last lines
        # Candidates see no API keys: the entry was imported with the full environment, runs get
        # this, set once here (in a child, touching the environment would copy pages of it).
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ") or k.startswith("LC_")}
        os.environ.clear()
        os.environ.update(keep, HOME=self.cwd, TMPDIR=self.cwd)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # inherited by every child; the worker never execs

    def isolation(self) -> dict:
        return {
            "rlimits": True,
            "process_group": True,
            "pid_namespace": self.pid_ns,
            "network_off": self.network_off,
            **self.features,
            "user_namespace": self.user_ns,
        }

    def _private_filesystem(self) -> None:
        """In the worker's own mount namespace: a proc for its PID namespace, fresh tmpfs
        on /tmp and /dev/shm (wiped after every run), everything else read-only."""
        features = self.features
        features["private_proc"] = self.pid_ns and _succeeds(
            _mount, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC
        )
        size = f"size={4 * self.limits['file_mb']}m,nr_inodes=10000,mode=1777"
        features["private_tmp"] = all(
            [_succeeds(_mount, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, size) for path in TMP_DIRS]
        )
        features["read_only_fs"] = features["private_tmp"] and _succeeds(_read_only_except, TMP_DIRS)

    def serve(self) -> None:
        _write_frame(self.wfd, HELLO, 0, {"isolation": self.isolation()})
        # Children copy every page they write, the garbage collector's included: a frozen
        # heap is one that a collection in a child never walks.
        gc.freeze()
        self.child = self._fork()
        while (frame := self.queued.pop(0) if self.queued else _read_frame(self.rfd)) is not None:
            kind, run_id, body = frame
            if kind in (RUN, RUN_CALLS):  # a cancel or answer for a run that already ended is ignored
                _write_frame(self.wfd, REPLY, run_id, self.run(run_id, body, kind == RUN_CALLS))
                self.child.close()
                self.child = self._fork()  # while the host reads the reply
        self._leave()

    def _fork(self) -> Child:
        """Fork the next run's child. Only now, with every process of the last run killed and
        its files deleted, so nothing of it can reach the new child."""
        os.mkdir(self.cwd, 0o700)
        if self.side.switch_uid:
            os.chown(self.cwd, self.side.uid, self.side.gid)
        # request; stdout, stderr, result; model calls (child -> worker), answers (worker -> child)
        (request_r, request_w), *outputs, (call_r, call_w), (answer_r, answer_w) = [
            os.pipe() for _ in range(6)
        ]
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self.side.run(request_r, *(w for _, w in outputs), call_w, answer_r)
            finally:
                os._exit(70)  # the child must never return into the worker's loop
        for fd in (request_r, *(w for _, w in outputs), call_w, answer_r):
            os.close(fd)
        return Child(pid, request_w, [r for r, _ in outputs], call_r, answer_w)

    def _leave(self) -> None:
        """The host is gone: kill everything, delete the files, exit."""
        self.reaper.kill_all(self.child.pid)
        self.reaper.sweep(self.child.pid)
        self._remove_files()
        if self.base:
            shutil.rmtree(self.base, ignore_errors=True)
        os._exit(0)

    def _deliver(self, request: bytes) -> None:
        """Hand the request to the waiting child (EOF ends it). A child that died waiting
        (killed from outside: nothing of ours ends it) is replaced once; one that cannot
        take it either is left to its verdict."""
        for replace in (True, False):
            try:
                _write_all(self.child.request_w, request)
                break
            except OSError:
                if not replace:
                    break
            self.reaper.sweep(self.child.pid)
            os.close(self.child.request_w)
            self.child.close()
            self._remove_files()
            self.child = self._fork()
        os.close(self.child.request_w)

    def run(self, run_id: int, request: bytes, calls: bool = False) -> dict:
        lim = self.limits
        start = time.monotonic()
        self._deliver(request)
        reason, status, cpu, outputs = self._supervise(self.child, start, run_id, calls)
        self._remove_files()
        seconds = time.monotonic() - start
        out, err, res = outputs
        reply = {
            "ok": False,
            "value": None,
            "error": reason,
            "stdout": _truncate(out),
            "stderr": _truncate(err),
            "seconds": seconds,
        }
        if reason is None:
            reply.update(_verdict(status, cpu, bytes(res), lim))
        return reply

    def _remove_files(self) -> None:
        """Delete what the run may have written: everything in the private tmpfs, or its directory."""
        written = (
            [os.path.join(top, name) for top in TMP_DIRS for name in os.listdir(top)]
            if self.features["private_tmp"]
            else [self.cwd]
        )
        for path in written:
            try:
                os.rmdir(path)  # the usual case: an empty working directory
            except FileNotFoundError:
                pass
            except OSError:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)

    def _supervise(self, child: Child, start: float, run_id: int, calls: bool = False):
        """Collect the child's output (and pass its model calls on) until it exits or breaks a
        limit; then kill what is left."""
        lim, fds, pid = self.limits, child.outputs, child.pid
        cap = lim["output_cap_mb"] << 20
        outputs = [_Capture(lim["output_kb"] * 512), _Capture(lim["output_kb"] * 512), bytearray()]
        poller = select.poll()
        for fd in (*fds, self.rfd, child.pidfd):
            poller.register(fd, select.POLLIN)
        reason, status, cpu, killed, deadline = None, None, 0.0, False, start + lim["wall_s"]
        open_fds = set(fds)
        channel = CallChannel(child, run_id, self.wfd, lim["output_cap_mb"]) if calls else None
        listening = False  # whether the call pipe is polled

        def listen(on: bool) -> None:
            nonlocal listening
            if on != listening:
                if on:
                    poller.register(channel.fd, select.POLLIN)
                else:
                    poller.unregister(channel.fd)
                listening = on

        def kill(why: str) -> None:
            nonlocal reason, killed
            reason = reason or why
            if not killed:
                killed = True
                self.reaper.kill_all(pid)
            if channel is not None:
                channel.open = False
                listen(False)

        if channel is not None:
            listen(True)

        while status is None or open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                if status is not None:
                    break  # something we could not kill still holds a pipe open
                kill(f"timeout after {float(lim['wall_s'])} s (killed)")
                left, deadline = DRAIN_S, time.monotonic() + DRAIN_S
            for fd, _ in poller.poll(left * 1000):
                if fd == child.pidfd:
                    poller.unregister(fd)
                    _, status, usage = os.wait4(pid, 0)
                    cpu = usage.ru_utime + usage.ru_stime
                    self.reaper.sweep(pid)
                    deadline = min(deadline, time.monotonic() + DRAIN_S)
                elif fd == self.rfd:
                    frame = _read_frame(self.rfd)
                    if frame is None:  # the parent is gone: clean up and leave
                        self._leave()
                    if frame[0] in (RUN, RUN_CALLS):  # the next request, sent after cancelling this one
                        self.queued.append(frame)
                    elif frame[0] == CANCEL and frame[1] == run_id:
                        kill("cancelled")
                    elif (
                        frame[0] in (ANSWER, FINAL)
                        and frame[1] == run_id
                        and channel is not None
                        and channel.open
                    ):
                        if why := channel.answer(frame[2], frame[0] == FINAL):
                            kill(why)
                        elif channel.pending < MAX_PENDING:
                            listen(True)
                elif channel is not None and fd == channel.fd:
                    if not listening:  # stopped earlier in this batch of events
                        continue
                    if why := channel.readable():
                        kill(why)
                    elif not channel.open or channel.pending >= MAX_PENDING:
                        listen(False)  # at EOF; or wait for answers before reading more calls
                else:
                    data = os.read(fd, CHUNK)
                    if not data:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    outputs[fds.index(fd)] += data
                    if fd == fds[2] and len(outputs[2]) > cap:
                        kill(f"result too large (> {lim['output_cap_mb']} MB)")
                    elif outputs[0].total + outputs[1].total > cap:
                        kill(f"output limit ({lim['output_cap_mb']} MB)")
        return reason, status, cpu, outputs


class ChildSide:
    """What a pre-forked child does, from the fork to its exit: set itself up, wait for
    its request, become the sandbox user, call the entry, write the result.

    Its settings are worked out once, in the worker, before the first fork: a child only
    applies them, and every page it would write to work them out would be a copy.
    """

    def __init__(
        self,
        fn,
        limits: dict,
        cwd: str,
        sandbox_uid: int | None,
        keep_read: bool,
        pid_ns: bool,
        needed: list[str],
    ):
        """``sandbox_uid``: the uid to run as, where the worker is real root (None: keep its
        own uid, without capabilities); ``needed``: the directories that uid must read."""
        self.fn, self.limits, self.cwd = fn, limits, cwd
        self.keep_read, self.pid_ns, self.worker_pid = keep_read, pid_ns, os.getpid()
        self.uid, self.gid = (os.geteuid(), os.getegid()) if sandbox_uid is None else (sandbox_uid,) * 2
        self.switch_uid = sandbox_uid is not None and self._can_switch_uid(needed)
        self.result_fd = min(1023, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1)
        self.call_fd, self.answer_fd = self.result_fd - 1, self.result_fd - 2  # model calls out, answers in
        self.rlimits = self._rlimits()

    def _can_switch_uid(self, needed: list[str]) -> bool:
        """Whether a child can become the sandbox uid and still read Python (tried in a throwaway child)."""
        pid = os.fork()
        if pid == 0:
            try:
                self._become_sandbox_user()
                os._exit(0 if all(os.access(p, os.R_OK | os.X_OK, effective_ids=True) for p in needed) else 1)
            finally:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def _drop_privileges(self) -> None:
        if self.switch_uid:
            self._become_sandbox_user()
        else:  # root whose uid cannot change, or root of a user namespace: keep no capability
            _set_capabilities(0)
        if not self.pid_ns:
            # Without a PID namespace (whose processes all die with its pid 1), die with the
            # worker. Set after the uid switch, which clears it; a worker already gone shows
            # in the parent pid.
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != self.worker_pid:
                os._exit(0)

    def _become_sandbox_user(self) -> None:
        """Switch to the sandbox uid. Without a mount namespace to reveal a Python installed
        under a directory that uid cannot enter, keep CAP_DAC_READ_SEARCH (read-only access)."""
        if self.keep_read:
            _prctl(PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
        if self.keep_read:
            _set_capabilities(1 << CAP_DAC_READ_SEARCH)

    def _rlimits(self) -> list[tuple[int, tuple[int, int]]]:
        """The children's rlimits, worked out once."""
        lim, mb, out = self.limits, 1 << 20, []
        for kind, value in (
            (resource.RLIMIT_AS, lim["memory_mb"] * mb),
            (resource.RLIMIT_CPU, lim["cpu_s"]),
            (resource.RLIMIT_FSIZE, lim["file_mb"] * mb),
            (resource.RLIMIT_NPROC, lim["nproc"]),
            (resource.RLIMIT_CORE, 0),
        ):
            hard = value + 1 if kind == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
            now = resource.getrlimit(kind)[1]
            if now != resource.RLIM_INFINITY:  # without privileges a hard limit cannot rise
                value, hard = min(value, now), min(hard, now)
            out.append((kind, (value, hard)))
        return out

    def run(self, request_r: int, out_w: int, err_w: int, res_w: int, call_w: int, answer_r: int) -> None:
        """Set the child up, wait for its request, call the entry; never returns.

        What does not depend on the request (process group, descriptors, rlimits) is done
        before it arrives; the uid switch waits for it, so a child that has not run anything
        yet is not a process of the sandbox uid.

        A process group of its own, not a session: the worker has no controlling terminal to
        part from, and setsid() costs a scheduler autogroup per run (milliseconds of waiting
        on some kernels)."""
        result_fd = res_w
        try:
            os.setpgid(0, 0)
            os.chdir(self.cwd)
            for src, dst in (
                (request_r, 0),
                (out_w, 1),
                (err_w, 2),
                (res_w, self.result_fd),
                (call_w, self.call_fd),
                (answer_r, self.answer_fd),
            ):
                os.dup2(src, dst)
            result_fd = self.result_fd
            os.closerange(3, self.answer_fd)
            os.closerange(self.result_fd + 1, 1 << 20)
            for kind, pair in self.rlimits:
                resource.setrlimit(kind, pair)
            request = json.loads(_read_to_end(0))  # stdin stays at EOF for the candidate
            llm = ModelCalls(self.call_fd, self.answer_fd) if request.get("llm") else None
            if llm is None:  # a run without model calls keeps no channel
                os.close(self.call_fd)
                os.close(self.answer_fd)
            self._drop_privileges()
        except BaseException as e:
            self._finish({"error": f"sandbox setup failed: {_one_line(e)}"}, result_fd)
        try:
            if llm is None:
                value = self.fn(request["text"], **request["args"])
            else:
                value = self.fn(request["text"], llm=llm, **request["args"])
        except SystemExit as e:
            code = e.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
            self._flush()
            os._exit((code or 0) & 0xFF)
        except MemoryError as e:
            _print_traceback(e)
            envelope = {"error": f"memory limit ({self.limits['memory_mb']} MB)"}
        except BaseException as e:
            _print_traceback(e)
            envelope = {"error": _one_line(e)}
        else:
            envelope = {"value": value}
        self._finish(envelope, self.result_fd)

    def _finish(self, envelope: dict, fd: int) -> None:
        try:
            data = json.dumps(envelope).encode()
        except MemoryError:
            data = json.dumps({"error": f"memory limit ({self.limits['memory_mb']} MB)"}).encode()
        except Exception as e:
            data = json.dumps({"error": f"result is not JSON: {_one_line(e)}"}).encode()
        try:
            _write_all(fd, data)
        except BaseException as e:
            print(f"qd.sandbox: could not write the result: {_one_line(e)}", file=sys.stderr)
        self._flush()
        os._exit(0)

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass


class Reaper:
    """Kills and reaps what a run leaves behind: the child, its process group, and the
    orphans that reach the worker (pid 1 of its PID namespace, or a subreaper)."""

    def __init__(self, pid_ns: bool):
        self.pid_ns = pid_ns
        self.protected = set() if pid_ns else set(self.children())  # the worker's own helpers

    def kill_all(self, pid: int) -> None:
        """SIGKILL the child and everything it started."""
        for kill, target in ((os.kill, -1),) if self.pid_ns else ((os.killpg, pid), (os.kill, pid)):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def sweep(self, pid: int) -> None:
        """Kill and reap whatever the run left behind (daemons, orphans, zombies)."""
        if self.pid_ns:
            # pid 1 of the namespace: kill(-1) reaches every other process in it, and
            # every orphan is our child, so reap until there are none left.
            while True:
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # As a subreaper, orphans of the run become our children: kill until none are left.
        while kids := set(self.children()) - self.protected:
            for kid in kids:
                try:
                    os.kill(kid, signal.SIGKILL)
                    os.waitpid(kid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass

    @staticmethod
    def children() -> list[int]:
        me, kids = str(os.getpid()), []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                if stat[stat.rindex(b")") + 2 :].split()[1].decode() == me:
                    kids.append(int(name))
        return kids


class _Capture:
    """Keeps the first and last ``keep`` bytes of a stream and counts the rest."""

    def __init__(self, keep: int):
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def __iadd__(self, data: bytes):
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            del self.tail[: -self.keep]
        return self


def _truncate(capture: _Capture) -> str:
    cut = capture.total - len(capture.head) - len(capture.tail)
    middle = f"\n... [{cut} bytes cut] ...\n" if cut else ""
    return capture.head.decode(errors="replace") + middle + capture.tail.decode(errors="replace")


def _verdict(status: int, cpu: float, result: bytes, lim: dict) -> dict:
    """ok/value/error from how the child ended and what it wrote on the result pipe."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= lim["cpu_s"] - 0.05):
            return {"error": f"cpu time limit ({lim['cpu_s']} s)"}
        return {"error": f"killed by {signal.Signals(sig).name}"}
    code = os.WEXITSTATUS(status)
    if code or not result:
        return {"error": f"exited with code {code}" + ("" if code else " without a result")}
    try:
        envelope = json.loads(result)
    except ValueError as e:
        return {"error": f"result is not JSON: {_one_line(e)}"}
    if not isinstance(envelope, dict) or len(envelope) != 1 or not {"value", "error"} & envelope.keys():
        return {"error": "result is not JSON: not a result envelope (was the result pipe written to?)"}
    if "error" in envelope:
        return {"error": " ".join(str(envelope["error"]).split())[:500]}
    return {"ok": True, "value": envelope["value"]}


def main() -> None:
    if __name__ == "__main__":  # so that an entry's ``from qd.sandbox import ModelCallError`` is this class
        sys.modules.setdefault("qd.sandbox.worker", sys.modules[__name__])
    namespaces = _enter_namespaces()
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints from the entry must not reach the protocol pipe
    os.close(null)
    frame = _read_frame(rfd)
    if frame is None:
        return
    init = json.loads(frame[2])
    sys.path[:] = init["sys_path"]
    os.chdir(init["cwd"])
    try:
        fn = _load_entry(init["entry"])
    except ValueError as e:
        _write_frame(wfd, HELLO, 0, {"error": str(e)})
        return
    Worker(init, fn, namespaces, rfd, wfd).serve()


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the parent is gone (killed, maybe): leave quietly
        os._exit(0)
