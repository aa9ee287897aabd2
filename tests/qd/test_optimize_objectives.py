"""``qd.optimize`` with objectives: the prompt multi-objective experiment (accuracy max, tokens
min) on a dataset of sums, its parents drawn by GEPA's ``instance`` rule and their partners by
``complement``, against the scripted server."""

from __future__ import annotations

import itertools
import json
import re
import sqlite3

import pytest
from scripted_llm import Rule

import qd

SEED = "Answer the even ones."
ODD = "Please answer only the questions whose first number is odd, and take great care with them."
GUESS = "Guess wildly, and explain at length."  # wrong on every row: loses its minibatch
ALL = "Answer all of them."
PROPOSALS = (ODD, GUESS, ALL)  # what the operator proposes, in turn


def scripted() -> object:
    """The solver is right on the rows its prompt covers (even or odd first terms, or all; none
    when guessing), and wordy when asked to explain; the operator proposes :data:`PROPOSALS`."""
    proposals = itertools.cycle(PROPOSALS)

    def reply(request: dict) -> str:
        prompt, question = request["messages"][0]["content"], request["messages"][-1]["content"]
        asked = re.fullmatch(r"What is (\d+) \+ (\d+)\?", question.strip())
        if not asked:
            return f"```text\n{next(proposals)}\n```"
        a, b = int(asked[1]), int(asked[2])
        right = "all" in prompt or ("even" in prompt and a % 2 == 0) or ("odd" in prompt and a % 2 == 1)
        words = "First add the units, then carry the tens, then check it twice. " * ("explain" in prompt)
        return f"{words}{a + b if right else a + b + 1}"

    return reply


@pytest.mark.slow
def test_prompt_evolution_on_accuracy_and_tokens_draws_parents_best_on_some_validation_row(
    scripted_llm, tmp_path
):
    rows = [{"input": f"What is {n} + {n + 3}?", "answer": str(2 * n + 3)} for n in range(24)]
    server = scripted_llm([Rule("", scripted())])
    result = qd.optimize(
        SEED,
        genome="prompt",
        dataset=rows,
        metric="numeric",
        objectives=[("accuracy", "max"), ("tokens", "min")],
        parents="instance",
        inspirations="complement",
        base_url=server.base_url,
        model="scripted",
        budget={"llm_calls": 120},
        run_dir=tmp_path / "run",
    )
    assert result.best is not None and result.best.text.strip() == ALL and result.best.fitness == 1.0
    with sqlite3.connect(result.run_dir / "store.sqlite") as db:
        stored = {
            i: (json.loads(parents), json.loads(metrics or "null"), (text or "").strip())
            for i, parents, metrics, text in db.execute(
                "SELECT id, parent_ids, metrics, text FROM candidates"
            )
        }
    validated = {i: m for i, (_, m, _) in stored.items() if m and "validation_scores" in m}
    assert all(len(m["validation_scores"]) == 6 for m in validated.values())
    assert all(m["accuracy"] == m["validation"] for m in validated.values())
    tokens = {t: m["tokens"] for _, m, t in stored.values() if m}
    assert tokens[GUESS] > tokens[ALL] > 0  # the objective the fitness cannot see
    elites = {e["text"].strip(): e["id"] for e in result.elites}
    assert {ODD, GUESS, ALL} <= set(elites)  # three cells: ODD is long, GUESS answers at length
    first = [parents[0] for parents, _, _ in stored.values() if parents]
    assert elites[GUESS] not in first  # an elite best on no validation row is never a parent...
    assert elites[ODD] in first  # ...while one best on the odd rows alone is
