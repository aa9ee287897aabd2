"""One LLM failure policy, seen from outside: `qd-run` against a flaky, a dead and a refusing server.

A failed call fails only its child (stored invalid, not counted as answered);
the run stops, cleanly and with a checkpoint, only when the server refuses the
key or model, or answers nothing for ``llm.give_up_after_s``.
"""

import contextlib
import json
import re
import sqlite3
import subprocess
import sys
import time

from scripted_llm import Rule

PROGRAMS = [f"```python\ndef f(x):\n    return x * x + {k}.0\n```" for k in range(7)]
# 6 of every 7 requests fail, in turn: rate limit, server error, a hang past the timeout,
# a truncated body, a reply not in the chat shape, no choices; then one valid answer.
FLAKY = ("429", "500", "hang", "bad_json", "wrong_shape", "empty_choices", None)


def varied(request: dict) -> str:
    return PROGRAMS[int(request.get("seed") or 0) % len(PROGRAMS)]


def qd_run(base_url: str, run_dir, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qd.run",
        "--json",
        "experiment=function_fit",
        "llm.provider=server",
        f"llm.base_url={base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "llm.backoff_s=0.01",
        "llm.backoff_max_s=0.02",
        "llm.timeout_s=0.5",
        "runner.progress=false",
        "runner.in_flight=2",
        "operators.mix=[{name: rewrite}]",
        "sandbox.wall_s=2",
        "sandbox.cpu_s=2",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def rows(run_dir) -> list[tuple]:
    """(operator, model, valid, error) of every stored candidate (none while the store is being made)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{run_dir / 'store.sqlite'}?mode=ro", uri=True)) as db:
            return db.execute("SELECT operator, model, valid, error FROM candidates ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # no file or no table yet
        return []


def llm_line(stdout: str) -> dict:
    """The ledger in ``qd-run --json``'s summary line (its last line on stdout)."""
    return json.loads(stdout.strip().splitlines()[-1])["llm"]


def test_a_flaky_server_is_ridden_out_to_the_call_budget(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", varied, rotation=FLAKY)])
    # 3 retries: 4 attempts, so a call that starts at the top of the rotation fails for good
    proc = subprocess.run(
        qd_run(server.base_url, tmp_path, "runner.max_llm_calls=6", "llm.max_retries=3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = llm_line(proc.stdout)
    children = [r for r in rows(tmp_path) if r[0] == "rewrite"]
    answered = [r for r in children if r[1] is not None]
    failed = [r for r in children if r[1] is None]
    assert ledger["calls"] == 6 == len(answered)  # every answered child stored, the budget reached
    assert ledger["failed_calls"] == len(failed) > 0  # failed calls fail their children, which are stored
    assert all(r[3].startswith("llm: ") and "after 3 retries" in r[3] and not r[2] for r in failed)
    assert ledger["retries"] > 0 and server.stats()["requests"] >= 7 * 6 - 7
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["llm"]["per_role"]["operator"]["calls"] == 6


def test_a_server_gone_for_good_stops_the_run_after_give_up_after_s(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", varied)], latency_s=0.05)
    proc = subprocess.Popen(
        qd_run(server.base_url, tmp_path, "runner.max_llm_calls=1000", "llm.give_up_after_s=2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(r[1] is not None for r in rows(tmp_path)) >= 2:
            break
        time.sleep(0.1)
    server.stop()
    stopped = time.monotonic()
    out, err = proc.communicate(timeout=120)
    waited = time.monotonic() - stopped
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    quiet = re.search(r"answered no call for (\d+)s", last)
    assert last.startswith("qd-run: stopped: llm: ") and quiet and int(quiet[1]) >= 2, last
    assert 2 <= waited < 30
    assert (tmp_path / "checkpoints" / "checkpoint.npz").exists()
    answered = [r for r in rows(tmp_path) if r[1] is not None]
    assert len(answered) >= 2 and llm_line(out)["calls"] == len(answered)  # what was answered is kept


def test_a_refused_key_stops_the_run_at_once(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", fault="401")])
    started = time.monotonic()
    proc = subprocess.run(
        qd_run(server.base_url, tmp_path, "runner.max_llm_calls=100"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("qd-run: stopped: llm: ") and "refused the API key (HTTP 401" in last, last
    assert server.stats()["requests"] <= 2  # one per call in flight, never retried
    assert time.monotonic() - started < 60
