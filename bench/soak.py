#!/usr/bin/env python
"""Soak: a long function_fit run against a scripted model with faults, watched from /proc.

What it answers: does a long-running ``qd-run`` stay flat? A search meant to run
for hours must not grow its resident memory, leak file descriptors, threads or
processes (sandbox workers, forked evaluations, HTTP connections), or slow down
as the store fills. Short benchmarks cannot see that; this one runs for an hour
(``--minutes``, default 60) and samples the real process every ``--interval``
seconds.

Setup:

* model: ``tests/scripted_llm.py`` in its own process (``ScriptedLLM(rules,
  record=False).start(in_process=True)``: it counts requests but keeps no bodies,
  so its own memory stays flat). Every answer is derived from the request's
  ``seed`` (unique per LLM call): a random valid ``f(x)`` of 1 to 7 terms
  (polynomials, sin/cos, abs, an intermediate variable), now and then a perturbed
  copy of the target, so cells keep filling and elites keep being replaced; about
  10% invalid answers (no code block, syntax error, a raise, a non-number, and
  rarely an endless loop the sandbox has to kill). Faults are mixed in with
  ``Rule.rotation``: every ``--fault-every``-th request (default 5) answers in turn
  429, 500, hang, bad_json, empty_choices (0: no faults). A hang costs one
  ``llm.timeout_s`` (2 s) before the client retries.
* qd: ``python -m qd.run experiment=function_fit llm.provider=server ...`` as a
  subprocess (the process measured is the real ``qd-run``: hydra, SQLite store,
  events.jsonl, checkpoints, the on-disk LLM cache, the sandbox), no budget but
  ``runner.max_seconds = minutes * 60``; in_flight = llm.concurrency = 4, sandbox
  wall limit 1 s. Its run directory is a fresh temporary directory (removed at the
  end unless ``--keep``).

Sampled every interval (from /proc, never from inside qd): resident memory
(VmRSS) of the qd-run process and the sum over its lasting descendants (sandbox
workers), its open descriptors (``/proc/PID/fd``), threads, live
descendant processes, store size (``store.sqlite`` + ``-wal``), LLM cache size
(``llm_cache/``, one file per answered call: it grows by design, reported apart),
evaluations so far (last line of ``events.jsonl``) and evaluations/s over the
interval; also the scripted server's RSS and request count. Samples taken after
the time budget ran out (qd-run draining and closing) are shown but left out of
the verdict; after qd-run exits, any of its processes still alive are reported
(and killed).

Verdict ("flat"): resident memory grows at most 20 MB per hour after minute 5
(least-squares slope over the samples after minute 5; for runs under 10 minutes the
samples after the first 20% (at least after the first evaluation) are used and the
figure is not conclusive), and descriptors, threads and processes unchanged after that
warm-up (min/max shown). Processes are those alive for more than 5 s (the sandbox's
per-evaluation forks come and go); a descriptor or process count that varies is still
called steady when its baseline (the minimum over the last third of the samples) is
not above the one over the first third: a leak raises the baseline, an HTTP connection
or fork caught mid-flight only a peak.

Usage::

    python bench/soak.py                                        # an hour, faults 1 in 5
    python bench/soak.py --minutes 2 --interval 5 --fault-every 0   # smoke run
    python bench/soak.py --fault-every 0                        # an hour at full speed (no hangs)
    python bench/soak.py --results bench/RESULTS.md             # also write the section

Ctrl-C (or SIGTERM) stops early: qd-run is interrupted, everything started here is
stopped, and the samples so far are reported. The samples and verdict go to ``--out``
as JSON (default /tmp/qd_soak.json); a Markdown section for bench/RESULTS.md is printed
(and written there with ``--results``). Extra arguments are passed to qd-run as
overrides (e.g. ``runner.workers=4``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Only the standard library at module level: the scripted server process imports this
# module to unpickle ``reply``.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "tests", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

TITLE = "## Soak: function_fit for an hour with faults (bench/soak.py)"
FAULT_KINDS = ("429", "500", "hang", "bad_json", "empty_choices")
FLAT_MB_PER_HOUR = 20.0
WARMUP_S = 300.0  # "after minute 5"
CONCLUSIVE_MIN = 10.0
LONG_LIVED_S = 5.0  # processes younger than this are per-evaluation forks in flight

# ----- the model's answers (runs in the scripted server's process) -----------------


def _const(rng: random.Random, lo: float = -3.0, hi: float = 3.0) -> str:
    return repr(round(rng.uniform(lo, hi), rng.choice((1, 2, 3))))


def _term(rng: random.Random, v: str) -> str:
    c = _const(rng)
    form = rng.randrange(7)
    if form == 0:
        return c
    if form == 1:
        return f"{c} * {v}"
    if form == 2:
        return f"{c} * {v} * {v}"
    if form == 3:
        return f"{c} * {v} ** {rng.randint(2, 4)}"
    if form == 4:
        return f"{c} * math.sin({_const(rng, 0.1, 3.0)} * {v})"
    if form == 5:
        return f"{c} * math.cos({_const(rng, 0.1, 3.0)} * {v})"
    return f"{c} * abs({v})"


def program(rng: random.Random) -> str:
    """One answer: mostly a valid, distinct f(x); about 10% invalid in various ways."""
    r = rng.random()
    if r < 0.03:
        return "I am not sure what the function is; maybe try a polynomial?"
    if r < 0.06:
        return f"```python\ndef f(x)\n    return {_const(rng)} * x\n```"
    if r < 0.08:
        return f"```python\ndef f(x):\n    return {_const(rng)} / (x - x)\n```"
    if r < 0.095:
        return "```python\ndef f(x):\n    return 'x squared'\n```"
    if r < 0.1:
        return "```python\ndef f(x):\n    while True:\n        x = x + 1.0\n```"
    if r < 0.3:  # near the target (x^2 + 0.5 x + 2): elites keep being replaced
        a, b, c = (1 + rng.gauss(0, 0.2), 0.5 + rng.gauss(0, 0.3), 2 + rng.gauss(0, 0.5))
        body = f"    return {a:.3f} * x * x + {b:.3f} * x + {c:.3f}"
    else:
        v, body = "x", ""
        if rng.random() < 0.3:
            v, body = "y", f"    y = x + {_const(rng)}\n"
        body += "    return " + " + ".join(_term(rng, v) for _ in range(rng.randint(1, 7)))
    intro = rng.choice(("", "Here is an improved version:\n", "Try this:\n"))
    return f"{intro}```python\ndef f(x):\n{body}\n```\n"


def reply(request: dict) -> str:
    """The answer for one chat request, from its ``seed`` (the client derives one per call)."""
    return program(random.Random(int(request.get("seed") or 0)))


def _picklable_reply():
    """``reply`` under a module name the server process can import (not ``__main__``)."""
    if reply.__module__ != "__main__":
        return reply
    import importlib

    return importlib.import_module(Path(__file__).stem).reply  # HERE is on sys.path


def fault_rotation(every: int) -> tuple[str | None, ...]:
    """Every ``every``-th request a fault, taking FAULT_KINDS in turn; () for none."""
    if every <= 0:
        return ()
    out: list[str | None] = []
    for kind in FAULT_KINDS:
        out += [None] * (every - 1) + [kind]
    return tuple(out)


# ----- /proc ---------------------------------------------------------------------------


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


def _last_event(events: Path) -> dict:
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
    event = _last_event(run_dir / "events.jsonl")
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


# ----- running ---------------------------------------------------------------------------


def qd_command(base_url: str, minutes: float, run_dir: Path, in_flight: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qd.run",
        "experiment=function_fit",
        "llm.provider=server",
        f"llm.base_url={base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "runner.max_llm_calls=null",
        "runner.max_evaluations=null",
        f"runner.max_seconds={minutes * 60:g}",
        "runner.progress=false",
        f"runner.in_flight={in_flight}",
        f"llm.concurrency={in_flight}",
        "llm.backoff_s=0.05",
        "llm.backoff_max_s=0.5",
        "llm.timeout_s=2",
        "sandbox.wall_s=1",
        "sandbox.cpu_s=1",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


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


def _fit(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def mark_stopping(samples: list[dict], minutes: float) -> None:
    """Flags the samples taken after the run's time budget ran out (draining, closing: not steady state).

    The engine's clock starts after startup; each event's ``elapsed_s`` is at most the time
    since, so the earliest ``t - elapsed_s`` is the closest estimate of that start.
    """
    starts = [s["t"] - s["elapsed_s"] for s in samples if s.get("elapsed_s") is not None]
    end = (min(starts) if starts else 0.0) + minutes * 60
    for s in samples:
        s["stopping"] = s["t"] >= end


def verdict(samples: list[dict], minutes: float) -> tuple[dict, list[str]]:
    """The figures and the lines that say whether the run stayed flat (samples while it ran)."""
    good = [s for s in samples if not math.isnan(s["rss_mb"]) and s["fds"] >= 0 and not s.get("stopping")]
    duration = good[-1]["t"] if good else 0.0
    conclusive = duration >= CONCLUSIVE_MIN * 60 - 1
    first_eval = next((s["t"] for s in good if s["evals"]), 0.0)  # startup (imports, jit) before it
    cutoff = WARMUP_S if conclusive else max(0.2 * duration, first_eval)
    after = [s for s in good if s["t"] >= cutoff]
    slope = _fit([s["t"] / 3600 for s in after], [s["rss_mb"] for s in after])
    tree_slope = _fit([s["t"] / 3600 for s in after], [s["children_rss_mb"] for s in after])
    res: dict = {
        "duration_s": duration,
        "conclusive": conclusive,
        "cutoff_s": round(cutoff, 1),
        "samples_after": len(after),
        "rss_slope_mb_per_h": slope,
        "children_rss_slope_mb_per_h": tree_slope,
    }
    where = (
        "after minute 5"
        if conclusive
        else f"after the first 20% or the first evaluation ({cutoff:.0f} s); "
        f"run shorter than {CONCLUSIVE_MIN:.0f} min: not conclusive"
    )
    lines = []
    if slope is None:
        lines.append(f"- resident memory: too few samples {where}")
        res["rss_flat"] = None
    else:
        res["rss_flat"] = slope <= FLAT_MB_PER_HOUR
        lines.append(
            f"- resident memory (qd-run) grows {slope:+.1f} MB/hour {where} (least squares over {len(after)} "
            f"samples; {after[0]['rss_mb']:.1f} -> {after[-1]['rss_mb']:.1f} MB, "
            f"max {max(s['rss_mb'] for s in after):.1f}): "
            f"**{'flat' if res['rss_flat'] else 'grows'}** (limit {FLAT_MB_PER_HOUR:.0f} MB/hour)"
            + (f"; its descendants together {tree_slope:+.1f} MB/hour" if tree_slope is not None else "")
        )
    for key, name in (("fds", "open descriptors"), ("threads", "threads"), ("procs", "descendant processes")):
        if not after:
            continue
        lo, hi = min(s[key] for s in after), max(s[key] for s in after)
        warm = [s[key] for s in good if s["t"] < cutoff]
        third = max(1, len(after) // 3)
        # A leak raises the baseline (the minimum); a connection or fork caught mid-flight only the maximum.
        first_min, last_min = min(s[key] for s in after[:third]), min(s[key] for s in after[-third:])
        grows = last_min > first_min
        res[key] = {
            "min": lo,
            "max": hi,
            "warmup_max": max(warm) if warm else None,
            "unchanged": lo == hi,
            "baseline_first_third": first_min,
            "baseline_last_third": last_min,
            "grows": grows,
        }
        state = (
            "unchanged"
            if lo == hi
            else f"baseline grows ({first_min} -> {last_min})"
            if grows
            else f"steady: baseline {first_min} in the first third and {last_min} in the last, "
            "transient peaks only"
        )
        lines.append(
            f"- {name}: {lo}..{hi} after warm-up (warm-up max {res[key]['warmup_max']}): **{state}**"
        )
    if good:
        first, last = good[0], good[-1]
        lines.append(
            f"- store: {last['store_mb']:.1f} MB (SQLite + WAL, WAL {last['wal_mb']:.1f} MB), LLM cache "
            f"{last['cache_mb']:.1f} MB, events.jsonl {last['events_mb']:.1f} MB after "
            f"{last['evals'] or 0:,} evaluations"
        )
        rates = [s["evals_per_s"] for s in after if s.get("evals_per_s") is not None]
        if rates:
            q = max(1, len(rates) // 4)
            res["evals_per_s_first_quarter"] = sum(rates[:q]) / q
            res["evals_per_s_last_quarter"] = sum(rates[-q:]) / q
            lines.append(
                f"- evaluations/s after warm-up: mean {sum(rates) / len(rates):.2f} "
                f"(first quarter {res['evals_per_s_first_quarter']:.2f}, last quarter "
                f"{res['evals_per_s_last_quarter']:.2f}, min {min(rates):.2f}, max {max(rates):.2f})"
            )
        if last.get("server_rss_mb") is not None:
            lines.append(
                f"- scripted server (not qd): RSS {first['server_rss_mb']:.1f} -> "
                f"{last['server_rss_mb']:.1f} MB"
            )
    flat = bool(res.get("rss_flat")) and all(
        k in res and not res[k]["grows"] for k in ("fds", "threads", "procs")
    )
    res["flat"] = flat
    lines.insert(
        0, f"**Flat: {'yes' if flat else 'no'}**" + ("" if conclusive else " (short run: not conclusive)")
    )
    return res, lines


def table(samples: list[dict], max_rows: int | None = None) -> str:
    rows = samples
    if max_rows and len(samples) > max_rows:
        step = (len(samples) - 1) / (max_rows - 1)
        rows = [samples[round(i * step)] for i in range(max_rows)]
    out = [
        "| time | rss MB | workers MB | fds | threads | procs | store MB | cache MB | evals | evals/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in rows:
        rate = s.get("evals_per_s")
        out.append(
            f"| {int(s['t'] // 60)}:{int(s['t'] % 60):02d}{' (stopping)' if s.get('stopping') else ''} "
            f"| {s['rss_mb']:.1f} | {s['children_rss_mb']:.1f} | "
            f"{s['fds']} | {s['threads']} | {s['procs']} | {s['store_mb']:.2f} | {s['cache_mb']:.2f} | "
            f"{s['evals'] if s['evals'] is not None else '-'} | {'-' if rate is None else f'{rate:.2f}'} |"
        )
    return "\n".join(out)


def _every(n: int) -> str:
    return "every request" if n == 1 else f"1 request in {n}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="length of the qd run (runner.max_seconds)")
    ap.add_argument(
        "--interval", type=float, default=None, help="seconds between samples (default 30; 5 under 10 min)"
    )
    ap.add_argument("--fault-every", type=int, default=5, help="every N-th request a fault (0: none)")
    ap.add_argument("--in-flight", type=int, default=4, help="runner.in_flight and llm.concurrency")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "qd_soak.json",
        help="the samples and verdict as JSON",
    )
    ap.add_argument("--results", type=Path, default=None, help="write the section into this RESULTS.md")
    ap.add_argument("--keep", action="store_true", help="keep qd's run directory")
    ap.add_argument("overrides", nargs="*", help="extra qd-run overrides, e.g. runner.workers=4")
    args = ap.parse_args(argv)
    interval = args.interval or (30.0 if args.minutes >= CONCLUSIVE_MIN else 5.0)

    from scripted_llm import Rule, ScriptedLLM

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (nohup, a script's &)
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="qd_soak_"))
    run_dir = work / "run"
    log_path = work / "qd-run.log"
    rules = [Rule("", _picklable_reply(), rotation=fault_rotation(args.fault_every))]
    server = ScriptedLLM(rules, record=False)
    proc: subprocess.Popen | None = None
    seen: dict[int, int] = {}
    samples: list[dict] = []
    interrupted = False
    cmd: list[str] = []
    try:
        # The server ignores Ctrl-C (inherited SIG_IGN): this script stops it, after qd-run.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            server.start(in_process=True)
        finally:
            signal.signal(signal.SIGINT, old)
        server_pid = server._proc.pid if server._proc is not None else None
        cmd = qd_command(server.base_url, args.minutes, run_dir, args.in_flight, args.overrides)
        faults = f"{_every(args.fault_every)} {'/'.join(FAULT_KINDS)}" if args.fault_every > 0 else "off"
        print(
            f"soak: {args.minutes:g} min, sample every {interval:g} s, faults {faults}, "
            f"run dir {run_dir}, log {log_path}",
            flush=True,
        )
        with open(log_path, "wb") as log:
            # Own session: Ctrl-C reaches only this script, which then interrupts qd-run itself.
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        t0 = time.monotonic()
        deadline = t0 + args.minutes * 60 + 180  # startup and shutdown slack; then it is stopped
        print("  time   rss MB  workers MB  fds  thr  procs  store MB  cache MB   evals  evals/s", flush=True)
        next_t = t0
        while proc.poll() is None and time.monotonic() < deadline:
            next_t += interval
            time.sleep(max(0.0, next_t - time.monotonic()))
            if proc.poll() is not None:
                break
            s = sample(t0, proc, run_dir, server_pid, seen)
            prev = samples[-1] if samples else None
            if prev and s["evals"] is not None and prev["evals"] is not None:
                s["evals_per_s"] = round((s["evals"] - prev["evals"]) / max(s["t"] - prev["t"], 1e-9), 3)
            samples.append(s)
            rate = s.get("evals_per_s")
            print(
                f"  {int(s['t'] // 60):3d}:{int(s['t'] % 60):02d} {s['rss_mb']:8.1f} "
                f"{s['children_rss_mb']:11.1f} {s['fds']:4d} {s['threads']:4d} {s['procs']:6d} "
                f"{s['store_mb']:9.2f} {s['cache_mb']:9.2f} "
                f"{s['evals'] if s['evals'] is not None else '-':>7} "
                f"{'-' if rate is None else f'{rate:.2f}':>8}",
                flush=True,
            )
    except KeyboardInterrupt:
        interrupted = True
        print("\nsoak: interrupted; stopping qd-run and the server", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # cleanup is not interrupted half way
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        rc, left = None, []
        if proc is not None:
            left = stop_qd(proc, seen)
            rc = proc.returncode
        stats = None
        try:
            stats = server.stats() if server.base_url else None
        except OSError:
            pass
        server.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    ended = log_text.strip().splitlines()[-8:]
    expected = samples and samples[-1]["t"] >= args.minutes * 60 - 2 * interval - 60
    early = not interrupted and (rc != 0 or not expected)
    mark_stopping(samples, args.minutes)
    print()
    print(table(samples))
    res, lines = verdict(samples, args.minutes)
    print()
    if interrupted:
        lines.append("- interrupted (Ctrl-C or SIGTERM) before the end")
    stop_line = next((ln for ln in reversed(ended) if "qd-run: stopped" in ln or "Error" in ln), None)
    if early:
        lines.append(
            f"- qd-run ended early or failed: exit status {rc}"
            + (f", `{stop_line.strip()}`" if stop_line else "")
        )
    if proc is not None:
        lines.append(
            f"- after qd-run exited: {len(left)} of its processes left behind"
            + (f" (pids {left}, killed)" if left else " (clean shutdown)")
        )
    if stats:
        lines.append(
            f"- scripted server answered {stats['requests']:,} chat requests "
            f"(max {stats['max_in_flight']} in flight)"
        )
    print("\n".join(lines))
    if early or rc not in (0, None):
        print("\nqd-run's last lines:\n  " + "\n  ".join(ended))

    command = "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    from _results import commit, versions

    section = "\n".join(
        [
            TITLE,
            "",
            f"- Command: `{command.strip()}`, commit {commit()}",
            f"- Date: {started:%Y-%m-%d %H:%M} UTC; {res['duration_s'] / 60:.1f} min sampled every "
            f"{interval:g} s",
            f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}, shared; "
            f"1-min load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            f"- Versions: {versions('jax', 'openai', 'httpx', 'hydra-core')}",
            "- Setup: scripted server (`tests/scripted_llm.py`, own process, no latency, bodies not kept), "
            "answers derived from each request's seed (varied valid f(x), ~10% invalid), "
            + (
                f"{_every(args.fault_every)} a fault ({', '.join(FAULT_KINDS)} in turn)"
                if args.fault_every > 0
                else "no faults"
            )
            + "; qd-run as a subprocess: `"
            + " ".join(c if " " not in c else f'"{c}"' for c in cmd[1:])
            .replace(str(run_dir), "RUN")
            .replace(server.base_url, "URL")
            + "`",
            "- Columns: rss = qd-run's VmRSS; workers = the sum over its lasting descendants (sandbox "
            "workers); fds = entries of /proc/PID/fd; procs = descendants alive for more than "
            f"{LONG_LIVED_S:g} s (per-evaluation forks in flight excluded; all live descendants are in the "
            "JSON as procs_all); store = store.sqlite + WAL; cache = llm_cache/ (one file per call, grows by "
            "design); evals/s over the interval before the sample; (stopping): taken after the time budget "
            "ran out, while qd-run drained and closed, left out of the verdict.",
            "",
            table(samples, max_rows=14),
            "",
            *lines,
            "",
        ]
    )
    print("\n----- Markdown for bench/RESULTS.md -----\n" + section)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "command": command,
                "qd_command": cmd,
                "interval_s": interval,
                "minutes": args.minutes,
                "fault_every": args.fault_every,
                "exit_status": rc,
                "interrupted": interrupted,
                "server": stats,
                "verdict": res,
                "samples": samples,
            },
            indent=1,
        )
    )
    print(f"samples: {args.out}")
    if args.results:
        from _results import write_section

        write_section(args.results, TITLE, section)
        print(f"wrote {TITLE!r} into {args.results}")
    if args.keep:
        print(f"run dir kept: {run_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not early else 1


if __name__ == "__main__":
    sys.exit(main())
