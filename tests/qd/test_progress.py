"""The progress a person reads: the bar against the budget that binds, fitted to the terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qd.progress import SEPARATOR, Gauge, Status, binding, clock, eta, fit

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("best -0.01234", "coverage 12.5%", "QD score 345.6", "3.2 evals/s", "2 failed", "$0.0123")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def status(gauge: Gauge, fields: tuple[str, ...] = FIELDS) -> Status:
    return Status(gauge, fields, "plain line")


def kept_fields(line: str) -> list[str]:
    """The fields of a fitted line, its bar left out."""
    return line.lstrip("━─ ").split(SEPARATOR)


@pytest.mark.parametrize("width", [40, 80, 120, 200])
def test_the_line_fits_the_width_and_drops_whole_fields_last_first(width):
    full = status(Gauge("LLM calls", 12, 20, 95.0))
    line = fit(full, width)
    assert len(line) <= width
    everything = ["12/20 LLM calls", "ETA 1:35", *FIELDS]
    kept = kept_fields(line)
    assert kept == everything[: len(kept)]  # whole fields, most important first: no word cut
    assert kept[0] == "12/20 LLM calls"
    assert line.startswith("━") == (width >= 80)  # the bar, where the count, ETA and best leave room
    assert (kept == everything) == (width == 200)


@given(
    width=st.integers(1, 200),
    fields=st.lists(st.text("abc %.-", min_size=1, max_size=20).map(str.strip).filter(bool), max_size=8),
    done=st.integers(0, 500),
)
def test_any_width_gets_a_line_no_longer_made_of_whole_words(width, fields, done):
    line = fit(status(Gauge("evaluations", done, 500, 12.0), tuple(fields)), width)
    assert len(line) <= width
    words = set(" ".join([SEPARATOR, f"{done}/500 evaluations", "ETA 12s", *fields]).split())
    assert all(w.strip("━─") in words or not w.strip("━─") for w in line.split())


def test_the_bar_shows_the_spent_share():
    line = fit(status(Gauge("evaluations", 25, 100), ()), 40)
    bar = line.split(" ")[0]
    assert len(line) <= 40 and bar.count("━") == round(0.25 * len(bar)) and set(bar) == {"━", "─"}


def test_no_limit_shows_the_count_alone_without_a_bar():
    line = fit(status(Gauge("evaluations", 7), ("best 1",)), 80)
    assert line == f"7 evaluations{SEPARATOR}best 1"


def test_the_binding_budget_is_the_largest_spent_share():
    evals, calls = Gauge("evaluations", 10, 100), Gauge("LLM calls", 12, 20)
    assert binding([evals, calls, Gauge("seconds", 5.0, None)]) is calls
    assert binding([Gauge("evaluations", 10), Gauge("seconds", 5.0)]).unit == "evaluations"
    assert binding([Gauge("evaluations", 10), Gauge("cost", 0.5, 1.0)]).unit == "cost"


def test_counts_eta_and_clock_read_as_a_person_reads_them():
    assert Gauge("cost", 0.125, 1.0).count() == "$0.125/$1"
    assert Gauge("seconds", 65.0, 300.0).count() == "1:05/5:00"
    assert Gauge("LLM calls", 3, 80).count() == "3/80 LLM calls"
    assert eta(done=30, total=80, done_then=10, seconds=20.0) == pytest.approx(50.0)
    assert eta(done=10, total=80, done_then=10, seconds=20.0) is None  # no pace yet
    assert eta(done=10, total=None, done_then=0, seconds=20.0) is None
    assert [clock(s) for s in (4.2, 187, 3723)] == ["4s", "3:07", "1:02:03"]


def read_pty(command: list[str], columns: int, timeout: float) -> str:
    """What ``command`` shows on a ``columns``-wide terminal (ANSI codes stripped, each redraw a line)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": str(columns)}
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    out, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return ANSI.sub("", out.decode(errors="replace")).replace("\r", "\n")


@pytest.mark.slow
def test_qd_run_draws_the_llm_call_budget_on_a_terminal_and_ends_with_readable_lines(tmp_path, scripted_llm):
    from helpers import varied_program
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    run_dir = tmp_path / "run"
    command = [
        *(sys.executable, "-m", "qd.run", "experiment=function_fit", "llm.provider=server"),
        *(f"llm.base_url={server.base_url}", "llm.models=[{name: scripted}]", "llm.api_key_env=null"),
        *("runner.max_llm_calls=20", "runner.in_flight=2", "runner.workers=2", "sandbox.wall_s=2"),
        *("operators.mix=[{name: rewrite}]", f"hydra.run.dir={run_dir}"),
    ]
    shown = read_pty(command, 100, 240)
    counts = [int(n) for n in re.findall(r"\b(\d+)/20 LLM calls\b", shown)]
    assert any(n > 0 for n in counts), shown[-3000:]
    assert all(len(line) <= 100 for line in shown.splitlines() if "/20 LLM calls" in line)
    for row in ("LLM calls +20 ", "coverage +\\d", "QD score +-?\\d", "tokens +\\d", f"run dir +{run_dir}$"):
        assert re.search(f"^{row}", shown, re.M), (row, shown[-3000:])
    assert "summary=" not in shown and "llm=" not in shown  # the JSON stays in events.jsonl
