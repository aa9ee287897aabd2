"""No orphans: every process qd starts dies when qd dies, SIGKILL included.

Each test SIGKILLs one process alone (never its group), reads from /proc what
descended from it beforehand, and expects all of it gone (or a zombie).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qd.llm import LLMError
from qd.llm.server import EmbeddedServer

REPO = Path(__file__).resolve().parents[2]


# --- /proc ------------------------------------------------------------------


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[19])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below ``root`` (walking parent pids)."""
    children: dict[int, list[int]] = {}
    starts = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat(int(name))) is not None:
            children.setdefault(st[1], []).append(int(name))
            starts[int(name)] = st[2]
    found, todo = {}, [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            found[kid] = starts[kid]
            todo.append(kid)
    return found


def alive(pids: dict[int, int]) -> dict[int, str]:
    """Those of ``pids`` (pid -> start time) still running, with their command lines.
    A zombie has exited; a pid with another start time is another process."""
    out = {}
    for pid, start in pids.items():
        st = stat(pid)
        if st is not None and st[0] not in ("Z", "X") and st[2] == start:
            out[pid] = cmdline(pid)
    return out


def wait_gone(pids: dict[int, int], timeout_s: float) -> dict[int, str]:
    """Wait up to ``timeout_s`` for ``pids`` to end; what is still alive then (killed, for tidiness)."""
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def kill_alone(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` only (not its group), as the OOM killer would, and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(what: str, check, proc: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert proc.poll() is None, f"exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.1)
    return result


def python(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script)]


# --- the lifeline itself -----------------------------------------------------

LIFELINES = """
    import os, subprocess, sys, time
    from qd import lifeline
    # a Python module, run in-process by the wrapper, leading its own group (as the llama server)
    subprocess.Popen(lifeline.module_command("timeit", ["-n1", "-r1", "import time; time.sleep(60)"]),
                     start_new_session=True)
    # a module that starts a program of its own, in its group: killed with the group
    subprocess.Popen(lifeline.module_command(
        "timeit",
        ["-n1", "-r1", "import subprocess, time; subprocess.Popen(['sleep', '61']); time.sleep(60)"]),
        start_new_session=True)
    # a plain fork watching from a thread (as a pool worker does)
    if os.fork() == 0:
        lifeline.watch_parent()
        time.sleep(63)
        os._exit(0)
    print("ready", flush=True)
    time.sleep(100)
"""


def test_lifelines_kill_children_of_a_sigkilled_parent():
    parent = subprocess.Popen(python(LIFELINES), stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert parent.stdout.readline().strip() == b"ready"

        def started():  # every wrapper has started its program, and that program its child
            kids = descendants(parent.pid)
            lines = [cmdline(p) for p in kids]
            sleeps = sum(line.startswith("sleep 6") for line in lines)
            return kids if sleeps == 1 and sum("-m timeit" in line for line in lines) == 2 else None

        kids = wait_for("every child", started, parent, 10)
    finally:
        kill_alone(parent)
    assert wait_gone(kids, 5) == {}


def test_lifeline_of_an_orphan_at_birth_fires_at_once():
    """A child whose parent died before it could look dies at once instead of running on."""
    from qd import lifeline

    cmd = lifeline.module_command("timeit", ["-n1", "-r1", "import time; time.sleep(60)"])
    cmd[cmd.index("--parent") + 1] = "1"  # not our parent: as if re-parented already
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd="/")
    assert proc.wait(10) != 0
    assert time.monotonic() - t0 < 10


POOL_AND_SANDBOX = """
    import asyncio
    import numpy as np
    from qd.evaluator import PoolEvaluator
    from qd.sandbox import Sandbox
    pool = PoolEvaluator("sphere", {"dim": 4}, workers=2)
    asyncio.run(pool(np.zeros((4, 4), np.float32)))  # both workers up, the resource tracker too
    sandbox = Sandbox("json:dumps", workers=2)
    sandbox.isolation()  # waits for the first worker's hello
    print("ready", flush=True)
    import time; time.sleep(100)
"""


def test_pool_workers_resource_tracker_and_sandbox_die_with_a_sigkilled_parent():
    parent = subprocess.Popen(python(POOL_AND_SANDBOX), stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert parent.stdout.readline().strip() == b"ready"
        kids = descendants(parent.pid)
        lines = [cmdline(p) for p in kids]  # before the kill: the lifelines fire at once
    finally:
        kill_alone(parent)
    assert any("spawn_main" in line for line in lines), lines  # the pool starts workers as needed
    assert any("resource_tracker" in line for line in lines), lines
    assert sum("sandbox/worker.py" in line for line in lines) >= 2, lines
    assert wait_gone(kids, 10) == {}


# --- the recorded server ---------------------------------------------------


def start_process(tag: str) -> subprocess.Popen:
    return subprocess.Popen(python("import time; time.sleep(60)") + ["--tag", tag], start_new_session=True)


def record(path: Path, pid: int, cmd: list[str], start: int | None = None) -> None:
    path.write_text(
        json.dumps({"pid": pid, "start": stat(pid)[2] if start is None else start, "cmdline": cmd})
    )


def wait_started(proc: subprocess.Popen, cmd: list[str]) -> None:
    deadline = time.monotonic() + 10
    while cmdline(proc.pid) != " ".join(cmd):  # exec'd
        assert time.monotonic() < deadline
        time.sleep(0.02)


def start_server(tmp_path: Path) -> None:
    """Start a server for ``tmp_path`` whose model is missing: it stops a stale one, then fails."""
    with pytest.raises(LLMError, match="does not exist"):
        EmbeddedServer(tmp_path / "missing.gguf", log_path=tmp_path / "llm_server.log").start()


def test_a_new_server_stops_the_recorded_stale_one(tmp_path):
    rec = tmp_path / "llm_server.json"
    stale = start_process(str(rec))
    try:
        wait_started(stale, stale.args)
        record(rec, stale.pid, stale.args)
        start_server(tmp_path)
        assert stale.wait(10) == -signal.SIGTERM
    finally:
        stale.kill()
        stale.wait()
    assert not rec.exists()
    assert f"(pid {stale.pid})" in (tmp_path / "llm_server.log").read_text()


@pytest.mark.parametrize("mismatch", ["cmdline", "start"])
def test_a_record_naming_another_process_kills_nothing(tmp_path, mismatch):
    rec = tmp_path / "llm_server.json"
    other = start_process("unrelated")
    try:
        wait_started(other, other.args)
        if mismatch == "cmdline":  # the pid now belongs to an unrelated program
            record(rec, other.pid, [sys.executable, "-m", "llama_cpp.server", "--tag", str(rec)])
        else:  # the same command line, but a process started at another time: a reused pid
            record(rec, other.pid, other.args, start=stat(other.pid)[2] - 1)
        start_server(tmp_path)
        assert other.poll() is None
        assert not rec.exists()  # the stale record is dropped
    finally:
        other.kill()
        other.wait()


# --- qd-run end to end -------------------------------------------------------

CALLS = 4  # few and short calls: the test's time is theirs (2 answered before the kill, the rest after)
FAST = ["llm.max_tokens=32"]


def answered(store: Path) -> int:
    """Candidates with a model: answered LLM calls committed to the store."""
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM candidates WHERE model IS NOT NULL").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


@pytest.mark.slow
def test_sigkilled_qd_run_leaves_no_process_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    store = run_dir / "store.sqlite"
    qd_run = [sys.executable, "-m", "qd.run"]
    log = open(tmp_path / "first.log", "wb")
    first = subprocess.Popen(
        [
            *qd_run,
            "experiment=function_fit",
            f"runner.max_llm_calls={CALLS}",
            "runner.progress=false",
            f"hydra.run.dir={run_dir}",
            *FAST,
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for("2 answered calls", lambda: answered(store) >= 2, first, 180)
        kids = descendants(first.pid)
        lines = [cmdline(p) for p in kids]  # before the kill: the lifelines fire at once
    finally:
        kill_alone(first)
        log.close()
    assert any("llama_cpp.server" in line for line in lines), lines
    assert sum("sandbox/worker.py" in line for line in lines) >= 2, lines
    assert wait_gone(kids, 15) == {}, (tmp_path / "first.log").read_text()[-3000:]
    assert (run_dir / "llm_server.json").exists()  # the dead server's record, for resume to check

    done = subprocess.run(
        [*qd_run, "--json", f"resume={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    llm = json.loads(done.stdout.strip().splitlines()[-1])["llm"]
    assert llm["calls"] == CALLS, done.stdout
    assert answered(store) == CALLS
    assert not (run_dir / "llm_server.json").exists()  # stopped cleanly, the record went with it
    survivors = {
        pid: cmdline(pid)
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if str(run_dir) in cmdline(pid) and pid != os.getpid()
    }
    assert survivors == {}
