"""The prompt multi-objective experiment (issue 31: accuracy max, tokens min) on the scripted
server, by ``qd.optimize`` and by ``qd-run experiment=prompt_objectives``: parents drawn by GEPA's
``instance`` rule (an elite best on no validation row is never one), partners by ``complement``,
each candidate past the cascade keeping its score on every validation row."""

from __future__ import annotations

import itertools
import json
import sqlite3

import pytest
from helpers import run_config, stored
from scripted_llm import Rule

import qd
from qd.api import elites as qd_elites
from qd.data.rows import load_rows
from qd.plan import compose

SEED = "Answer the even ones."
ODD = (
    "Please answer only the odd ones, and take great care with each of them: read the question twice, "
    "write down every number it gives, and check the result before you answer."
)  # long enough for a cell of its own
GUESS = "Guess wildly, and explain at length."  # wrong on every row: loses its minibatch
ALL = "Answer all of them."
PROPOSALS = (ODD, GUESS, ALL)  # what the operator proposes, in turn
WORDS = "First add the units, then carry the tens, then check it twice, and once more. " * 2


def scripted(rows: list[dict]) -> object:
    """The solver is right on the rows its prompt covers (even or odd positions in ``rows``, or
    all; none for any other prompt), at length when asked to explain; the operator proposes
    :data:`PROPOSALS` in turn."""
    proposals, position = (
        itertools.cycle(PROPOSALS),
        {r["input"]: (i, r["answer"]) for i, r in enumerate(rows)},
    )

    def reply(request: dict) -> str:
        prompt, question = request["messages"][0]["content"], request["messages"][-1]["content"]
        if question.strip() not in position:
            return f"```text\n{next(proposals)}\n```"
        i, answer = position[question.strip()]
        right = (
            "all of them" in prompt
            or ("even ones" in prompt and i % 2 == 0)
            or ("odd ones" in prompt and i % 2)
        )
        return f"{WORDS * ('explain' in prompt)}{answer if right else str(answer) + '1'}"

    return reply


def check(candidates: list[tuple[list[int], dict | None, str]], elites: dict[str, int], rows: int) -> None:
    """Every candidate past the cascade has its ``rows`` validation scores and its objectives; the
    wordy one spends more tokens; the elite best on no validation row is never a parent."""
    validated = [m for _, m, _ in candidates if m and "validation_scores" in m]
    assert validated and all(len(m["validation_scores"]) == rows for m in validated)
    assert all(m["accuracy"] == m["validation"] for m in validated)
    tokens = {t: m["tokens"] for _, m, t in candidates if m}
    assert tokens[GUESS] > tokens[ALL] > 0  # the objective the fitness cannot see
    first = [parents[0] for parents, _, _ in candidates if parents]
    assert GUESS in elites and elites[GUESS] not in first


@pytest.mark.slow
def test_by_qd_optimize_parents_are_best_on_some_validation_row(scripted_llm, tmp_path):
    rows = [{"input": f"What is {n} + {n + 3}?", "answer": str(2 * n + 3)} for n in range(24)]
    server = scripted_llm([Rule("", scripted(rows))])
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
        # The first wave (children of the seed, scored before any of them commits) can spend
        # most of 120 calls: seen on a loaded machine, 8 candidates and only the seed a parent.
        budget={"llm_calls": 200},
        run_dir=tmp_path / "run",
    )
    assert result.best is not None and result.best.text.strip() == ALL and result.best.fitness == 1.0
    with sqlite3.connect(result.run_dir / "store.sqlite") as db:
        candidates = [
            (json.loads(parents), json.loads(metrics or "null"), (text or "").strip())
            for parents, metrics, text in db.execute("SELECT parent_ids, metrics, text FROM candidates")
        ]
    elites = {e["text"].strip(): e["id"] for e in result.elites}
    assert {ODD, GUESS, ALL} <= set(elites)  # three cells: ODD is long, GUESS answers at length
    check(candidates, elites, rows=6)
    assert elites[ODD] in [parents[0] for parents, _, _ in candidates if parents]  # best on odd rows alone


@pytest.mark.slow
def test_by_qd_run_on_the_shipped_dataset(scripted_llm, tmp_path):
    rows = [{"input": r.input, "answer": r.answer} for r in load_rows("arith60")]
    server = scripted_llm([Rule("", scripted(rows))])
    cfg = compose(
        [
            "experiment=prompt_objectives",
            "llm.provider=server",
            f"llm.base_url={server.base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "runner.progress=false",
            "runner.max_llm_calls=150",
        ]
    )
    run_config(cfg, tmp_path / "run")
    found = [c for c in stored(tmp_path / "run") if c.kind == "text"]
    candidates = [(list(c.parent_ids), c.metrics, (c.text or "").strip()) for c in found if c.valid]
    elites = {e.candidate.text.strip(): e.candidate.id for e in qd_elites(tmp_path / "run")}
    check(candidates, elites, rows=15)
