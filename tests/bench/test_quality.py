"""``bench/quality.py --quick``: every run of the quick bench gets its row, within budget, and a
rerun resumes from the JSON-lines file instead of running again. Its runs: qd and both controls
on function_fit, the two qd variants' ``qd.optimize`` switches and best-of-N on the prompt task, and
the peers when ``QD_PEER_PYTHON`` names their interpreter (a venv with ``openevolve``, ``gepa`` and
``shinka-evolve``): ShinkaEvolve and GEPA on function_fit, OpenEvolve and ShinkaEvolve on the prompt
task (without it each peer's row says why it did not run)."""

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
    ("gepa", "function_fit"): 6,
    ("qd+memory", "prompt"): 60,
    ("qd+agent", "prompt"): 60,
    ("best-of-N", "prompt"): 60,
    ("openevolve", "prompt"): 60,
    ("shinka", "prompt"): 60,
}
PEERS = {"shinka", "gepa", "openevolve"}
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
    ran = {key for key in QUICK if PEER_PYTHON or key[0] not in PEERS}
    for key in ran:
        assert rows[key]["runs"] == 1, rows[key]
    for key in set(QUICK) - ran:
        assert "--peer-python" in rows[key]["why_not"]
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


def _quality():
    sys.path.insert(0, str(ROOT / "bench"))
    import quality

    return quality


def _run(system, task, seed, heldout, qd_score, best_text="def f(x): return x", best_seed=0.0):
    return {
        "system": system,
        "task": task,
        "seed": seed,
        "heldout_best": heldout,
        "best_seed": best_seed,
        "qd_score": qd_score,
        "best_text": best_text,
        "valid_frac": 0.5,
    }


def test_a_seed_rescored_higher_is_no_improvement_and_a_new_better_program_is():
    quality = _quality()
    seed = "def f(x):\n    return x\n"
    runs = [
        _run("qd", "function_fit", 0, 1.0, 5.0, best_text="def f(x):  return x"),  # the seed, noise
        _run("qd", "function_fit", 1, 1.0, 5.0, best_text="def f(x): return 2 * x"),  # new and better
        _run("qd", "function_fit", 2, -1.0, 5.0, best_text="def f(x): return 3 * x"),  # new, worse
    ]
    assert quality.beat_seeds(runs, (seed,)) == "1 of 3"
    assert quality.beat_seeds([_run("qd", "prompt", 0, 0.5, 1.0)], ("a prompt",)) == "-"


def test_a_switch_pays_only_where_it_is_at_least_qd_on_every_task_and_the_defaults_follow():
    quality = _quality()
    lines = [_run("qd", "function_fit", s, -2.0, 100.0) for s in range(3)] + [
        _run("qd", "function_minimization", s, 1.4, 1.4) for s in range(3)
    ]
    lines += [_run("qd+memory", "function_fit", s, -1.0, 120.0) for s in range(3)]
    lines += [_run("qd+memory", "function_minimization", s, 1.4, 1.5) for s in range(3)]
    lines += [_run("qd+agent", "function_fit", s, -1.0, 90.0) for s in range(3)]  # better best, lower QD
    text = "\n".join(quality.effects(lines))
    assert "memory (`memory=on`) pays on every task measured (2 of 3 tasks)" in text
    assert "the agent operator does not pay on every task measured (1 of 3 tasks)" in text
    assert "held-out best -1.000 vs qd's -2.000, QD score 120.00 vs 100.00" in text
    ahead = quality.ahead_of_qd(lines)
    assert (
        ahead[0].startswith("- function_fit: ahead of qd") and "qd+memory (heldout_best, qd_score" in ahead[0]
    )
    assert "qd+agent (heldout_best; valid" in ahead[0]  # its QD score is below qd's: not named for it
    # memory is off by default: against a verdict that it pays, the report says so
    assert "disagrees" in quality.defaults_line(lines)
    lines = [ln for ln in lines if ln["system"] != "qd+memory"]
    assert quality.defaults_line(lines).endswith("each follows its verdict above.")
