"""How well the duplicate-role check agrees with known labels.

A team's evaluation asks the model, for each pair of roles, "do these two roles do
the same job?" (``team.duplicate_prompt``); a yes makes the team invalid. This
measures that check on a small labelled set of role pairs (half duplicates, half
distinct), in both orders of each pair, with the embedded SmolLM2 server (or
``--base-url``/``--model`` for any OpenAI-compatible server)::

    python experiments/agent_team/judge_agreement.py
    python experiments/agent_team/judge_agreement.py --base-url http://127.0.0.1:8000/v1 --model qwen

It prints the check's AUC over both orders with its 95 % bootstrap interval
(``qd.judge_stats``: a check that never rejects, or always does, scores 0.5), the
agreement (fraction of pairs judged as labelled) in each order and how often it says
yes. ``tests/experiments/test_agent_team.py`` asserts the AUC floor on scripted checks
of known accuracy, never on this model.
"""

from __future__ import annotations

from pathlib import Path

from qd import judge_stats, tables
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
    """The check on every labelled pair in both orders: its AUC (verdict yes = 1, label duplicate =
    1) with the interval, the agreement in each order, and how often it says yes."""
    labels = [dup for _, _, dup in LABELLED]
    said = {
        order: [
            team.says_yes(await ask(client, *((a, b) if order == "forward" else (b, a))))
            for a, b, _ in LABELLED
        ]
        for order in ("forward", "reversed")
    }
    verdicts = said["forward"] + said["reversed"]
    return {
        **judge_stats.auc(verdicts, labels + labels),
        "n": len(verdicts),
        **{order: sum(v == y for v, y in zip(s, labels)) / len(labels) for order, s in said.items()},
        "yes_rate": sum(verdicts) / len(verdicts),
    }


if __name__ == "__main__":
    tables.measurement(measure, __doc__)
