"""The host side of a team's evaluation: check the team, then let it answer each question.

A team is data (``team.py``): it is read with ``json.loads``, never executed. This
runs on the host, in a worker thread, with ``llm`` over the evaluation's model
gateway (budget, cache, ledger, trace), in three steps:

1. the schema: a malformed team is invalid before any model call;
2. the duplicate-role check: each role is compared with every role before it,
   the same normalised instructions without a call, others by one model call
   (``team.duplicate_prompt``); a yes makes the team invalid, no problem solved;
3. the problems: ``sequential`` passes each role the question and the previous
   role's answer, ``vote`` takes the majority of the roles' extracted answers.

When the evaluation's call budget runs out, each problem keeps the best answer
it has so far (the last refinement, or a vote over the answers given).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from qd.reasoning import problems
from qd.task import load_module

team = load_module(Path(__file__).resolve().parent / "team.py", "experiments_agent_team_team")

_PREVIOUS_CHARS = 600  # the previous role's answer as shown to the next (a 2,048-token model)


def _ask(llm, role, content: str, max_tokens: int) -> str:
    """One role's call: its instructions as the system message; its model when it names one."""
    messages = [{"role": "system", "content": role.instructions}, {"role": "user", "content": content}]
    pinned = {"model": role.model} if role.model else {}
    return str(llm(messages, temperature=0.0, max_tokens=max_tokens, **pinned) or "")


def duplicate(t, llm) -> str | None:
    """Why the team has a duplicate role ("role 'B' duplicates role 'A'"), or None."""
    for j, later in enumerate(t.roles):
        for earlier in t.roles[:j]:
            same = team.normalised(later) == team.normalised(earlier)
            if same or team.says_yes(
                str(llm(team.duplicate_prompt(earlier, later), temperature=0.0, max_tokens=team.CHECK_TOKENS))
            ):
                how = "has the same instructions as" if same else "duplicates"
                return f"role {later.name!r} {how} role {earlier.name!r}"
    return None


def vote_key(question: str, answer: str) -> str | None:
    """The answer as ``problems.check`` reads it (its last number, or every islander's role), from the
    question alone: the islanders are the question's speakers."""
    family = "knights" if "knights always tell the truth" in question.lower() else "arithmetic"
    names = sorted(set(re.findall(r"\b([A-Z]) says:", question)))
    stub = ", ".join(f"{n}: knight" for n in names)  # only its names are read
    return problems.extract(problems.Problem("", family, "", "", question, stub), answer)


def sequential(t, question: str, llm, max_tokens: int) -> str | None:
    answer = None
    for role in t.roles:
        content = (
            question
            if answer is None
            else (
                f"{question}\n\nA teammate answered:\n{answer[-_PREVIOUS_CHARS:]}\n\n"
                "Check that answer and give your own final answer."
            )
        )
        try:
            answer = _ask(llm, role, content, max_tokens)
        except Exception:
            if answer is None:
                raise
            break  # the budget is spent: keep the last refinement
    return answer


def vote(t, question: str, llm, max_tokens: int) -> str | None:
    answers = []
    for role in t.roles:
        try:
            answers.append(_ask(llm, role, question, max_tokens))
        except Exception:
            if not answers:
                raise
            break  # the budget is spent: vote over the answers given
    keys = [vote_key(question, a) for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return answers[0]
    top = max(counts.values())
    return next(
        a for a, k in zip(answers, keys) if k is not None and counts[k] == top
    )  # ties: the earlier role


MERGE = {"sequential": sequential, "vote": vote}


def run(text: str, llm, questions: list[str], models: list[str], max_tokens: int = 96) -> dict:
    """``{"answers": [{"answer"} or {"answer": None, "error"}, ...]}``, or ``{"invalid": reason}``."""
    try:
        t = team.parse(text, tuple(models))
    except team.TeamError as err:
        return {"invalid": str(err)}
    why = duplicate(t, llm)
    if why:
        return {"invalid": why}
    merge, results = MERGE[t.merge], []
    for item, question in enumerate(questions):
        llm.item = item  # the host's trace records which question each model call served
        try:
            answer = merge(t, question, llm, max_tokens)
            results.append({"answer": None if answer is None else answer[-400:]})  # the end holds the answer
        except Exception as e:  # the budget is spent, or the model failed: this question is lost
            results.append({"answer": None, "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]})
    return {"answers": results}
