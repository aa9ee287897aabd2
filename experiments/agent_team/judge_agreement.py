"""How well the duplicate-role check agrees with known labels.

A team's evaluation asks the model, for each pair of roles, "do these two roles do
the same job?" (``team.duplicate_prompt``); a yes makes the team invalid. This
measures that check on a small labelled set of role pairs (half duplicates, half
distinct), in both orders of each pair, with the embedded SmolLM2 server (or
``--base-url``/``--model`` for any OpenAI-compatible server)::

    python experiments/agent_team/judge_agreement.py
    python experiments/agent_team/judge_agreement.py --base-url http://127.0.0.1:8000/v1 --model qwen

It prints the agreement (fraction of pairs judged as labelled) for each order and
for every half of the set, the spread ``tests/experiments/test_agent_team.py``'s
floor is measured from.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from qd import tables
from qd.llm import LLMClient
from qd.task import load_module

team = load_module(Path(__file__).resolve().parent / "team.py", "experiments_agent_team_team")

Role = team.Role
# (role, role, duplicate?): duplicates say the same job in other words; distinct ones do different jobs.
LABELLED: list[tuple[Role, Role, bool]] = [
    (
        Role("solver", "You are a careful solver. Think step by step and give the final answer."),
        Role("stepper", "Solve the problem carefully, one step at a time, then state the final answer."),
        True,
    ),
    (
        Role("checker", "Check the previous answer for mistakes and correct them."),
        Role("reviewer", "Review the earlier solution, find any errors and fix them."),
        True,
    ),
    (
        Role("calculator", "You are a math expert. Compute the numbers exactly."),
        Role("arithmetician", "As an arithmetic specialist, calculate the numeric result precisely."),
        True,
    ),
    (
        Role("brief", "Answer briefly with only the final answer."),
        Role("terse", "Give just the final answer, nothing else."),
        True,
    ),
    (
        Role("logician", "You solve knights and knaves puzzles by testing each case."),
        Role(
            "case_tester", "Try every possible assignment of knights and knaves and keep the consistent one."
        ),
        True,
    ),
    (
        Role("chooser", "Pick the answer that most of your teammates gave."),
        Role("majority", "Choose the answer that the majority of the other roles agree on."),
        True,
    ),
    (
        Role("solver", "Think step by step and give the final answer."),
        Role("checker", "Check the previous answer for mistakes and correct them."),
        False,
    ),
    (
        Role("calculator", "Compute the numbers exactly."),
        Role("formatter", "Rewrite the final answer in the format 'Answer: <answer>'."),
        False,
    ),
    (
        Role("logician", "Solve knights and knaves puzzles by testing each case."),
        Role("arithmetician", "Do the arithmetic for word problems about money and items."),
        False,
    ),
    (
        Role("lister", "List every fact and number given in the problem."),
        Role("terse", "Give just the final answer, nothing else."),
        False,
    ),
    (
        Role("critic", "You are a skeptical critic: find one flaw in the answer."),
        Role("explainer", "You are a friendly teacher who restates the question in simple words."),
        False,
    ),
    (
        Role("translator", "Translate the word problem into one equation."),
        Role("chooser", "Pick the answer that most of your teammates gave."),
        False,
    ),
]


async def ask(client: LLMClient, first: Role, second: Role) -> str:
    """One duplicate check, as an evaluation makes it (greedy, a few tokens)."""
    messages = [{"role": "user", "content": team.duplicate_prompt(first, second)}]
    done = await client.complete(messages, temperature=0.0, max_tokens=team.CHECK_TOKENS, role="judge")
    return done.text


async def measure(client: LLMClient) -> dict:
    """Agreement with LABELLED for each order of the pairs and each half (by index parity, by position)."""
    verdicts = {}
    for order in ("forward", "reversed"):
        verdicts[order] = [
            team.says_yes(await ask(client, *((a, b) if order == "forward" else (b, a))))
            for a, b, _ in LABELLED
        ]
    labels = [dup for _, _, dup in LABELLED]
    half = len(LABELLED) // 2
    subsets = {
        "all": range(len(LABELLED)),
        "even": range(0, len(LABELLED), 2),
        "odd": range(1, len(LABELLED), 2),
        "dup+first_distinct": [*range(half), *range(half, half + half // 2)],
        "dup+last_distinct": [*range(half), *range(half + half // 2, len(LABELLED))],
    }
    out = {}
    for (order, said), (name, idx) in itertools.product(verdicts.items(), subsets.items()):
        idx = list(idx)
        out[f"{order}/{name}"] = sum(said[i] == labels[i] for i in idx) / len(idx)
    out["yes_rate"] = sum(map(sum, verdicts.values())) / (2 * len(LABELLED))
    return out


if __name__ == "__main__":
    tables.measurement(measure, __doc__)
