"""What bench/soak.py reads of a running qd-run, from /proc and its run directory, never from inside qd.

One job: turn a process id and a run directory into a sample (resident memory, descriptors,
threads, lasting descendants, store/cache/events sizes, evaluations so far), stop that process
and whatever it left behind, and count what its store holds against what its events say it
committed ("nothing lost").
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

LONG_LIVED_S = 5.0  # processes younger than this are per-evaluation forks in flight


def _status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _rss_mb(pid: int) -> float:
    try:
        return int(_status(pid).get("VmRSS", "0 kB").split()[0]) / 1024
    except (OSError, ValueError):
        return 0.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, starttime in clock ticks) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> dict[int, int]:
    """Live descendants of ``root``: {pid: starttime} (a zombie counts: it still holds a slot)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append((int(name), st[1]))
    out, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), ()):
            if pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def _age_s(start_ticks: int) -> float:
    """Seconds since a process started, from its /proc start time."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _dir_bytes(path: Path) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    total += _dir_bytes(Path(e.path)) if e.is_dir(follow_symlinks=False) else e.stat().st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_event(events: Path) -> dict:
    """The last complete line of events.jsonl ({} before the first)."""
    try:
        with open(events, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().split(b"\n")
    except OSError:
        return {}
    for line in reversed(lines[:-1] if len(lines) > 1 else lines):  # the last may be half written
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "evaluations" in event:
            return event
    return {}


def sample(
    t0: float, proc: subprocess.Popen, run_dir: Path, server_pid: int | None, seen: dict[int, int]
) -> dict:
    pid = proc.pid
    tree = descendants(pid)
    seen.update(tree)
    # The sandbox forks one child per evaluation (alive < sandbox.wall_s): "procs" counts the
    # processes alive for more than LONG_LIVED_S, so a leak (e.g. an unreaped fork) shows, a
    # fork caught mid-run does not; "procs_all" counts every live descendant.
    lasting = [p for p, start in tree.items() if _age_s(start) > LONG_LIVED_S]
    try:
        status = _status(pid)
        rss = int(status["VmRSS"].split()[0]) / 1024
        threads = int(status["Threads"])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, KeyError, ValueError):
        rss, threads, fds = math.nan, -1, -1
    event = last_event(run_dir / "events.jsonl")
    llm = event.get("llm") or {}
    return {
        "t": round(time.monotonic() - t0, 2),
        "rss_mb": round(rss, 2),
        "children_rss_mb": round(sum(_rss_mb(p) for p in lasting), 2),
        "fds": fds,
        "threads": threads,
        "procs": len(lasting),
        "procs_all": len(tree),
        "store_mb": round((_size(run_dir / "store.sqlite") + _size(run_dir / "store.sqlite-wal")) / 2**20, 3),
        "wal_mb": round(_size(run_dir / "store.sqlite-wal") / 2**20, 3),
        "cache_mb": round(_dir_bytes(run_dir / "llm_cache") / 2**20, 3),
        "events_mb": round(_size(run_dir / "events.jsonl") / 2**20, 3),
        "evals": event.get("evaluations"),
        "elapsed_s": event.get("elapsed_s"),  # the engine's own clock (runner.max_seconds counts it)
        "llm_calls": llm.get("calls"),
        "llm_failed": llm.get("failed_calls"),
        "server_rss_mb": round(_rss_mb(server_pid), 2) if server_pid else None,
    }


def _alive(pids: dict[int, int]) -> list[int]:
    """Those still alive with the same start time (never a recycled pid)."""
    return [pid for pid, start in pids.items() if (st := _stat(pid)) is not None and st[1] == start]


def _kill_by_pid(pids: dict[int, int], sig: int) -> None:
    for pid in _alive(pids):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_qd(proc: subprocess.Popen, seen: dict[int, int]) -> list[int]:
    """Interrupt qd-run (it closes its engine), then terminate, then kill; then any leftover descendant.

    Returns the descendants still alive after qd-run exited (a clean shutdown leaves none).
    """
    seen.update(descendants(proc.pid))
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig) if sig != signal.SIGINT else proc.send_signal(sig)
        except OSError:
            pass
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            pass
    time.sleep(0.5)
    left = _alive(seen)
    _kill_by_pid(seen, signal.SIGKILL)  # e.g. sandbox workers in their own sessions
    return left


def accounted(run_dir: Path) -> dict:
    """What the run committed (events.jsonl: the last commit's ``evaluations`` and the sum of every
    commit's ``batch``) beside the candidates its store holds: equal when nothing was lost."""
    committed = evaluations = 0
    try:
        with open(run_dir / "events.jsonl", "rb") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "commit":
                    committed += int(event.get("batch") or 0)
                    evaluations = int(event.get("evaluations") or evaluations)
    except OSError:
        pass
    rows, lost_node_failures = 0, 0
    if (run_dir / "store.sqlite").exists():
        with sqlite3.connect(f"file:{run_dir / 'store.sqlite'}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
            lost_node_failures = db.execute(
                "SELECT COUNT(*) FROM candidates WHERE error LIKE '%ray: lost the worker%'"
            ).fetchone()[0]
    return {
        "store_rows": rows,
        "evaluations": evaluations,
        "committed": committed,
        "failed_on_lost_nodes": lost_node_failures,
        "nothing_lost": rows == evaluations == committed and rows > 0,
    }
