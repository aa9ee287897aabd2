"""bench/soak.py's three phases for a few seconds each: every phase sampled and judged, nothing lost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_samples_and_judges_each_phase_and_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--minutes", "1.2", "--interval", "2", "--kill-every", "8"]
        + ["--fault-every", "5", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    phases = json.loads(out.read_text())["phases"]
    assert list(phases) == ["function_fit", "agent", "ray"]
    for name, phase in phases.items():
        verdict = phase["verdict"]
        assert len(phase["samples"]) >= 3 and phase["samples"][-1]["evals"], name
        assert {"rss_slope_mb_per_h", "fds", "threads", "procs", "flat"} <= set(verdict), name
        assert verdict["conclusive"] is False and not verdict["ended_early"], name
        ledger = verdict["accounting"]
        assert ledger["nothing_lost"] and ledger["store_rows"] == ledger["committed"] > 0, (name, ledger)
        assert verdict["left_behind"] == [], name
    # the agents called the model from the sandbox, beside the operators' calls
    agent_calls = {
        role: n for role, n in phases["agent"]["verdict"]["calls_by_role"].items() if role != "operator"
    }
    assert sum(agent_calls.values()) > 0, phases["agent"]["verdict"]["calls_by_role"]
    ray = phases["ray"]["verdict"]
    assert len(ray["kills"]) >= 1 and ray["nodes_lost_noticed"] >= 1, ray
