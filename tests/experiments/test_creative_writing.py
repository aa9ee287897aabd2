"""creative_writing (QDAIF): texts judged on the host, placed by AI feedback, against its controls
at equal budgets; the judge floor passes a scripted judge of known accuracy and fails a constant one."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import scripted_judges
from helpers import run_config, stored
from scripted_llm import Rule

from qd import judge_stats
from qd.evaluator import HostRunner, StagedEvaluator
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.llm.gateway import CallBudget
from qd.plan import compose
from qd.task import load_module, load_task

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "creative_writing"


def last_text(request: dict) -> str:
    return request["messages"][-1]["content"].rsplit("Text: ", 1)[-1]


def quality(request: dict) -> str:
    """The scripted quality judge: longer texts are better (a digit per four words)."""
    return str(min(9, len(last_text(request).split()) // 4))


def writer(request: dict) -> str:
    """The scripted writer: a new text per sample (its seed); one in four empty, one in four too long."""
    seed = int(request.get("seed") or 0)
    if seed % 4 == 0:
        return "```text\n   \n```"
    if seed % 4 == 1:
        return "```text\n" + "and then it rained again " * 14 + "\n```"
    if seed % 2:
        return f"```text\nVerse {seed}: the sun is bright\nthe sea is wide and the gulls sing\n```"
    return f"```text\nStory {seed}. The rain fell on the town all night, and nobody came to the station.\n```"


RULES = [
    Rule("How good is this short piece", quality),
    Rule("literary critic", "4"),
    Rule("poem or a story", lambda r: "2" if "\n" in last_text(r).strip() else "7"),
    Rule("How happy is the tone", lambda r: "8" if "sun" in last_text(r) else "1"),
    Rule("", writer),
]


def config(base_url: str, *overrides: str):
    return compose(
        [
            "experiment=creative_writing",
            "llm.provider=server",
            f"llm.base_url={base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "llm.timeout_s=10",
            "runner.progress=false",
            *overrides,
        ]
    )


def test_text_is_judged_on_the_host_and_empty_or_long_texts_are_invalid_without_a_call(scripted_llm):
    top = {"6": math.log(0.5), "8": math.log(0.3), "The": math.log(0.2)}  # expected digit (6*.5 + 8*.3) / .8
    server = scripted_llm([Rule("How good is this short piece", "6", logprobs=[top])])
    task = load_task("creative_writing", {"max_chars": 60})
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("judge"),), timeout_s=5.0))
    evaluator = StagedEvaluator(
        task, HostRunner(task.host_entry), client, CallBudget(calls=1, tokens=4000, max_tokens=1)
    )

    async def go():
        try:
            return await evaluator(["Rain on the roof,\nsleep in the house.\n", "", " \n\t ", "x" * 61])
        finally:
            evaluator.close()
            await client.aclose()

    ev = asyncio.run(go())
    assert ev.valid.tolist() == [True, False, False, False]
    assert ev.fitness[0] == pytest.approx(6.75 / 9) and ev.metrics[0]["lines"] == 2
    assert "empty text" in ev.error[1] and "empty text" in ev.error[2]
    assert "61 characters (at most 60)" in ev.error[3]
    assert len(server.requests) == 1 and server.requests[0]["top_logprobs"] == 10  # bad texts cost no call
    with pytest.raises(Exception, match="experiment.params.max_chars"):
        load_task("creative_writing", {"max_chars": 5})


def test_qdaif_run_judges_quality_and_places_texts_on_genre_and_tone_within_budget(tmp_path, scripted_llm):
    server = scripted_llm(RULES)
    summary = run_config(
        config(server.base_url, "runner.max_llm_calls=60", "experiment.params.max_chars=300"), tmp_path
    )
    rows = [c for c in stored(tmp_path) if c.kind == "text"]
    founders = [c for c in rows if c.operator == "init"]
    assert {c.genome for c in rows} == {"text"} and len(founders) == 6 and all(c.valid for c in founders)
    for c in rows:
        if c.valid:
            assert c.fitness == pytest.approx(min(9, len(c.text.strip().split()) // 4) / 9)
    errors = [c.error or "" for c in rows if not c.valid]
    assert any("empty code block" in e for e in errors)  # an empty answer, with its reason
    assert any("(at most 300); write a shorter piece" in e for e in errors)  # judged too long, no call
    llm = summary["llm"]
    assert llm["calls"] <= 60 and {"operator", "agent", "judge"} <= set(llm["per_role"])
    assert summary["descriptor"]["fits"] >= 1 and summary["global"]["num_elites"] >= 2
    assert not any("literary critic" in m["content"] for r in server.requests for m in r["messages"])


def test_table_runs_every_arm_at_one_budget_and_reports_both_judges_and_agreement(tmp_path, scripted_llm):
    server = scripted_llm(RULES)
    table = load_module(EXPERIMENT / "table.py", "experiments_creative_writing_table")
    result = table.main(
        [
            "--base-url",
            server.base_url,
            "--model",
            "scripted",
            "--seeds",
            "0",
            "--max-llm-calls",
            "40",
            "--out",
            str(tmp_path),
        ]
    )
    assert [r["arm"] for r in result["rows"]] == ["qdaif", "quality_only", "random", "fewshot"]
    for run in result["runs"]:
        assert 40 - 4 * 6 <= run["llm_calls"] <= 40, run  # every arm within one batch of texts of the budget
    for r in result["rows"]:
        for m in table.METRICS:
            lo, hi = r[m + "_ci95"]
            assert lo <= r[m] <= hi
        assert 0 < r["coverage"] <= 1 and r["held_out_qd_score"] == pytest.approx(4 / 9 * r["coverage"] * 25)
    archives = {r["arm"]: r.get("archive") for r in result["runs"]}
    assert archives["quality_only"]["num_elites"] == 1 and archives["qdaif"]["num_elites"] >= 1
    assert set(result["agreement"]) == {"quality", "quality (held-out judge)", "genre", "tone"}
    assert all(a["n"] == 24 for a in result["agreement"].values())
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == result["rows"]
    asked = [" ".join(m["content"] for m in r["messages"]) for r in server.requests]
    last_writer = max(i for i, text in enumerate(asked) if "Answer with the text only" in text)
    assert all("literary critic" not in text for text in asked[:last_writer])  # held out until every arm ran
    for phrase in (
        "Write a new text: a short poem",
        "Write a new text like these",
    ):  # the controls' fixed prompts
        prompts = [t for t in asked if phrase in t]
        assert prompts and all("Current text" not in t for t in prompts)  # no parent: no selection


judges = load_module(EXPERIMENT / "judges.py", "experiments_creative_writing_judges")
LABELLED = {r["text"].strip(): r for r in judges.labelled()}
WRONG = scripted_judges.wrong_on(LABELLED)
ASKED = {"literary critic": "quality", "How good": "quality", "poem or a story": "genre", "How happy": "tone"}


def knows_the_labels(request: dict) -> str:
    """A judge right on 80 % of the labelled texts (the same texts for every axis): the labelled end's
    digit, the other end's on the texts ``WRONG`` names."""
    asked = request["messages"][-1]["content"]
    text = last_text(request).strip()
    label = LABELLED[text][next(axis for key, axis in ASKED.items() if key in asked)]
    return "8" if label != (text in WRONG) else "1"


@pytest.mark.parametrize(
    ("reply", "clears"),
    [
        pytest.param(knows_the_labels, True, id="80%-right"),
        pytest.param("5", False, id="constant"),
        pytest.param("A", False, id="always-A"),
    ],
)
def test_the_judge_floor_passes_a_judge_of_known_accuracy_and_fails_one_that_ignores_the_text(
    scripted_llm, reply, clears
):
    """Every judge a run or the table asks (quality, held-out quality, genre, tone) on the shipped
    labels, through the AI-feedback machinery, against ``qd.judge_stats.above_chance``. The embedded
    model's numbers are printed by ``judges.py`` and stated in the README, not floored."""
    server = scripted_llm([Rule("", reply)])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("judge"),), timeout_s=10))
    measured = asyncio.run(judges.measure(client))
    print(json.dumps({name: (m["auc"], m["auc_ci95"]) for name, m in measured.items()}))
    assert set(measured) == {"quality", "quality (held-out judge)", "genre", "tone"}
    assert {name: judge_stats.above_chance(m) for name, m in measured.items()} == dict.fromkeys(
        measured, clears
    )
    if reply is knows_the_labels:  # the accuracy it was built with, on every axis
        assert {m["accuracy"] for m in measured.values()} == {1 - len(WRONG) / len(LABELLED)} == {19 / 24}
