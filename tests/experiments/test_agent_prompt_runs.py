"""agent_design and prompt_evolution end to end: agents and prompts evolve, and every model call an
evaluation makes goes through the host's client, within its budget, recorded with its candidate."""

import re

import pytest
from helpers import on_server, run_config, stored
from scripted_llm import Rule

from qd.plan import compose
from qd.store import Store
from qd.task import load_task

LOOPING = '''"""Calls until the budget says no, then answers."""
def forward(task, llm):
    answer = ""
    while True:
        try:
            answer = llm(task, max_tokens=8)
        except Exception:
            return answer
'''


def designed(request: dict) -> str:
    """The meta agent's answer: a new agent per sample (its seed), every third one greedy."""
    seed = int(request.get("seed") or 0)
    if seed % 3 == 0:
        return f"```python\n{LOOPING.replace('Calls until', f'Design {seed}: calls until')}```"
    return (
        f'```python\n"""Design {seed}: ask, then check."""\ndef forward(task, llm):\n'
        f'    first = llm(task, max_tokens=16)\n    return llm("Check: " + first, max_tokens=16)\n```'
    )


def config(base_url: str, experiment: str, *overrides: str):
    return compose(
        [
            f"experiment={experiment}",
            *on_server(base_url),
            "llm.timeout_s=10",
            "experiment.params.search_items=2",
            *overrides,
        ]
    )


def requests_text(server) -> str:
    return "\n".join(m["content"] for r in server.requests for m in r["messages"])


def test_agents_call_the_model_through_the_host_within_their_budget(tmp_path, scripted_llm):
    server = scripted_llm([Rule("You design LLM agents", designed), Rule("", "Answer: 9")])
    cache = tmp_path / "cache"
    args = (
        "runner.max_llm_calls=60",
        "eval_llm.calls=5",
        "runner.workers=3",
        "sandbox.wall_s=20",
        f"llm.cache_dir={cache}",
        "operators.mix=[{name: meta_agent, num_inspirations: 3, debug_rounds: 1}]",
    )
    summary = run_config(config(server.base_url, "agent_design", *args), tmp_path / "a")
    rows = [c for c in stored(tmp_path / "a") if c.kind == "text"]
    assert {c.genome for c in rows} == {"agent"}
    founders = [c for c in rows if c.operator == "init"]
    assert len(founders) == 6 and all(c.valid for c in founders)
    llm = summary["llm"]
    assert 0 < llm["calls"] <= 60  # every call, the agents' included, counted in runner.max_llm_calls
    agent_calls = llm["per_role"]["agent"]["calls"]
    with Store(tmp_path / "a" / "store.sqlite", readonly=True) as store:
        traces = {c.id: store.traces.of(c.id) for c in rows}
    answered = {i: [t for t in trace if "text" in t] for i, trace in traces.items()}
    assert sum(map(len, answered.values())) == agent_calls > 0  # each call stored with its candidate
    for c in rows:
        assert len(answered[c.id]) <= 5 and c.metrics["model_calls"] == len(answered[c.id])
        for t in answered[c.id]:
            assert t["messages"][-1]["role"] == "user" and t["text"] == "Answer: 9" and t["tokens_out"] > 0
    greedy = [c for c in rows if c.valid and "calls until" in c.text]
    assert greedy, "a looping agent was evaluated"
    for c in greedy:  # it hit the budget inside the agent and still answered
        assert len(answered[c.id]) == 5 and "call budget spent" in traces[c.id][-1]["error"]
    assert any(c.operator == "meta_agent" and c.valid for c in rows)
    held_out = load_task("agent_design", {"search_items": 2}).held_out()
    text = requests_text(server)
    assert not [p.question for p in held_out if p.question in text]  # no held-out problem reached a prompt
    # a rerun with the same cache replays every call: the server is asked nothing new
    before = len(server.requests)
    again = run_config(config(server.base_url, "agent_design", *args), tmp_path / "b")
    assert len(server.requests) == before
    assert again["llm"]["cached_calls"] == again["llm"]["calls"] == llm["calls"]


def test_prompts_are_data_for_a_fixed_solver_on_the_host(tmp_path, scripted_llm):
    truth = {p.question: p.answer for p in load_task("prompt_evolution", {"search_items": 2}).search}

    def solver(request: dict) -> str:  # right on the knights problem, wrong on the arithmetic one
        answer = truth.get(request["messages"][-1]["content"], "")
        return f"Answer: {answer if answer.startswith('A:') else -1}"

    server = scripted_llm(
        [
            Rule(
                r"write instructions|Instruction:|improve instructions", "Think, then answer with 'Answer:'."
            ),
            Rule("", solver),
        ]
    )
    summary = run_config(
        config(
            server.base_url,
            "prompt_evolution",
            "runner.max_llm_calls=40",
            "eval_llm.calls=2",
            "meta.evolve_every=2",
        ),
        tmp_path,
    )
    rows = [c for c in stored(tmp_path) if c.kind == "text"]
    assert {c.genome for c in rows} == {"prompt"} and len([c for c in rows if c.operator == "init"]) == 6
    assert summary["llm"]["calls"] <= 40 and summary["llm"]["per_role"]["agent"]["calls"] > 0
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        founder = next(c for c in rows if c.operator == "init")
        trace = store.traces.of(founder.id)
    assert [t["messages"][0] for t in trace] == [{"role": "system", "content": founder.text.strip()}] * 2
    assert founder.fitness == 0.5  # the knights problem right, the arithmetic one wrong
    assert "correct_working" in founder.artifacts
    solver_prompts = [
        r
        for r in server.requests
        if r["messages"][0]["role"] == "system"
        and not re.search("write instructions", r["messages"][0]["content"])
    ]
    assert solver_prompts
    held_out = load_task("prompt_evolution", {"search_items": 2}).held_out()
    text = requests_text(server)
    assert not [p.question for p in held_out if p.question in text]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["agent_design", "prompt_evolution"])
def test_each_experiment_runs_on_the_real_model(tmp_path, llama_server, experiment):
    cfg = compose(
        [
            f"experiment={experiment}",
            "llm.provider=server",
            f"llm.base_url={llama_server.base_url}",
            f"llm.models=[{{name: {llama_server.model}}}]",
            "llm.api_key_env=null",
            "runner.progress=false",
            "experiment.params.search_items=2",
            "eval_llm.calls=4",
            "runner.max_llm_calls=14",
        ]
    )
    summary = run_config(cfg, tmp_path)
    rows = [c for c in stored(tmp_path) if c.kind == "text"]
    assert rows and all(c.error is None for c in rows if c.operator == "init")
    assert summary["llm"]["per_role"]["agent"]["calls"] > 0 and summary["llm"]["calls"] <= 14
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        assert any(t.get("text") for c in rows for t in store.traces.of(c.id))
