"""``bench/quality.py --quick``: every system of the quick bench gets its row, within budget, and a
rerun resumes from the JSON-lines file instead of running again."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK = ("qd", "best-of-N", "restarts")


def quick(tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "quality.py"),
            "--quick",
            "--jsonl",
            str(tmp_path / "runs.jsonl"),
            "--json",
            str(tmp_path / "summary.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_quick_bench_reports_every_system_within_budget_and_resumes(tmp_path):
    first = quick(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {(r["system"], r["task"]): r for r in summary["rows"]}
    assert {s for s, _ in rows} == set(QUICK)
    for system in QUICK:
        row = rows[(system, "function_fit")]
        assert row["runs"] == 1, row
    for run in summary["runs"]:
        # counted by the server, alike for all: every call of the budget spent, none beyond it
        assert 0 < run["calls"] <= 6 and run["budget_calls"] <= 6, run
        assert run["heldout_best"] is not None and run["qd_score"] > 0, run
        assert run["valid_frac"] == 1.0, run  # the scripted server answers valid programs only
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == len(QUICK)
    again = quick(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 runs to do" in again.stdout
    assert (tmp_path / "runs.jsonl").read_text().splitlines() == lines
