"""PIPELINE tests, not results: prompt_evolution, creative_writing and red_team run end to end, through
their table scripts, on a scripted capable model (``tests/capable_text.py``), so the paths that act on a
success run: prompts that beat the hand-written ones enter the archive and win held out, texts spread
over genre x tone cells, the BLEU gate rejects a near copy and the pairwise tiebreak gives a challenger
its cell. What the scripted model answers is written down in the tests' data: no number here says
anything about a real model.

One scripted server and one table run per experiment (module fixtures), the tests reading what it left.
"""

from __future__ import annotations

import json
from pathlib import Path

import capable_text
import pytest
from helpers import stored
from scripted_llm import Rule, ScriptedLLM

from operators.meta import HYPER, META
from qd import design_table
from qd.store import Store
from qd.task import load_module

pytestmark = pytest.mark.slow  # three table runs, each a few seconds (shared by the tests below)
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SEED_PROMPTS = load_module(
    EXPERIMENTS / "prompt_evolution" / "seeds.py", "success_text_pe_seeds"
).SEED_PROMPTS


@pytest.fixture(scope="module")
def server():
    with ScriptedLLM([Rule("", capable_text.answer)]) as llm:
        yield llm


def table(server, tmp_path_factory, experiment: str, *args: str) -> tuple[dict, Path, list[dict]]:
    """``experiments/<experiment>/table.py`` at small settings on the capable model: its result, its
    output folder and the requests it sent (each one a prompt the model knows)."""
    out = tmp_path_factory.mktemp(experiment)
    before = len(server.requests)
    argv = ["--base-url", server.base_url, "--model", "scripted", "--seeds", "0", "--out", str(out), *args]
    if experiment == "prompt_evolution":  # its table.py is design_table.main("prompt_evolution", argv)
        result = design_table.main(experiment, argv)
    else:
        script = load_module(EXPERIMENTS / experiment / "table.py", f"success_text_{experiment}_table")
        result = script.main(argv)
    requests = server.requests[before:]
    assert [r for r in requests if capable_text.role(r) is None] == []
    assert json.loads((out / "table.json").read_text())["rows"] == result["rows"]
    return result, out, requests


def roles(requests: list[dict]) -> set[str]:
    return {capable_text.role(r) for r in requests}


@pytest.fixture(scope="module")
def red_team(server, tmp_path_factory):
    return table(server, tmp_path_factory, "red_team", "--max-llm-calls", "90")


@pytest.fixture(scope="module")
def creative_writing(server, tmp_path_factory):
    return table(server, tmp_path_factory, "creative_writing", "--max-llm-calls", "40")


@pytest.fixture(scope="module")
def prompt_evolution(server, tmp_path_factory):
    """At 4 search problems, with the task's own descriptor axes: the embedding describer (which
    test_agent_prompt_runs.py runs) is not what this test is about and would cost most of its time."""
    return table(
        server,
        tmp_path_factory,
        "prompt_evolution",
        "--max-llm-calls",
        "60",
        "--held-out",
        "8",
        "experiment.params.search_items=4",
        "eval_llm.calls=4",
        "descriptor=task",
    )


def test_red_team_gate_rejects_near_copies_of_the_parent_unevaluated(red_team):
    _, out, requests = red_team
    run = out / "qd_archive" / "seed0"
    rows = [c for c in stored(run) if c.kind == "text"]
    rejected = [c for c in rows if c.error and "BLEU" in c.error]
    assert rejected and all(not c.valid and c.fitness is None for c in rejected)
    parents = {c.id: c.text.strip() for c in rows}
    for c in rejected:  # the capable attacker's near copy: its parent with a few words added
        assert c.text.strip().endswith(", please, right now.")
        assert any(c.text.startswith(parents[p].rstrip(".?!")) for p in c.parent_ids)
    with Store(run / "store.sqlite", readonly=True) as store:
        assert not any(store.traces.of(c.id) for c in rejected)  # the target was never asked
    assert {"attacker", "target", "pairwise"} <= roles(requests)


def test_red_team_tiebreak_gives_a_stronger_challenger_its_cell(red_team):
    result, out, _ = red_team
    rows = [c for c in stored(out / "qd_archive" / "seed0") if c.kind == "text"]
    founders = {c.text for c in rows if c.operator == "init"}
    won = [c for c in rows if (c.metrics or {}).get("tiebreak_won")]
    assert won, "no challenger won a tie"
    for c in won:  # the judge answered right: a shipped attack over a weaker incumbent of equal score
        assert c.text.strip() in capable_text.attacks() and c.text not in founders
        assert c.fitness > c.metrics["tiebreak_tied"]
    arms = {r["arm"]: r for r in result["rows"]}
    assert arms["qd archive"]["tiebreak_wins"] >= 1


def test_red_team_attacks_that_break_every_target_enter_and_the_table_reports_them(red_team):
    result, out, _ = red_team
    rows = [c for c in stored(out / "qd_archive" / "seed0") if c.kind == "text" and c.valid]
    best_founder = max(c.fitness for c in rows if c.operator == "init")
    assert any(c.fitness == 1.0 > best_founder for c in rows if c.operator != "init")
    arms = {r["arm"]: r for r in result["rows"]}
    assert arms["qd archive"]["success_rate"] >= arms["seed attacks"]["success_rate"]
    assert arms["no archive"]["final_archive"] == 1 < arms["qd archive"]["final_archive"]


def test_creative_writing_texts_fill_several_genre_tone_cells(creative_writing):
    result, out, requests = creative_writing
    runs = {r["arm"]: r for r in result["runs"]}
    assert runs["qdaif"]["archive"]["num_elites"] >= 5  # of the 5 x 5 genre x tone cells
    assert runs["quality_only"]["archive"]["num_elites"] == 1  # the control without axes: one cell
    rows = [c for c in stored(out / "qdaif" / "seed0") if c.kind == "text" and c.operator != "init"]
    written = {t["text"].strip(): t for t in capable_text.shipped("texts.json")}
    assert rows and all(c.valid and c.text.strip() in written for c in rows)
    for c in rows:  # the quality judge's digit is the fitness (/ 9)
        assert c.fitness == pytest.approx(written[c.text.strip()]["quality"] / 9)
    assert len({tuple(c.descriptor) for c in rows}) >= 3
    assert {"writer", "quality", "genre", "tone", "critic"} <= roles(requests)


def test_creative_writing_table_counts_high_quality_cells_and_right_judges(creative_writing):
    result, _, _ = creative_writing
    qdaif = next(r for r in result["rows"] if r["arm"] == "qdaif")
    assert qdaif["high_quality_cells"] >= 1  # texts above the best founder's quality
    for name, measured in result["agreement"].items():  # judges that answer right agree with the labels
        assert measured["n"] == 24 and measured["auc"] == 1.0, name


def test_prompt_evolution_prompts_beating_the_seeds_enter_and_win_held_out(prompt_evolution):
    result, out, requests = prompt_evolution
    rows = [c for c in stored(out / "seed0") if c.kind == "text" and c.valid]
    founders = [c for c in rows if c.operator == "init"]
    assert sorted(c.fitness for c in founders) == [0.0, 0.25, 0.5, 0.5, 0.5, 0.75]  # 0..3 skills of 4
    assert any(c.fitness == 1.0 and c.text.strip() not in SEED_PROMPTS for c in rows)
    best = result["rows"][-1]
    assert best["source"].startswith("seed 0: found")
    hand = [r["held_out_accuracy"] for r in result["rows"] if r["source"] == "hand-designed"]
    assert best["held_out_accuracy"] == 1.0 > max(hand)


def test_prompt_evolution_mutation_prompts_evolve_and_hyper_mutate(prompt_evolution):
    _, out, requests = prompt_evolution
    assert {"operator", "solver", "instruction", "meta_prompt"} <= roles(requests)
    rows = [c for c in stored(out / "seed0") if c.kind == "instruction" and c.valid]
    evolved = {c.operator: c.text.strip() for c in rows if c.operator in (META, HYPER)}
    shipped = capable_text.shipped("prompts.json")
    assert evolved.get(META) in shipped["instructions"]  # a new mutation instruction joined the pool
    assert evolved.get(HYPER) in shipped["meta_prompts"]  # ... and a new mutation prompt
