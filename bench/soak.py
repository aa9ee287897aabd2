#!/usr/bin/env python
"""Soak: an hour of qd-run in three phases against a scripted model with faults, watched from /proc.

What it answers: does a long-running ``qd-run`` stay flat? A search meant to run for hours must
not grow its resident memory, leak file descriptors, threads or processes (sandbox workers,
forked evaluations, HTTP connections, Ray connections), slow down as the store fills, or lose a
candidate when something fails under it. Short benchmarks cannot see that; this one runs for an
hour (``--minutes``, default 60) and samples the real process every ``--interval`` seconds.

Phases (``--phases``, default all three, in this order; ``--minutes`` is split 50/25/25 among
them, renormalised over the phases chosen: function_fit is the long one, the two others each get
as long as needed to judge growth after a 5-minute warm-up):

1. ``function_fit``: ``experiment=function_fit`` with faults, in_flight = llm.concurrency =
   ``--in-flight`` (4), sandbox wall limit 1 s.
2. ``agent``: ``experiment=agent_design``: agents evaluated in the sandbox that call the model
   through the host's gateway within their budget (``eval_llm``); the scripted model writes a
   varied agent for each operator prompt and answers the agents' problems as
   ``tests/capable_llm.py`` does, so evaluations with model calls really happen (their count by
   role is reported); the experiment's own loop shape (generations of 6, in_flight 1), sandbox
   wall limit 20 s.
3. ``ray``: phase 1's run with ``runner=ray`` on a local cluster (``tests/ray_nodes.py``, as the
   Ray tests use it: a head and 1-CPU worker nodes on this machine); every ``--kill-every``
   seconds after the first evaluation (the first kill no later than halfway to the phase's end)
   one of the nodes the run uses is lost as a machine going down loses it (``kill -9`` of its
   raylet and workers) and a fresh node started in its place, as the machine coming back. The
   run keeps the nodes alive at its start (``RaySandbox`` adopts no node joining later), so the
   replacement keeps the cluster's size for whatever joins next, and the cluster starts with one
   node more than the kills: the run keeps a node to the end.

Setup common to the phases: the model is ``tests/scripted_llm.py`` in its own process, one per
phase (``record=False``: it keeps no bodies, so its own memory stays flat); answers come from
``bench/soak_answers.py``, derived from each request's seed; every ``--fault-every``-th request
(default 5) answers in turn 429, 500, hang, bad_json, empty_choices (0: no faults); a hang costs
one ``llm.timeout_s`` (2 s) before the client retries. qd is ``python -m qd.run ...`` as a
subprocess (the process measured is the real ``qd-run``: hydra, SQLite store, events.jsonl,
checkpoints, the on-disk LLM cache, the sandbox), with no budget but ``runner.max_seconds`` (the
phase's minutes), in a fresh temporary run directory (removed at the end unless ``--keep``).

Sampled (``bench/soak_proc.py``, from /proc, never from inside qd): qd-run's resident memory and
the sum over its lasting descendants (sandbox workers), its open descriptors, threads, live
descendant processes, store, LLM cache and events sizes, evaluations so far, evaluations/s over
the interval, the scripted server's RSS, and the machine's 1-minute load. One verdict per phase
(``bench/soak_verdict.py``): resident memory grows at most 20 MB per hour after minute 5 (for a
phase under 10 minutes: after the first 20%, not conclusive), descriptors, threads and processes
keep their baseline. "Nothing lost", per phase, after qd-run exited: the store holds exactly the
candidates its events committed (the last commit's evaluation count and the sum of the commits'
batches); on Ray an evaluation whose node was lost is retried once elsewhere, and one lost twice
is stored failed with the reason (counted apart), never dropped.

Usage::

    python bench/soak.py                                            # an hour, three phases
    python bench/soak.py --minutes 3 --interval 5 --kill-every 30   # smoke run
    python bench/soak.py --phases function_fit --fault-every 0      # function_fit at full speed
    python bench/soak.py --results bench/RESULTS.md                 # also write the section

Ctrl-C (or SIGTERM) stops early: the running qd-run is interrupted, everything started here is
stopped, and the samples so far are reported. Samples and verdicts go to ``--out`` as JSON
(default /tmp/qd_soak.json, one entry per phase); a Markdown section for bench/RESULTS.md is
printed (and written there with ``--results``). Extra arguments are passed to every phase's
qd-run as overrides.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "tests", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import soak_answers  # noqa: E402  (its replies are unpickled by name in the server's process)
from soak_proc import LONG_LIVED_S, accounted, last_event, sample, stop_qd  # noqa: E402
from soak_verdict import CONCLUSIVE_MIN, mark_stopping, table, verdict  # noqa: E402

TITLE = "## Soak: an hour of qd-run with faults, agents calling the model, Ray nodes lost (bench/soak.py)"
# The section this one replaces (the soak before its agent and ray phases), where it is still found
REPLACES = "## Soak: function_fit for an hour with faults (bench/soak.py)"
SHARES = {"function_fit": 0.5, "agent": 0.25, "ray": 0.25}


def split_minutes(minutes: float, phases: list[str]) -> dict[str, float]:
    """Each phase's minutes: ``SHARES`` renormalised over the phases run."""
    total = sum(SHARES[p] for p in phases)
    return {p: minutes * SHARES[p] / total for p in phases}


def phase_overrides(name: str, in_flight: int, address: str | None) -> list[str]:
    """What a phase's qd-run runs, beyond the model and the time budget."""
    fit = [
        "experiment=function_fit",
        f"runner.in_flight={in_flight}",
        f"llm.concurrency={in_flight}",
        "sandbox.wall_s=1",
        "sandbox.cpu_s=1",
    ]
    if name == "function_fit":
        return fit
    if name == "agent":  # the experiment's own loop (generations of 6); a model that answers at once
        return ["experiment=agent_design", "sandbox.wall_s=20", "sandbox.cpu_s=20"]
    return [*fit, "runner=ray", f"runner.address={address}"]


def qd_command(base_url: str, minutes: float, run_dir: Path, overrides: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qd.run",
        overrides[0],
        "llm.provider=server",
        f"llm.base_url={base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "runner.max_llm_calls=null",
        "runner.max_evaluations=null",
        f"runner.max_seconds={minutes * 60:g}",
        "runner.progress=false",
        "llm.backoff_s=0.05",
        "llm.backoff_max_s=0.5",
        "llm.timeout_s=2",
        f"hydra.run.dir={run_dir}",
        *overrides[1:],
    ]


class NodeKiller:
    """The ray phase's faults: every ``every`` seconds after the first evaluation, kill the oldest
    node the run uses and start a fresh one in its place (in a thread: sampling keeps its pace),
    while the run keeps one of its own. The first kill comes no later than halfway from the first
    evaluation to the phase's end (``end_s`` after qd-run's start): a short phase whose start-up
    was slow still loses a node while the run dispatches, with time left to notice it."""

    def __init__(self, cluster, every: float, kills: int, end_s: float):
        self.cluster, self.every, self.kills, self.end_s = cluster, every, kills, end_s
        self.targets = list(cluster.workers)  # the nodes the run starts with
        self.first_eval: float | None = None
        self.log: list[dict] = []
        self._restart: threading.Thread | None = None

    def __call__(self, s: dict) -> None:
        if self.first_eval is None:
            self.first_eval = s["t"] if s["evals"] else None
            return
        due = self.first_eval + self.every * (len(self.log) + 1)
        if not self.log:
            due = min(due, (self.first_eval + self.end_s) / 2)
        if len(self.log) < self.kills and s["t"] >= due:
            self.join()  # one node starting at a time
            node = self.targets.pop(0)
            processes = self.cluster.kill_worker(node)
            self.log.append({"t": s["t"], "killed": node, "processes": processes})
            self._restart = threading.Thread(target=self.cluster.add_worker, daemon=True)
            self._restart.start()
            print(f"  {s['t']:7.1f}s: killed ray node {node} ({processes} processes); starting a fresh one")

    def join(self) -> None:
        if self._restart is not None:
            self._restart.join()


def run_qd(cmd: list[str], run_dir: Path, log_path: Path, minutes: float, interval: float, server_pid, tick):
    """qd-run ``cmd`` sampled every ``interval`` s until it exits (or overruns ``minutes`` by 3);
    returns (samples, exit status, processes it left behind, interrupted)."""
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
    seen: dict[int, int] = {}
    samples: list[dict] = []
    interrupted = False
    t0 = time.monotonic()
    deadline = t0 + minutes * 60 + 180  # startup and shutdown slack; then it is stopped
    print(
        "  time   rss MB  workers MB  fds  thr  procs  store MB  cache MB   evals  evals/s  load", flush=True
    )
    try:
        next_t = t0
        while proc.poll() is None and time.monotonic() < deadline:
            next_t += interval
            time.sleep(max(0.0, next_t - time.monotonic()))
            if proc.poll() is not None:
                break
            s = sample(t0, proc, run_dir, server_pid, seen)
            s["load1"] = round(os.getloadavg()[0], 2)
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
                f"{'-' if rate is None else f'{rate:.2f}':>8} {s['load1']:5.2f}",
                flush=True,
            )
            if tick is not None:
                tick(s)
    except KeyboardInterrupt:
        interrupted = True
        print("\nsoak: interrupted; stopping qd-run", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # cleanup is not interrupted half way
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = stop_qd(proc, seen)
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    return samples, proc.returncode, left, interrupted


def _every(n: int) -> str:
    return "every request" if n == 1 else f"1 request in {n}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _start_server(reply, fault_every: int):
    from scripted_llm import Rule, ScriptedLLM

    server = ScriptedLLM([Rule("", reply, rotation=soak_answers.fault_rotation(fault_every))], record=False)
    # The server ignores Ctrl-C (inherited SIG_IGN): this script stops it, after qd-run.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server.start(in_process=True)
    finally:
        signal.signal(signal.SIGINT, old)
    return server


def run_phase(name: str, minutes: float, interval: float, args, work: Path) -> dict:
    """One phase: its server (and cluster), its qd-run sampled, its verdict and its accounting."""
    from ray_nodes import LocalCluster

    run_dir, log_path = work / name / "run", work / name / "qd-run.log"
    log_path.parent.mkdir(parents=True)
    reply = soak_answers.agent_reply if name == "agent" else soak_answers.function_reply
    load0 = os.getloadavg()[0]
    server = _start_server(reply, args.fault_every)
    cluster, killer, kills = None, None, 0
    try:
        if name == "ray":
            kills = max(1, math.ceil(minutes * 60 / args.kill_every) - 1)  # the last within the run
            cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="qdsk", dir="/tmp")))
            for _ in range(kills + 1):
                cluster.add_worker()
            killer = NodeKiller(cluster, args.kill_every, kills, minutes * 60)
        cmd = qd_command(
            server.base_url,
            minutes,
            run_dir,
            phase_overrides(name, args.in_flight, cluster.address if cluster else None) + args.overrides,
        )
        print(
            f"soak phase {name}: {minutes:g} min, sample every {interval:g} s, run dir {run_dir}", flush=True
        )
        server_pid = server._proc.pid if server._proc is not None else None
        samples, rc, left, interrupted = run_qd(cmd, run_dir, log_path, minutes, interval, server_pid, killer)
        try:
            stats = server.stats()
        except OSError:
            stats = None
    finally:
        server.stop()
        if killer is not None:
            killer.join()
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    expected = samples and samples[-1]["t"] >= minutes * 60 - 2 * interval - 60
    mark_stopping(samples, minutes)
    res, lines = verdict(samples, minutes)
    ledger = accounted(run_dir)
    llm = (last_event(run_dir / "events.jsonl").get("llm") or {}).get("per_role") or {}
    res.update(
        phase=name,
        minutes=minutes,
        exit_status=rc,
        interrupted=interrupted,
        ended_early=not interrupted and (rc != 0 or not expected),
        left_behind=left,
        accounting=ledger,
        calls_by_role={role: c.get("calls") for role, c in llm.items()},
        nodes_lost_noticed=log_text.count("qd: ray: lost node"),
        kills=killer.log if killer else [],
        load1_start=load0,
        load1_end=os.getloadavg()[0],
    )
    lines += _phase_lines(res, stats, log_text)
    return {
        "qd_command": cmd,
        "verdict": res,
        "lines": lines,
        "server": stats,
        "samples": samples,
        "run_dir": str(run_dir),
    }


def _phase_lines(res: dict, stats: dict | None, log_text: str) -> list[str]:
    """The verdict's lines a phase adds: accounting, model calls by role, node losses, shutdown."""
    a = res["accounting"]
    lines = [
        f"- nothing lost: **{'yes' if a['nothing_lost'] else 'no'}**: the store holds {a['store_rows']:,} "
        f"candidates; events.jsonl committed {a['committed']:,} (last count {a['evaluations']:,})"
        + (
            f"; {a['failed_on_lost_nodes']} stored failed after losing two nodes"
            if a["failed_on_lost_nodes"]
            else ""
        )
    ]
    if res["calls_by_role"]:
        lines.append(
            "- model calls by role: " + ", ".join(f"{r} {n:,}" for r, n in res["calls_by_role"].items() if n)
        )
    if res["kills"]:
        lines.append(
            f"- ray nodes killed: {len(res['kills'])} (at "
            + ", ".join(f"{k['t'] / 60:.1f}" for k in res["kills"])
            + f" min), each replaced by a fresh node; qd-run noticed {res['nodes_lost_noticed']} lost"
        )
    if res["interrupted"]:
        lines.append("- interrupted (Ctrl-C or SIGTERM) before the end")
    if res["ended_early"]:
        ended = log_text.strip().splitlines()[-8:]
        stop = next((ln for ln in reversed(ended) if "qd-run: stopped" in ln or "Error" in ln), None)
        lines.append(
            f"- qd-run ended early or failed: exit status {res['exit_status']}"
            + (f", `{stop.strip()}`" if stop else "")
        )
    left = res["left_behind"]
    lines.append(
        f"- after qd-run exited: {len(left)} of its processes left behind"
        + (f" (pids {left}, killed)" if left else " (clean shutdown)")
    )
    if stats:
        lines.append(
            f"- scripted server answered {stats['requests']:,} chat requests "
            f"(max {stats['max_in_flight']} in flight)"
        )
    lines.append(
        f"- 1-min load average {res['load1_start']:.2f} at the start, {res['load1_end']:.2f} at the end"
    )
    return lines


def section(command: str, started: datetime.datetime, args, phases: dict[str, dict]) -> str:
    from _results import commit, versions

    out = [
        TITLE,
        "",
        f"- Command: `{command.strip()}`, commit {commit()}",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; phases "
        + ", ".join(f"{n} {p['verdict']['duration_s'] / 60:.1f} min" for n, p in phases.items()),
        f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}, shared with "
        "other jobs (the load column): growth and flatness are the figures, not throughput",
        f"- Versions: {versions('jax', 'openai', 'httpx', 'hydra-core', 'ray')}",
        "- Setup: a scripted server per phase (`tests/scripted_llm.py`, own process, no latency, bodies not "
        "kept), answers from `bench/soak_answers.py` derived from each request's seed, "
        + (
            f"{_every(args.fault_every)} a fault ({', '.join(soak_answers.FAULT_KINDS)} in turn)"
            if args.fault_every > 0
            else "no faults"
        )
        + "; qd-run as a subprocess with no budget but runner.max_seconds",
        "- Columns: rss = qd-run's VmRSS; workers = the sum over its lasting descendants (sandbox "
        "workers); fds = entries of /proc/PID/fd; procs = descendants alive for more than "
        f"{LONG_LIVED_S:g} s; store = store.sqlite + WAL; cache = llm_cache/ (grows by design); evals/s "
        "over the interval before the sample; load = the machine's 1-min load average; (stopping): after "
        "the time budget ran out, left out of the verdict.",
    ]
    for name, p in phases.items():
        cmd = " ".join(c if " " not in c else f'"{c}"' for c in p["qd_command"][1:])
        cmd = re.sub(r"(llm\.base_url|runner\.address)=\S+", r"\1=ADDRESS", cmd.replace(p["run_dir"], "RUN"))
        out += [
            "",
            f"### Phase {name}",
            "",
            f"`{cmd}`",
            "",
            table(p["samples"], max_rows=10),
            "",
            *p["lines"],
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="the whole soak, split among the phases")
    ap.add_argument("--phases", default="function_fit,agent,ray", help="comma-separated, in order")
    ap.add_argument(
        "--interval", type=float, default=None, help="seconds between samples (default 30; 5 under 10 min)"
    )
    ap.add_argument("--fault-every", type=int, default=5, help="every N-th request a fault (0: none)")
    ap.add_argument(
        "--in-flight", type=int, default=4, help="runner.in_flight and llm.concurrency (not agent)"
    )
    ap.add_argument("--kill-every", type=float, default=180.0, help="seconds between ray node kills")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "qd_soak.json")
    ap.add_argument("--results", type=Path, default=None, help="write the section into this RESULTS.md")
    ap.add_argument("--keep", action="store_true", help="keep qd's run directories")
    ap.add_argument("overrides", nargs="*", help="extra qd-run overrides for every phase")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(names) - set(SHARES))
    if unknown or not names:
        ap.error(f"--phases: unknown {unknown}; choose among {', '.join(SHARES)}")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (nohup, a script's &)
    started = datetime.datetime.now(datetime.timezone.utc)
    work = Path(tempfile.mkdtemp(prefix="qd_soak_"))
    phases: dict[str, dict] = {}
    for name, minutes in split_minutes(args.minutes, names).items():
        interval = args.interval or (30.0 if minutes >= CONCLUSIVE_MIN else 5.0)
        try:
            phases[name] = run_phase(name, minutes, interval, args, work)
        except KeyboardInterrupt:  # while a server or the cluster started: nothing sampled yet
            print(f"soak: interrupted while starting phase {name}", flush=True)
            break
        print(table(phases[name]["samples"]) + "\n\n" + "\n".join(phases[name]["lines"]) + "\n", flush=True)
        if phases[name]["verdict"]["interrupted"]:
            break
    command = "python bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = section(command, started, args, phases)
    print("\n----- Markdown for bench/RESULTS.md -----\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"command": command, "fault_every": args.fault_every, "phases": phases}, indent=1)
    )
    print(f"samples: {args.out}")
    if args.results:
        from _results import write_section

        headings = args.results.read_text().splitlines() if args.results.exists() else []
        write_section(
            args.results, REPLACES if REPLACES in headings and TITLE not in headings else TITLE, text
        )
        print(f"wrote {TITLE!r} into {args.results}")
    if args.keep:
        print(f"run dirs kept under: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    bad = [
        p
        for p in phases.values()
        if p["verdict"]["ended_early"] or not p["verdict"]["accounting"]["nothing_lost"]
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
