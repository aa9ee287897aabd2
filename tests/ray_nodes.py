"""A local Ray cluster on this machine, for the Ray tests and bench/soak.py's ray phase.

A head without CPUs and worker nodes added by name, each its own ``ray start --block`` process
(usage stats and dashboard off, a small object store, health checks every 0.5 s so a lost node is
noticed in seconds), all in the head's process group, which ``stop`` kills. A node is lost as a
machine going down loses it: ``kill -9`` of its raylet and of the workers the raylet started
(stopped first, so it starts none while they are listed). ``root`` must be a short path: Ray's
socket paths must stay under 108 bytes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ENV = {
    **os.environ,
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
START_S = 180.0  # a node's start on a loaded 2-core machine


class LocalCluster:
    """The head, started here; worker nodes by name (``workers``: name -> its ``ray start``)."""

    def __init__(self, root: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.root, self.address = root, f"127.0.0.1:{port}"
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self._start("head", ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"])

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        group = self.procs[0].pid if self.procs else 0
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]
                + ["--object-store-memory=80000000", f"--temp-dir={self.root / 'ray'}", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=ENV,
                process_group=group,
            )
        self.procs.append(proc)
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-1000:]
                raise RuntimeError(f"ray node {name} did not start: {tail}")
            time.sleep(0.2)
        return proc

    def add_worker(self, name: str | None = None, cpus: int = 1, resources: dict | None = None) -> str:
        """Starts a worker node of ``cpus`` CPUs (and custom ``resources``); returns its name
        (default: ``w1``, ``w2``, ... in the order started)."""
        name = name or f"w{len(self.workers) + 1}"
        args = [f"--address={self.address}", f"--num-cpus={cpus}"]
        if resources:
            args.append("--resources=" + "{" + ", ".join(f'"{k}": {v}' for k, v in resources.items()) + "}")
        self.workers[name] = self._start(name, args)
        return name

    def kill_worker(self, name: str) -> int:
        """``kill -9`` of the node's raylet (a child of its ``ray start``) and of the workers it
        started; returns how many processes were killed."""
        listed = subprocess.run(
            ["pgrep", "-P", str(self.workers[name].pid), "raylet"], capture_output=True, text=True
        )
        killed = 0
        for raylet in map(int, listed.stdout.split()):
            os.kill(raylet, signal.SIGSTOP)
            children = subprocess.run(["pgrep", "-P", str(raylet)], capture_output=True, text=True)
            for pid in [raylet, *map(int, children.stdout.split())]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        return killed

    def stop(self) -> None:
        try:
            os.killpg(self.procs[0].pid, signal.SIGKILL)
        except OSError:
            pass
        for proc in self.procs:
            proc.wait()
