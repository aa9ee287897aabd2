"""Lifelines: a process qd starts dies when the process that started it dies, however it dies.

``kill -9`` (or the OOM killer) gives the dying process no chance to stop its
children, so each child watches its parent instead: a lifeline holds a pidfd of
the parent (it becomes readable the moment the parent *process* exits) and,
when it fires, SIGKILLs the child's own process group if the child leads one,
else the child alone. Where pidfds are missing (Linux < 5.3) it polls
``getppid()``, which changes when the parent dies and the child is re-parented.

Why not the usual tools: ``PR_SET_PDEATHSIG`` fires when the *thread* that
forked exits, not the process, and setting it needs ``preexec_fn``, unsafe in a
process running JAX threads; a watchdog pipe only reports EOF once every copy
of its write end is closed, and any other child forked without exec keeps one.
A pidfd is opened by the child itself, so there is nothing to leak.

Ways in:

* ``watch_parent(parent_pid)``: call first thing in a child (e.g. a
  multiprocessing initializer); a daemon thread keeps watch.
* ``module_command(module, args)``: ``python -c <qd.lifeline.main> --parent PID
  -m MODULE ARGS``, which runs ``MODULE`` as ``__main__`` in the same process under
  a lifeline (the embedded llama.cpp server).

This module imports only the standard library: it runs before the target does.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from pathlib import Path

_POLL_S = 0.2  # getppid() polling interval where pidfds are missing


def _open_parent(parent: int) -> int | None:
    """A pidfd of ``parent``, or None where pidfds are unsupported.

    Raises ``ProcessLookupError`` when ``parent`` is already gone or is not our
    parent any more (we were re-parented: it died before we looked).
    """
    fd = None
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        raise
    except (AttributeError, OSError):  # no pidfd_open (old kernel, seccomp): poll instead
        fd = None
    # Checked after opening: if it is still our parent now, the pidfd names the right process.
    if os.getppid() != parent:
        if fd is not None:
            os.close(fd)
        raise ProcessLookupError(parent)
    return fd


def _wait_for_exit(parent: int, fd: int | None) -> None:
    """Block until ``parent`` has exited."""
    if fd is None:
        while os.getppid() == parent:
            select.select([], [], [], _POLL_S)
        return
    try:
        while not select.select([fd], [], [])[0]:
            pass
    finally:
        os.close(fd)


def _die() -> None:
    """SIGKILL this process's group when it leads one (everything it started), else
    this process alone."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(parent: int | None = None) -> threading.Thread | None:
    """Die (see ``_die``) as soon as ``parent`` (default: the current parent) exits.

    Call it before starting long work; if the parent is already gone, this
    process dies here. Returns the watching daemon thread.
    """
    parent = os.getppid() if parent is None else parent
    try:
        fd = _open_parent(parent)
    except ProcessLookupError:
        _die()
        return None

    def watch() -> None:
        _wait_for_exit(parent, fd)
        _die()

    thread = threading.Thread(target=watch, name="qd-lifeline", daemon=True)
    thread.start()
    return thread


def _wrapper(tag: str | None) -> list[str]:
    """argv of the wrapper, watching this process. ``qd`` is appended to the wrapper's
    ``sys.path`` (not put in ``PYTHONPATH``, which would go before the standard library
    and be inherited): it imports from any working directory, installed or not."""
    root = str(Path(__file__).resolve().parent.parent)
    boot = f"import sys; sys.path.append({root!r}); from qd.lifeline import main; main()"
    return [sys.executable, "-c", boot, "--parent", str(os.getpid()), *(["--tag", tag] if tag else [])]


def module_command(module: str, args: list[str], *, tag: str | None = None) -> list[str]:
    """argv running ``python -m module args`` that dies with this process.

    ``tag`` (e.g. a run directory) only shows in the command line, so the
    process can be recognised (``ps``, stale-process checks).
    """
    return [*_wrapper(tag), "-m", module, *args]


def _run_module(parent: int, module: str, args: list[str]) -> None:
    import runpy

    watch_parent(parent)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m qd.lifeline --parent PID [--tag TEXT] -m MODULE [ARGS...]"
    parent, i = None, 0
    while i < len(argv) and argv[i] in ("--parent", "--tag"):
        if i + 1 >= len(argv):
            sys.exit(usage)
        if argv[i] == "--parent":
            parent = int(argv[i + 1])
        i += 2
    rest = argv[i:]
    if parent is None or len(rest) < 2 or rest[0] != "-m":
        sys.exit(usage)
    _run_module(parent, rest[1], rest[2:])


if __name__ == "__main__":
    main()
