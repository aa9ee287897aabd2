"""A run's child, from the fork to its exit; and the entry it calls, imported once by the worker.

``ChildSide`` holds what every child applies (its settings are worked out once, in
the worker, before the first fork) and runs in each child: it sets itself up, waits
for its request, drops privileges, calls the entry and writes the result envelope.

Standard library only (the worker runs it under ``python -I``; see ``worker.py``).
"""

import importlib
import importlib.util
import json
import linecache
import os
import resource
import signal
import sys
import traceback

from .isolation import CAP_DAC_READ_SEARCH, PR_SET_KEEPCAPS, PR_SET_PDEATHSIG, prctl, set_capabilities
from .model_calls import ModelCalls
from .protocol import CHUNK, HARNESS, exception_line, raised_by_candidate, write_all


def load_entry(entry: str):
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
            f"entry: importing {target} failed: {exception_line(e)} "
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


def _read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


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
            set_capabilities(0)
        if not self.pid_ns:
            # Without a PID namespace (whose processes all die with its pid 1), die with the
            # worker. Set after the uid switch, which clears it; a worker already gone shows
            # in the parent pid.
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != self.worker_pid:
                os._exit(0)

    def _become_sandbox_user(self) -> None:
        """Switch to the sandbox uid. Without a mount namespace to reveal a Python installed
        under a directory that uid cannot enter, keep CAP_DAC_READ_SEARCH (read-only access)."""
        if self.keep_read:
            prctl(PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
        if self.keep_read:
            set_capabilities(1 << CAP_DAC_READ_SEARCH)

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
            self._finish({"error": f"{HARNESS}sandbox setup failed: {exception_line(e)}"}, result_fd)
        extra = {} if llm is None else {"llm": llm}
        try:
            value = self.fn(request["text"], **extra, **request["args"])
        except SystemExit as e:
            code = e.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
            self._flush()
            os._exit((code or 0) & 0xFF)
        except BaseException as e:
            envelope = {"error": self._reason(e)}
        else:
            envelope = {"value": value}
            if "then" in request:
                envelope = self._then(request, extra, value)
        self._finish(envelope, self.result_fd)

    def _then(self, request: dict, extra: dict, value) -> dict:
        """The calls of the later stages of one visit (``Sandbox.run``'s ``then``), in order, up
        to the first that fails, whose reason ends the envelope: the values before it stay."""
        values = [value]
        for args in request["then"]:
            try:
                values.append(self.fn(request["text"], **extra, **args))
            except SystemExit as e:
                return {"values": values, "error": f"exited with code {e.code} (sys.exit)"}
            except BaseException as e:
                return {"values": values, "error": self._reason(e)}
        return {"values": values}

    def _reason(self, e: BaseException) -> str:
        """The one-line reason of an exception the entry let out (its traceback to stderr),
        blamed on the candidate or the harness."""
        _print_traceback(e)
        if isinstance(e, MemoryError):
            return f"memory limit ({self.limits['memory_mb']} MB)"
        return ("" if raised_by_candidate(e, self.cwd) else HARNESS) + exception_line(e)

    def _finish(self, envelope: dict, fd: int) -> None:
        try:
            data = json.dumps(envelope).encode()
        except MemoryError:
            data = json.dumps({"error": f"memory limit ({self.limits['memory_mb']} MB)"}).encode()
        except Exception as e:
            data = json.dumps({"error": f"result is not JSON: {exception_line(e)}"}).encode()
        try:
            write_all(fd, data)
        except BaseException as e:
            print(f"qd.sandbox: could not write the result: {exception_line(e)}", file=sys.stderr)
        self._flush()
        os._exit(0)

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass
