"""agent_team (EvoAgent): team genomes are checked data run by host code; a run grows teams from one expert;
the duplicate-role check's floor passes a check of known accuracy and fails one that never rejects."""

import asyncio
import json
from pathlib import Path

import pytest
import scripted_judges
from helpers import evaluate_on_host, run_config, stored
from scripted_llm import Rule

from qd import judge_stats
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.llm.gateway import CallBudget
from qd.plan import compose
from qd.store import Store
from qd.task import load_module, load_task

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "agent_team"
team = load_module(EXPERIMENT / "team.py", "experiments_agent_team_team")
judge = load_module(EXPERIMENT / "judge_agreement.py", "experiments_agent_team_judge_agreement")


def team_json(*instructions: str, merge: str = "sequential", model=None) -> str:
    roles = [{"name": f"r{i}", "instructions": text, "model": model} for i, text in enumerate(instructions)]
    return json.dumps({"merge": merge, "roles": roles})


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "(whole)"),
        ("[1, 2]", "(whole)"),
        ('{"merge": "sequential", "roles": [], "size": 1}', "size"),
        ('{"merge": "debate", "roles": [{"name": "a", "instructions": "x"}]}', "merge"),
        ('{"merge": "vote", "roles": []}', "roles"),
        (team_json(*"abcde"), "roles"),
        ('{"merge": "vote", "roles": "solver"}', "roles"),
        ('{"merge": "vote", "roles": ["solver"]}', "roles[0]"),
        ('{"merge": "vote", "roles": [{"name": "a", "instructions": 3}]}', "roles[0].instructions"),
        ('{"merge": "vote", "roles": [{"name": "", "instructions": "x"}]}', "roles[0].name"),
        (
            '{"merge": "vote", "roles": [{"name": "a", "instructions": "x", "temperature": 1}]}',
            "roles[0].temperature",
        ),
        (team_json("x", model="gpt-9"), "roles[0].model"),
        (
            '{"merge": "vote", "roles": '
            '[{"name": "a", "instructions": "x"}, {"name": "A", "instructions": "y"}]}',
            "roles[1].name",
        ),
    ],
)
def test_a_malformed_team_is_refused_with_one_line_naming_the_field(text, field):
    with pytest.raises(team.TeamError) as err:
        team.parse(text, ("smollm2",))
    assert (
        err.value.field == field
        and str(err.value).startswith(f"team: {field}: ")
        and "\n" not in str(err.value)
    )


def test_a_team_reads_its_roles_and_its_descriptors_come_from_the_genome():
    t = team.parse(
        team_json("solve it step by step", "check the answer", merge="vote", model="smollm2"), ("smollm2",)
    )
    assert t.merge == "vote" and [r.model for r in t.roles] == ["smollm2", "smollm2"]
    assert team.diversity(t) == 1.0  # no word in common
    assert team.diversity(team.parse(team_json("a b c d", "a b c e"))) == pytest.approx(1 - 3 / 5)
    assert team.diversity(team.parse(team_json("alone"))) == 0.0
    founder = load_task("agent_team", {"search_items": 2}).hand_designed()
    assert len(founder) == 1 and len(team.parse(founder[0][1]).roles) == 1  # one expert agent


def evaluate(
    server, texts: list[str], calls: int = 16, items: int = 2, models: tuple[str, ...] = ("scripted",)
):
    """The teams' evaluations through the real host runner and model gateway, on the scripted server."""
    task = load_task("agent_team", {"search_items": items, "model_names": list(models)})
    return task, evaluate_on_host(
        task, server.base_url, texts, CallBudget(calls=calls, max_tokens=96), models
    )


def solver(truth: dict[str, str], wrong_for: str = "liar"):
    """Right answers, except for a role whose instructions say ``wrong_for``; 'no' to duplicate checks."""

    def reply(request: dict) -> str:
        messages = request["messages"]
        if messages[0]["role"] == "user":
            return "No, they do different jobs."
        question = next((q for q in truth if messages[-1]["content"].startswith(q)), "")
        answer = truth.get(question, "")
        if wrong_for in messages[0]["content"]:
            answer = "A: knight, B: knight, C: knight" if answer.startswith("A:") else "-1"
        return f"Step by step... Answer: {answer}"

    return reply


def test_vote_takes_the_majority_and_sequential_the_last_refinement(scripted_llm):
    task = load_task("agent_team", {"search_items": 2})
    truth = {p.question: p.answer for p in task.search}
    server = scripted_llm([Rule("", solver(truth))])
    texts = [
        team_json("liar one", "honest two", "honest three", merge="vote"),
        team_json("honest one", "liar two", "liar three", merge="vote"),
        team_json("honest one", "then the liar", merge="sequential"),
        team_json("the liar first", "then the honest", merge="sequential"),
    ]
    task, ev = evaluate(server, texts)
    assert ev.valid.all() and list(ev.fitness) == [1.0, 0.0, 0.0, 1.0]
    assert [m["calls_per_problem"] for m in ev.metrics] == [
        4.5,
        4.5,
        2.5,
        2.5,
    ]  # 3 (2) roles + checks, per problem
    assert [m["check_calls"] for m in ev.metrics] == [3, 3, 1, 1]
    assert ev.descriptor[0].tolist() == [3.0, pytest.approx(team.diversity(team.parse(texts[0])))]
    refined = [r for r in server.requests if r["messages"][0]["content"] == "then the honest"]
    assert len(refined) == 2 and all("A teammate answered:" in r["messages"][-1]["content"] for r in refined)


def test_a_duplicate_role_makes_the_team_invalid_before_any_problem(scripted_llm):
    server = scripted_llm([Rule("Do these two roles do the same job", "Yes."), Rule("", "Answer: 3")])
    texts = [
        team_json("Solve it, step by step!", "solve it step by step"),  # the same words: no call
        team_json("solve the problem", "check the answer"),  # the model says yes
        '{"merge": "vote", "roles": [{"name": "a", "instructions": "x", "model": "gpt-9"}]}',
    ]
    _, ev = evaluate(server, texts)
    assert not ev.valid.any()
    assert ev.error[0] == "role 'r1' has the same instructions as role 'r0'"
    assert ev.error[1] == "role 'r1' duplicates role 'r0'"
    assert ev.error[2].startswith("team: roles[0].model: ") and "['scripted']" in ev.error[2]
    assert len(server.requests) == 1  # one check; no problem was solved, no call for the malformed team


def test_a_role_that_names_a_model_is_answered_by_that_model(scripted_llm):
    server = scripted_llm([Rule("", "No. Answer: 3")])
    text = json.dumps(
        {
            "merge": "sequential",
            "roles": [
                {"name": "a", "instructions": "solve", "model": "other"},
                {"name": "b", "instructions": "check", "model": None},
            ],
        }
    )
    _, ev = evaluate(server, [text], models=("scripted", "other"))
    assert ev.valid[0]
    pinned = [r for r in server.requests if r["messages"][0]["content"] == "solve"]
    assert len(pinned) == 2 and {r["model"] for r in pinned} == {"other"}


def test_when_the_budget_runs_out_each_problem_keeps_its_best_answer_so_far(scripted_llm):
    task = load_task("agent_team", {"search_items": 2})
    truth = {p.question: p.answer for p in task.search}
    server = scripted_llm([Rule("", solver(truth))])
    _, ev = evaluate(server, [team_json("honest one", "then the liar", "then the honest")], calls=6)
    # 3 checks, then 3 roles on the first problem; nothing is left for the second
    assert ev.valid[0] and ev.metrics[0]["correct"] == [1, 0] and ev.metrics[0]["failed_problems"] == 1


def grown(request: dict) -> str:
    """The operators' answer: the parent team with one more role (each sample its own), or an odd config."""
    seed = int(request.get("seed") or 0)
    if seed % 4 == 3:
        return '```json\n{"merge": "majority", "roles": []}\n```'
    prompt = request["messages"][-1]["content"]
    start = prompt.index("```json\n") + len("```json\n")
    parent = json.loads(prompt[start : prompt.index("```", start)])
    roles = parent["roles"][:3] + [
        {"name": f"role{seed}", "instructions": f"Method {seed}: check every step.", "model": None}
    ]
    return "```json\n" + json.dumps({"merge": "vote" if seed % 2 else "sequential", "roles": roles}) + "\n```"


def config(base_url: str, *overrides: str):
    return compose(
        [
            "experiment=agent_team",
            "llm.provider=server",
            f"llm.base_url={base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "llm.timeout_s=10",
            "runner.progress=false",
            "experiment.params.search_items=2",
            *overrides,
        ]
    )


def test_a_run_grows_teams_from_one_expert_within_its_budget(tmp_path, scripted_llm):
    server = scripted_llm(
        [
            Rule("You design teams of LLM agents", grown),
            Rule("Do these two roles do the same job", "No."),
            Rule("", "Answer: 9"),
        ]
    )
    summary = run_config(config(server.base_url, "runner.max_llm_calls=70", "eval_llm.calls=10"), tmp_path)
    rows = [c for c in stored(tmp_path) if c.kind == "text"]
    assert {c.genome for c in rows} == {"team"}
    founders = [c for c in rows if c.operator == "init"]
    assert len(founders) == 1 and founders[0].valid and founders[0].metrics["roles"] == 1
    teams = [c for c in rows if c.valid and c.metrics["roles"] > 1]
    assert any("Add ONE new role" in (c.prompt or "") for c in teams)  # the add_role mutation's template
    assert any(c.error and c.error.startswith("team: merge: ") for c in rows)  # refused, and not run
    assert 0 < summary["llm"]["calls"] <= 70 and summary["llm"]["per_role"]["agent"]["calls"] > 0
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        for c in teams:
            assert c.metrics["model_calls"] == len([t for t in store.traces.of(c.id) if "text" in t])
    held_out = load_task("agent_team", {"search_items": 2}).held_out()
    asked = "\n".join(m["content"] for r in server.requests for m in r["messages"])
    assert not [p.question for p in held_out if p.question in asked]


def test_the_table_scores_best_team_founder_and_best_hand_designed_agent_held_out(tmp_path, scripted_llm):
    server = scripted_llm(
        [
            Rule("You design teams of LLM agents", grown),
            Rule("Do these two roles do the same job", "No."),
            Rule("", "Answer: 12"),
        ]
    )
    table = load_module(EXPERIMENT / "table.py", "experiments_agent_team_table")
    result = table.design_table.main(
        "agent_team",
        [
            "--base-url",
            server.base_url,
            "--model",
            "scripted",
            "--seeds",
            "0",
            "--held-out",
            "4",
            "--max-llm-calls",
            "30",
            "--out",
            str(tmp_path),
            "experiment.params.search_items=2",
            "eval_llm.calls=6",
        ],
        baselines=table.best_hand_designed_agent,
    )
    names = [r["name"] for r in result["rows"]]
    assert names[0] == "single expert (founder)" and names[1].startswith("best hand-designed agent: ")
    assert names[2] == "best of run seed 0" and result["baselines"]["chosen"] in names[1]
    assert len(result["baselines"]["search"]) == 6 and result["baselines"]["search_calls"] > 0
    for r in result["rows"]:
        lo, hi = r["ci95"]
        assert (
            0 <= lo <= r["held_out_accuracy"] <= hi <= 1 and 0 < r["calls_per_problem"] <= 3
        )  # 6 calls / 2 items
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == result["rows"]


PAIRS = {
    team.duplicate_prompt(*roles): duplicate
    for a, b, duplicate in judge.LABELLED
    for roles in ((a, b), (b, a))
}  # both orders, as judge_agreement.measure asks them
WRONG = scripted_judges.wrong_on(PAIRS)


def knows_the_labels(request: dict) -> str:
    """A duplicate check right on 80 % of the labelled pairs (in either order)."""
    prompt = request["messages"][-1]["content"]
    return "Yes, the same job." if PAIRS[prompt] != (prompt in WRONG) else "No, different jobs."


@pytest.mark.parametrize(
    ("reply", "clears"),
    [
        pytest.param(knows_the_labels, True, id="80%-right"),
        pytest.param("No.", False, id="never-rejects"),
        pytest.param("Yes.", False, id="constant-yes"),
        pytest.param("A", False, id="always-A"),
    ],
)
def test_the_duplicate_check_floor_passes_a_check_of_known_accuracy_and_fails_one_that_ignores_the_roles(
    scripted_llm, reply, clears
):
    """The check as an evaluation asks it, on every labelled pair in both orders, against
    ``qd.judge_stats.above_chance``. The embedded model's numbers are printed by ``judge_agreement.py``
    and stated in the README, not floored."""
    server = scripted_llm([Rule("", reply)])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("judge"),), timeout_s=10))

    async def go():
        try:
            return await judge.measure(client)
        finally:
            await client.aclose()

    measured = asyncio.run(go())
    print(json.dumps(measured))
    assert measured["n"] == len(PAIRS) == 24 and judge_stats.above_chance(measured) is clears
    if reply is knows_the_labels:  # the accuracy it was built with
        assert (measured["forward"] + measured["reversed"]) / 2 == pytest.approx(1 - len(WRONG) / len(PAIRS))
