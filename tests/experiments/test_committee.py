"""``qd committee``: k diverse elites of an agent_design run answer held-out problems together
(vote or judge), against the best elite alone and k copies of it, at the same call budget."""

import json

import pytest
from helpers import run_config
from scripted_llm import Rule, ScriptedLLM

from qd import committee
from qd.plan import compose
from qd.task import load_task

# Three agents, one model call per problem each, told apart by the model by their prompt's prefix;
# PAD puts them in different code-size cells, so all three are elites.
AGENT = '''"""Agent {name}: asks once."""
PAD = [{pad}]


def forward(task, llm):
    try:
        return llm("{name}: " + task, max_tokens=16)
    except Exception:
        return ""
'''

TASK = '''"""agent_design with three scripted founders (the test's agents)."""
from qd.paths import experiments_dir
from qd.task import load_module

base = load_module(experiments_dir() / "agent_design" / "task.py", "qd_experiment_agent_design")
AGENTS = {agents!r}


class Founders(base.AgentDesignTask):
    def hand_designed(self):
        return AGENTS


def make_task(**params):
    return Founders(**params)
'''

HELD_OUT = 4  # 2 arithmetic, 2 knights, interleaved
_TASK = load_task("agent_design", {"search_items": 2, "held_out_items": HELD_OUT})
PROBLEMS = {p.question: p for p in _TASK.search + _TASK.held_out()}


def wrong(p) -> str:
    """The one wrong answer agents b and c agree on."""
    if p.family == "arithmetic":
        return str(int(p.answer) + 1)
    return p.answer.replace("knight", "?").replace("knave", "knight").replace("?", "knave")


def model(request: dict) -> str:
    """a: right except on held-out puzzles (the fittest in search); b and c: right on puzzles only,
    the same wrong number on arithmetic; a judge names candidate 1."""
    prompt = request["messages"][-1]["content"]
    if prompt.startswith("Question:"):
        return "1"
    name, _, question = prompt.partition(": ")
    p = PROBLEMS.get(question)
    if p is None:
        return "no design here"  # the operators' children: invalid
    right = p.family == "knights" if name in "bc" else not (p.family == "knights" and p.split == "held_out")
    return f"Answer: {p.answer if right else wrong(p)}"


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """A finished agent_design run whose archive holds the three agents (a fittest; b, c ids after)."""
    path = tmp_path_factory.mktemp("committee")
    agents = [
        (name, AGENT.format(name=name, pad=", ".join(["0"] * pad)))
        for name, pad in (("a", 0), ("b", 60), ("c", 120))
    ]
    (path / "task.py").write_text(TASK.format(agents=agents))
    server = ScriptedLLM([Rule("", model)]).start()
    try:
        run_config(
            compose(
                [
                    "experiment=agent_design",
                    f"experiment.task={path / 'task.py'}",
                    "llm.provider=server",
                    f"llm.base_url={server.base_url}",
                    "llm.models=[{name: scripted}]",
                    "llm.api_key_env=null",
                    "llm.timeout_s=10",
                    "runner.progress=false",
                    "experiment.params.search_items=2",
                    "runner.initial_population=3",
                    "runner.batch_size=3",
                    "eval_llm.calls=2",
                    "runner.max_llm_calls=9",
                ]
            ),
            path / "run",
        )
        yield path / "run", server
    finally:
        server.stop()


def measured(capsys, run, *args: str, held_out: int = HELD_OUT) -> dict:
    committee.main([str(run), "--held-out", str(held_out), "--json", *args])
    return json.loads(capsys.readouterr().out)


def test_a_committee_votes_by_majority_at_the_budget_of_k_copies(agent_run, capsys):
    run, server = agent_run
    out = measured(capsys, run, "--k", "3", "--base-url", server.base_url, "--model", "scripted")
    members = out["members"]
    assert [m["search_fitness"] for m in members] == [1.0, 0.5, 0.5] and out["k"] == 3
    assert [m["held_out_accuracy"] for m in members] == [0.5, 0.5, 0.5]
    vote, best, copies = out["rows"]
    # arithmetic (items 0, 2): b and c outvote the fittest a; puzzles (1, 3): b and c are right
    assert vote["correct"] == [0, 1, 0, 1] and best["correct"] == copies["correct"] == [1, 0, 1, 0]
    for row in out["rows"]:
        assert row["accuracy"] == 0.5 and 0 <= row["ci95"][0] <= 0.5 <= row["ci95"][1] <= 1
    assert (vote["calls_per_item"], best["calls_per_item"], copies["calls_per_item"]) == (3.0, 1.0, 3.0)
    assert copies["agents"] == f"id {members[0]['id']} x3, seeds 0..2"


def test_a_judge_costs_one_more_call_and_a_tie_goes_to_the_fitter(agent_run, capsys):
    run, server = agent_run
    judged = measured(
        capsys, run, "--k", "3", "--rule", "judge", "--base-url", server.base_url, "--model", "scripted"
    )
    assert judged["rows"][0]["correct"] == [1, 0, 1, 0]  # the judge named candidate 1: the fittest's answer
    assert judged["rows"][0]["calls_per_item"] == 4.0 and judged["judge_calls"] == HELD_OUT
    asked = [
        r["messages"][-1]["content"] for r in server.requests if r["messages"][-1]["content"].startswith("Q")
    ]
    assert len(asked) == HELD_OUT and "1. " in asked[0] and "3. " in asked[0]
    tie = measured(capsys, run, "--k", "2", "--base-url", server.base_url, "--model", "scripted")
    assert tie["rows"][0]["correct"] == [1, 0, 1, 0] and tie["rows"][0]["calls_per_item"] == 2.0


def test_bad_input_is_one_line(agent_run, tmp_path, capsys):
    run, _ = agent_run
    for argv, message in [
        ([str(run), "--k", "4", "--base-url", "http://x"], "--base-url and --model go together"),
        ([str(run), "--k", "4", "--base-url", "http://x", "--model", "m"], "has 3 elites"),
        ([str(tmp_path)], "RUN_DIR"),
        ([str(run), "--rule", "best"], "invalid choice"),
    ]:
        with pytest.raises(SystemExit) as e:
            committee.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_other_tasks_are_refused(text_run, capsys):
    with pytest.raises(SystemExit) as e:
        committee.main([str(text_run)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "offers no held-out problems" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_committee_on_the_real_model(agent_run, llama_server, capsys):
    run, _ = agent_run
    out = measured(
        capsys,
        run,
        "--k",
        "2",
        "--base-url",
        llama_server.base_url,
        "--model",
        llama_server.model,
        held_out=3,
    )
    assert out["held_out_items"] == 3 and [r["row"] for r in out["rows"]] == [
        "committee (vote)",
        "best elite",
        "2 copies of the best (vote)",
    ]
    vote, best, copies = out["rows"]
    assert best["calls_per_item"] == 1.0 and vote["calls_per_item"] == copies["calls_per_item"] == 2.0
    for row in out["rows"]:
        assert len(row["correct"]) == 3 and 0 <= row["ci95"][0] <= row["accuracy"] <= row["ci95"][1] <= 1
