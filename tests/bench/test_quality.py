"""``bench/quality.py --quick``: every run of the quick bench gets its row, within budget, and a
rerun resumes from the JSON-lines file instead of running again. Its runs: qd and both controls
on function_fit, the two qd variants' ``qd.optimize`` switches on the prompt task, and
ShinkaEvolve on function_fit when ``QD_PEER_PYTHON`` names the peers' interpreter (a venv with
``shinka-evolve``; without it the row says why it did not run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK = {
    ("qd", "function_fit"): 6,
    ("best-of-N", "function_fit"): 6,
    ("restarts", "function_fit"): 6,
    ("shinka", "function_fit"): 6,
    ("qd+memory", "prompt"): 60,
    ("qd+agent", "prompt"): 60,
}
PEER_PYTHON = os.environ.get("QD_PEER_PYTHON")


def quick(tmp_path: Path) -> subprocess.CompletedProcess:
    peer = ["--peer-python", PEER_PYTHON] if PEER_PYTHON else []
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "quality.py"),
            "--quick",
            "--jsonl",
            str(tmp_path / "runs.jsonl"),
            "--json",
            str(tmp_path / "summary.json"),
            *peer,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_quick_bench_reports_every_run_within_budget_and_resumes(tmp_path):
    first = quick(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {(r["system"], r["task"]): r for r in summary["rows"]}
    assert set(rows) == set(QUICK)
    ran = {key for key in QUICK if PEER_PYTHON or key[0] != "shinka"}
    for key in ran:
        assert rows[key]["runs"] == 1, rows[key]
    if not PEER_PYTHON:
        assert "--peer-python" in rows[("shinka", "function_fit")]["why_not"]
    for run in summary["runs"]:
        budget = QUICK[(run["system"], run["task"])]
        # counted by the server, alike for all: calls spent, none beyond the budget
        assert 0 < run["calls"] <= budget and run["budget_calls"] <= budget, run
        assert run["heldout_best"] is not None and run["qd_score"] > 0, run
        assert run["valid_frac"] == 1.0, run  # the scripted server answers valid programs only
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == len(ran)
    again = quick(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 runs to do" in again.stdout
    assert (tmp_path / "runs.jsonl").read_text().splitlines() == lines
