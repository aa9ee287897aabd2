"""``qd.optimize``'s run-memory and agent switches on the scripted server: ``memory=`` shows the
parents' failed children in later prompts and ledgers its lessons under ``meta``; ``operators=``
takes the agent, whose steps are ledgered under ``operator`` and stored under its name, its trials
stored apart and never placed; every operator, the agent's too, writes the genome kind asked for
(a prompt's operators are told they write prompts)."""

from __future__ import annotations

import json
import re
import runpy
import sqlite3

import pytest
from helpers import sums_or
from scripted_llm import Rule

import qd
from qd.contract import ConfigError

SEED = "def f(x):\n    return x\n"
NOTE = "Programs that raise never score."
SHOWN = re.compile(r"- child #(\d+) \(rewrite\): failed: .*?MARKED-(\d+)")


def evaluate(program_path):
    """How close f(2) is to 7 (in the sandbox)."""
    f = runpy.run_path(program_path)["f"]
    return {"score": -abs(f(2.0) - 7.0), "feedback": f"f(2) = {f(2.0)}"}


def marked_or_tool(request: dict) -> str:
    """The lessons prompt: ``NOTE``; an agent's first step tries a draft, its next submits it; an
    operator's call with an odd sampling seed: a program that raises a marked error."""
    seed = int(request.get("seed") or 0)
    last = request["messages"][-1]["content"]
    if "lessons note" in last:
        return NOTE
    if seed % 2:
        body = f"def f(x):\n    raise ValueError('MARKED-{seed}')\n"
    else:
        body = f"def f(x):\n    return {seed % 5} * x + {seed % 3}\n"
    program = f"```python\n{body}```"
    if not any("TOOL: submit" in (m["content"] or "") for m in request["messages"]):
        return program
    users = [m for m in request["messages"] if m["role"] == "user"]
    return ("TOOL: submit\n" if len(users) > 1 else "TOOL: trial\n") + program


def optimized(scripted_llm, tmp_path, calls: int, **switches):
    """``qd.optimize`` of ``SEED`` on a scripted server answering ``marked_or_tool``: (result, server)."""
    server = scripted_llm([Rule("", marked_or_tool)])
    result = qd.optimize(
        SEED,
        evaluate=evaluate,
        base_url=server.base_url,
        model="scripted",
        budget={"llm_calls": calls},
        run_dir=tmp_path / "run",
        **switches,
    )
    return result, server


def rows_of(run_dir) -> list[dict]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM candidates ORDER BY id")]


@pytest.mark.slow
def test_memory_shows_failed_children_in_later_prompts_and_ledgers_its_lessons_under_meta(
    scripted_llm, tmp_path
):
    # the memory=on group, a note every 4 commits
    result, server = optimized(scripted_llm, tmp_path, 12, memory={"lessons_every": 4})
    rows = {r["id"]: r for r in rows_of(result.run_dir)}
    shown = 0
    for r in rows.values():
        if r["kind"] != "text" or not r["prompt"]:
            continue
        for child, mark in SHOWN.findall(json.loads(r["prompt"])[-1]["content"]):
            earlier = rows[int(child)]  # failed before this prompt was made, with that very error
            assert earlier["id"] < r["id"] and f"MARKED-{mark}" in earlier["error"]
            shown += 1
    assert shown >= 2, shown
    notes = [r for r in rows.values() if r["kind"] == "lessons"]
    roles = result.ledger.split("role")
    assert notes and roles["meta"].calls == len(notes) and all(n["text"] == NOTE for n in notes)
    assert result.ledger.calls == server.stats()["requests"] <= 12


def test_without_memory_no_prompt_shows_children(scripted_llm, tmp_path):
    result, _ = optimized(scripted_llm, tmp_path, 8)
    assert not any("Recent children" in (r["prompt"] or "") for r in rows_of(result.run_dir))
    assert "meta" not in result.ledger.split("role")


def test_the_agent_is_an_arm_whose_steps_are_ledgered_under_operator_and_trials_never_placed(
    scripted_llm, tmp_path
):
    result, server = optimized(scripted_llm, tmp_path, 16, operators=("rewrite", "agent"), random_seed=1)
    rows = rows_of(result.run_dir)
    by_operator = {op: [r for r in rows if r["operator"] == op] for op in ("rewrite", "agent", "agent>trial")}
    assert all(by_operator.values()), {k: len(v) for k, v in by_operator.items()}
    # every call is a proposer's (rewrite, or an agent's step), counted by the server and in the budget
    assert result.ledger.split("role")["operator"].calls == result.ledger.calls == server.stats()["requests"]
    assert result.ledger.calls <= 16
    elites = {e["id"] for e in result.elites}
    assert not elites & {r["id"] for r in by_operator["agent>trial"]}


@pytest.mark.parametrize(
    "memory, field",
    [
        ({"childs": 3}, "memory"),
        ({"children": -1}, "memory.children"),
        ({"max_tokens": 8}, "memory.max_tokens"),
        ("on", "memory"),
    ],
)
def test_a_bad_memory_switch_is_one_line_naming_it(memory, field, tmp_path):
    with pytest.raises(ConfigError) as e:
        qd.optimize(SEED, evaluate=evaluate, base_url="http://127.0.0.1:9", memory=memory, run_dir=tmp_path)
    assert e.value.field == field and "\n" not in str(e.value)


def test_a_prompt_genome_s_operators_and_agent_are_told_they_write_prompts(scripted_llm, tmp_path):
    rows = [{"input": f"What is {n} + {n}?", "answer": str(2 * n)} for n in range(12)]

    def propose(request: dict) -> str:
        agent = any("TOOL: submit" in (m["content"] or "") for m in request["messages"])
        return ("TOOL: submit\n" if agent else "") + f"Add the numbers. Seed {request.get('seed')}."

    server = scripted_llm([Rule("", sums_or(propose))])
    result = qd.optimize(
        "Answer the question.",
        genome="prompt",
        dataset=rows,
        metric="numeric",
        base_url=server.base_url,
        model="scripted",
        budget={"llm_calls": 40},
        operators=("rewrite", "agent"),
        random_seed=2,
        run_dir=tmp_path / "run",
    )
    asked = [r for r in rows_of(result.run_dir) if r["operator"] in ("rewrite", "agent") and r["prompt"]]
    assert {r["operator"] for r in asked} == {"rewrite", "agent"}
    for r in asked:
        system = json.loads(r["prompt"])[0]["content"]
        assert "instructions (prompts)" in system and "python" not in system, system
