"""The worker's loop: set the isolation up once, then serve runs, each in a fresh child.

``Worker`` sets up what every run shares (namespaces entered by ``main``, the network
cut, a private filesystem, the children's settings, a clean environment), then for
each request hands it to the child forked in advance, watches it (``Supervisor``),
replies, cleans up and forks the next child. ``main`` reads the host's init, imports
the entry and starts serving.

Standard library only (the worker runs it under ``python -I``; see ``worker.py``).
"""

import gc
import json
import os
import shutil
import sys
import tempfile
import time

from .child import ChildSide, load_entry
from .isolation import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_NO_NEW_PRIVS,
    TMP_DIRS,
    cut_network,
    enter_namespaces,
    hidden_directories,
    kept_private,
    needed_paths,
    outside_private,
    prctl,
    private_filesystem,
    reveal,
    succeeds,
    top_entry,
)
from .protocol import HELLO, RUN, RUN_CALLS, pack_reply, read_frame, write_all, write_frame
from .supervise import Reaper, RunningChild, Supervisor, run_reply


class Worker:
    """Serves runs of one entry function, one at a time, each in a fresh child."""

    def __init__(self, init: dict, fn, namespaces: dict, rfd: int, wfd: int):
        self.wfd = wfd
        self.limits = init["limits"]
        root = os.geteuid() == 0 and not namespaces["user"]
        self.pid_ns, self.user_ns = namespaces["pid"], namespaces["user"]
        self.reaper = Reaper(self.pid_ns)
        self.supervisor = Supervisor(self.limits, self.reaper, rfd, wfd, self._leave)
        if not self.pid_ns:
            prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.network_off = cut_network(self.limits["network"])
        outside = outside_private(needed_paths(sys.path))  # the entry's folder included
        kept = kept_private(init["sys_path"], os.getcwd())
        self.hidden = hidden_directories(outside) if root else []
        self.features = dict.fromkeys(("private_tmp", "private_proc", "read_only_fs"), False)
        revealed = not self.hidden
        if namespaces["mount"]:
            revealed = succeeds(reveal, self.hidden)
            self.features.update(private_filesystem(self.pid_ns, self.limits["file_mb"], kept))
        kept = [path for path in kept if self.features["private_tmp"] and os.path.ismount(path)]
        self.kept_tops = {top_entry(path) for path in kept}  # the clean-up after a run leaves them be
        # Every run works in the same, freshly made directory: in the private tmpfs, or in
        # a directory of this worker's own (0711: the sandbox uid can enter, not list or add).
        self.base = None if self.features["private_tmp"] else tempfile.mkdtemp(prefix="qd-sandbox-")
        if self.base:
            os.chmod(self.base, 0o711)
        self.cwd = os.path.join(self.base or "/tmp", "work")
        self.side = ChildSide(
            fn,
            self.limits,
            self.cwd,
            init["uid"] if root else None,
            not revealed,
            self.pid_ns,
            outside + kept,
        )
        self.features["unprivileged_uid"] = self.side.switch_uid
        sys.stdout.reconfigure(line_buffering=True)  # a child killed mid-run keeps its last lines
        # Candidates see no API keys: the entry was imported with the full environment, runs get
        # this, set once here (in a child, touching the environment would copy pages of it).
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ") or k.startswith("LC_")}
        os.environ.clear()
        os.environ.update(keep, HOME=self.cwd, TMPDIR=self.cwd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # inherited by every child; the worker never execs

    def isolation(self) -> dict:
        return {
            "rlimits": True,
            "process_group": True,
            "pid_namespace": self.pid_ns,
            "network_off": self.network_off,
            **self.features,
            "user_namespace": self.user_ns,
        }

    def serve(self) -> None:
        write_frame(self.wfd, HELLO, 0, {"isolation": self.isolation()})
        # Children copy every page they write, the garbage collector's included: a frozen
        # heap is one that a collection in a child never walks.
        gc.freeze()
        self.child = self._fork()
        while (frame := self.supervisor.next_frame()) is not None:
            kind, run_id, body = frame
            if kind in (RUN, RUN_CALLS):  # a cancel or answer for a run that already ended is ignored
                write_all(self.wfd, pack_reply(run_id, *self.run(run_id, body, kind == RUN_CALLS)))
                self.child.close()
                self.child = self._fork()  # while the host reads the reply
        self._leave()

    def _fork(self) -> RunningChild:
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
        return RunningChild(pid, request_w, [r for r, _ in outputs], call_r, answer_w)

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
                write_all(self.child.request_w, request)
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

    def run(self, run_id: int, request: bytes, calls: bool = False) -> tuple[dict, bytes]:
        start = time.monotonic()
        self._deliver(request)
        watched = self.supervisor.watch(self.child, start, run_id, calls)
        self._remove_files()
        return run_reply(watched, time.monotonic() - start, self.limits)

    def _remove_files(self) -> None:
        """Delete what the run may have written: everything in the private tmpfs, or its directory."""
        written = (
            [os.path.join(top, name) for top in TMP_DIRS for name in os.listdir(top)]
            if self.features["private_tmp"]
            else [self.cwd]
        )
        for path in (p for p in written if p not in self.kept_tops):
            try:
                os.rmdir(path)  # the usual case: an empty working directory
            except FileNotFoundError:
                pass
            except OSError:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)


def main() -> None:
    """Serve the host on stdin/stdout until it closes stdin."""
    namespaces = enter_namespaces()
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints from the entry must not reach the protocol pipe
    os.close(null)
    frame = read_frame(rfd)
    if frame is None:
        return
    init = json.loads(frame[2])
    sys.path[:] = init["sys_path"]
    os.chdir(init["cwd"])
    try:
        fn = load_entry(init["entry"])
    except ValueError as e:
        write_frame(wfd, HELLO, 0, {"error": str(e)})
        return
    Worker(init, fn, namespaces, rfd, wfd).serve()
