"""The design table: seeded runs of an experiment, then each run's best design and every hand-designed
one scored on held-out problems no run saw (a scripted model server: no real model)."""

import json

from scripted_llm import Rule

from qd import design_table
from qd.task import load_task


def test_the_table_scores_the_best_found_and_each_hand_designed_genome_held_out(tmp_path, scripted_llm):
    server = scripted_llm(
        [Rule("write instructions|Instruction:|improve instructions", "Be brief."), Rule("", "Answer: 12")]
    )
    result = design_table.main(
        "prompt_evolution",
        [
            "--base-url",
            server.base_url,
            "--model",
            "scripted",
            "--seeds",
            "0",
            "--held-out",
            "6",
            "--max-llm-calls",
            "30",
            "--out",
            str(tmp_path),
            "experiment.params.search_items=2",
            "eval_llm.calls=2",
        ],
    )
    rows = result["rows"]
    assert [r["source"] for r in rows[:6]] == ["hand-designed"] * 6 and rows[6][
        "name"
    ] == "best of run seed 0"
    for r in rows:
        lo, hi = r["ci95"]
        assert 0 <= lo <= r["held_out_accuracy"] <= hi <= 1 and r["calls_per_problem"] == 1.0
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == rows
    held_out = load_task("prompt_evolution", {"held_out_items": 6}).held_out()
    asked = [r["messages"][-1]["content"] for r in server.requests]
    assert sum(p.question in asked for p in held_out) == 6  # the table, after the run, asks them
