"""PIPELINE tests, never results: agent_design, agent_team and ``qd committee`` run end to end on a
scripted *capable* model (``tests/capable_llm.py``), so the paths a real success takes run in the suite.

SmolLM2-135M almost never writes a usable agent or team, so without these the archive never takes a
high-scoring design an operator wrote, the duplicate-role check never rejects a team an operator
proposed, and a committee never outvotes its best member. The numbers here say only that the
machinery acts on successes: the scripted model's answers are drawn from shipped sets and a hash.
"""

import json
from pathlib import Path

import capable_llm
import pytest
from helpers import on_server, run_config, stored
from scripted_llm import Rule, ScriptedLLM

from qd import committee
from qd.api import elites
from qd.plan import compose
from qd.task import load_module

# every test here runs an experiment, or reads one the module runs (20 s of sandboxed evaluations)
pytestmark = pytest.mark.slow

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
OPERATORS = ("meta_agent", "rewrite", "crossover")


@pytest.fixture(scope="module")
def capable():
    """One scripted capable model for the whole module."""
    server = ScriptedLLM([Rule("", capable_llm.reply)]).start()
    yield server
    server.stop()


def config(base_url: str, experiment: str, *overrides: str):
    return compose(
        [
            f"experiment={experiment}",
            *on_server(base_url),
            "llm.timeout_s=10",
            "experiment.params.search_items=4",
            *overrides,
        ]
    )


BUDGET = "runner.max_llm_calls=80"  # a generation or two of children after the founders


@pytest.fixture(scope="module")
def design_run(capable, tmp_path_factory):
    """A finished agent_design run on the capable model: the six hand-designed founders, then one
    generation of designs the operators wrote."""
    path = tmp_path_factory.mktemp("success_design") / "run"
    run_config(config(capable.base_url, "agent_design", BUDGET), path)
    return path


def test_designs_the_operators_wrote_score_high_and_enter_the_archive(design_run):
    """PIPELINE test: valid agents from the operators reach high search accuracy and become elites."""
    rows = [c for c in stored(design_run) if c.kind == "text"]
    written = [c for c in rows if c.operator in OPERATORS]
    assert written and all(c.valid for c in written), [c.error for c in written]
    assert {c.text.strip() for c in written} <= {a.strip() for a in capable_llm.AGENTS.values()}
    placed = [e for e in elites(design_run) if e.candidate.operator in OPERATORS]
    assert placed and max(e.fitness for e in placed) >= 0.75
    assert all(e.candidate.metrics["model_calls"] > 0 for e in placed)


@pytest.mark.parametrize("rule", ["vote", "judge"])
def test_a_committee_of_the_elites_beats_its_best_member(design_run, capable, capsys, rule):
    """PIPELINE test: the best elite on the search problems is the hand-designed ``python_compute``,
    whose parser misses the held-out statement forms; the diverse elites err on different held-out
    problems, so the committee's vote (or the judge's pick) beats it."""
    committee.main(
        [str(design_run), "--k", "3", "--held-out", "12", "--rule", rule, "--json"]
        + ["--base-url", capable.base_url, "--model", "scripted"]
    )
    out = json.loads(capsys.readouterr().out)
    combined, best, _ = out["rows"]
    assert combined["row"] == f"committee ({rule})" and best["row"] == "best elite"
    assert combined["accuracy"] > best["accuracy"] and combined["accuracy"] >= 0.75, out
    assert out["judge_calls"] == (12 if rule == "judge" else 0)


@pytest.fixture(scope="module")
def team_run(capable, tmp_path_factory):
    path = tmp_path_factory.mktemp("success_team") / "run"
    run_config(config(capable.base_url, "agent_team", BUDGET), path)
    return path


def test_a_duplicated_team_is_rejected_while_good_teams_enter(team_run):
    """PIPELINE test: the duplicate-role check acts on a proposed team whose two roles do one job;
    the teams whose roles differ are valid, beat the single expert and become elites."""
    rows = [c for c in stored(team_run) if c.kind == "text"]
    rejected = [c for c in rows if c.text.strip() in capable_llm.DUPLICATED]
    assert rejected and all(
        not c.valid and c.error == "role 'reviewer' duplicates role 'checker'" for c in rejected
    )
    founder = next(c for c in rows if c.operator == "init")
    placed = [e for e in elites(team_run) if e.candidate.metrics["roles"] > 1]
    assert placed and max(e.fitness for e in placed) > founder.fitness
    assert {e.candidate.text.strip() for e in placed} <= set(capable_llm.TEAMS) - set(capable_llm.DUPLICATED)


TABLE_ARGS = ["--seeds", "0", "--held-out", "4", "--max-llm-calls", "40", "experiment.params.search_items=2"]


@pytest.mark.parametrize("experiment", ["agent_design", "agent_team"])
def test_the_table_script_runs_on_the_capable_model(experiment, capable, tmp_path):
    """PIPELINE test: the experiment's table script, at its smallest settings, writes its JSON."""
    table = load_module(EXPERIMENTS / experiment / "table.py", f"experiments_{experiment}_table")
    result = table.design_table.main(
        experiment,
        ["--base-url", capable.base_url, "--model", "scripted", "--out", str(tmp_path), *TABLE_ARGS],
        **({"baselines": table.best_hand_designed_agent} if experiment == "agent_team" else {}),
    )
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == result["rows"]
    best = next(r for r in result["rows"] if r["name"] == "best of run seed 0")
    assert best["search_accuracy"] >= 0.5 and best["held_out_accuracy"] >= 0.5
