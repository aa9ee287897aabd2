"""Ties settled by a pairwise judge: both orders asked, the win stored, replayed on resume."""

import re

import numpy as np
import pytest
from helpers import run_engine, stored
from scripted_llm import Rule

import genomes
from operators.llm import make_llm_operator
from qd.contract import ConfigError
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.plan import compose, plan
from qd.search.tiebreak import TIED, WON, PairwiseJudge

QUESTION = "Which slogan is louder?"


def louder(request: dict) -> str:
    """The judge: the text with more exclamation marks wins; a tie goes to position A (a biased judge)."""
    a, b = re.search(r"\nA:\n(.*)\n\nB:\n(.*)\n\nAnswer", request["messages"][-1]["content"], re.S).groups()
    return "B" if b.count("!") > a.count("!") else "A"


def slogan(request: dict) -> str:
    """The operator: a slogan with seed % 5 exclamation marks."""
    return f"```text\nbuy now{'!' * (int(request.get('seed') or 0) % 5)}\n```"


class SloganTask:
    """Every slogan scores 1.0 in one cell: only the judge can tell them apart."""

    kind, genome, descriptor_dim = "text", "text", 1
    description = "Write a slogan."

    def __init__(self, entry: str):
        from qd.task import Stage

        self.host_entry, self.stages = entry, [Stage()]

    def initial(self, rng, n):
        return ["buy now\n"] * n

    def score(self, text, outputs):
        from qd.task import Scored

        return Scored(1.0, [0.5], True, {"length": outputs[-1]})


def engine(tmp_path, server, max_llm_calls):
    from qd import Budget, Settings, archive, build
    from qd.evaluator import HostRunner, StagedEvaluator
    from qd.search.strategy import Strategy

    entry = tmp_path / "slogan_entry.py"
    entry.write_text("def run(text):\n    return len(text)\n")
    task = SloganTask(f"{entry}:run")
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), seed=0))
    return build(
        task=task,
        spec=archive.GridSpec((2,), (0.0,), (1.0,)),
        operators=[(make_llm_operator("rewrite", client, genome=genomes.of_task(task)), 1.0)],
        evaluator=StagedEvaluator(task, HostRunner(task.host_entry)),
        run_dir=tmp_path / "run",
        budget=Budget(max_llm_calls=max_llm_calls),
        settings=Settings(batch_size=1, in_flight=1, progress=False),
        llm=client,
        strategy=Strategy(tiebreak=lambda llm: PairwiseJudge(QUESTION, client=llm)),
    )


def test_a_tie_goes_to_the_child_only_if_the_judge_prefers_it_in_both_orders(tmp_path, scripted_llm):
    server = scripted_llm([Rule(QUESTION, louder), Rule("", slogan)])
    e = engine(tmp_path, server, max_llm_calls=30)
    run_engine(e)
    rows = stored(tmp_path / "run")
    judged = [r for r in server.requests if QUESTION in r["messages"][-1]["content"]]
    assert judged and all(r["max_tokens"] == 1 and r["temperature"] == 0.0 for r in judged)
    children = [c for c in rows if c.operator == "rewrite"]
    winners = [c for c in children if (c.metrics or {}).get(WON)]
    assert winners, "a louder slogan must have won its tie"
    # The biased judge answers A when the two are as loud: that child wins one order only, and loses.
    assert all(c.text.count("!") > 0 for c in winners)
    steps = np.float32(1.0)
    for c in winners:  # each win is one float32 step above the incumbent, the exact score kept
        steps = np.nextafter(steps, np.float32(np.inf))
        assert np.float32(c.fitness) == steps and c.metrics[TIED] == 1.0
    assert all(c.fitness == 1.0 for c in children if c.valid and not (c.metrics or {}).get(WON))
    elite = max((c for c in rows if c.valid), key=lambda c: (c.fitness, -c.id))
    assert e.elites.table[0, 1].id == elite.id and elite.text.count("!") == max(
        c.text.count("!") for c in rows if c.valid
    )
    calls = e.llm.ledger.split("role")
    assert calls["judge"].calls == len(judged) and sum(u.calls for u in calls.values()) <= 30
    e.close()

    again = engine(tmp_path, server, max_llm_calls=30)  # resume: the store replays, nothing is asked again
    asked = len(server.requests)
    assert again.elites.table[0, 1].id == elite.id and len(server.requests) == asked
    again.close()


def test_the_judge_reads_the_answer_tokens_probabilities(scripted_llm):
    import asyncio

    server = scripted_llm(
        [
            Rule("first", "A", logprobs=[{"A": -1.2, " B": -0.4}]),
            Rule("", "A", logprobs=[{"A": -0.1, "B": -3.0}]),
        ]
    )

    async def picks():
        client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), seed=0))
        judge = PairwiseJudge("Which is better?", client=client)
        try:
            return [await judge._pick("first", "second"), await judge._pick("other", "second")]
        finally:
            await client.aclose()

    assert asyncio.run(picks()) == ["B", "A"]  # the first sampled "A", but " B" is likelier


def test_tiebreak_config_is_checked():
    p = plan(
        compose(
            ["experiment=prompt_evolution", "tiebreak.enabled=true", "tiebreak.question=Which is clearer?"]
        )
    )
    assert p.strategy.tiebreak == {"question": "Which is clearer?", "model": None}
    with pytest.raises(ConfigError, match="tiebreak.question"):
        plan(compose(["experiment=prompt_evolution", "tiebreak.enabled=true", "tiebreak.question=' '"]))
    with pytest.raises(ConfigError, match="tiebreak.enabled.*numeric"):
        plan(compose(["experiment=sphere", "tiebreak.enabled=true"]))
