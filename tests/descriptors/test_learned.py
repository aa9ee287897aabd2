"""QDHF learned descriptors: recovery of a hidden ground truth, the judges, ``qd judge``, state."""

from __future__ import annotations

import asyncio
import io
import itertools
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr
from scripted_llm import Rule

from descriptors.base import Item
from descriptors.learned import GroundTruthJudge, LearnedDescriptor, LLMJudge, parse_choice
from qd.cli import USAGE
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.store import Candidate, Store

ROOT = Path(__file__).resolve().parents[2]


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hidden f[n, 2] in [0, 1]^2 and features f32[n, 128]: 64 mildly nonlinear views of them
    plus 64 distractor dimensions with twice their per-dimension spread, randomly rotated."""
    rng = np.random.default_rng(seed)
    hidden = rng.uniform(0, 1, (n, 2))
    signal = np.tanh(hidden @ rng.normal(size=(2, 64)) * 0.5)
    noise = rng.normal(size=(n, 64)) * 2 * signal.std(0).mean()
    rotation = np.linalg.qr(rng.normal(size=(128, 128)))[0]
    return hidden, (np.concatenate([signal, noise], 1) @ rotation).astype(np.float32)


def index(text: str) -> int:
    return int(text.removeprefix("item "))


def store_items(store: Store, indices: range) -> None:
    store.add(
        [
            Candidate(kind="text", island=0, fitness=0.0, descriptor=None, valid=True, text=f"item {i}")
            for i in indices
        ]
    )


def stored_items(store: Store) -> list[Item]:
    return [Item(c.text, c.fitness, id=c.id) for c in store.iter() if c.valid]


def ground_truth_descriptor(hidden: np.ndarray, features: np.ndarray, **kw) -> LearnedDescriptor:
    return LearnedDescriptor(
        judge=GroundTruthJudge(lambda it: hidden[index(it.text)]),
        features=lambda texts: features[[index(t) for t in texts]],
        **kw,
    )


def test_learned_projection_recovers_a_hidden_ground_truth(tmp_path):
    hidden, features = synthetic(400)
    desc = ground_truth_descriptor(hidden, features)
    rng = np.random.default_rng(0)
    with Store(tmp_path / "store.sqlite") as store:
        desc.attach(store.ports())
        report = []
        for start in range(0, 400, 50):  # candidates arrive in batches, as from the engine
            store_items(store, range(start, start + 50))
            items = stored_items(store)
            if not desc.needs_fit(len(items)):
                if desc.params is None:
                    assert np.isnan(asyncio.run(desc.describe(items[:3])).values).all()  # pending
                continue
            t0 = time.perf_counter()
            asyncio.run(desc.fit(items, rng))
            seconds = time.perf_counter() - t0
            values = asyncio.run(desc.describe(items)).values
            h = hidden[[index(it.text) for it in items]]
            rho = spearmanr(pdist(values), pdist(h)).statistic
            axes = max(
                (
                    np.abs([spearmanr(values[:, i], h[:, j]).statistic for i, j in enumerate(p)])
                    for p in itertools.permutations(range(2))
                ),
                key=np.sum,
            )
            report.append((len(store.judgments.read()), rho, axes, seconds))
        assert not desc.needs_fit(400) and desc.refits == 3
    for judged, rho, axes, seconds in report:
        print(
            f"QDHF: {judged} judgments: distance rank correlation {rho:.3f}, "
            f"per-axis |rho| {axes.round(3).tolist()}, fit {seconds:.2f}s"
        )
    assert [r[0] for r in report] == [100, 200, 400]
    assert 0.0 <= values.min() and values.max() <= 1.0
    assert report[-1][1] >= 0.8


def test_fit_is_deterministic_and_state_dict_round_trips(tmp_path):
    hidden, features = synthetic(60, seed=1)
    results = []
    for run in range(2):
        desc = ground_truth_descriptor(hidden, features, refit_at=(40,), steps=200)
        with Store(tmp_path / f"store{run}.sqlite") as store:
            store_items(store, range(60))
            desc.attach(store.ports())
            items = stored_items(store)
            asyncio.run(desc.fit(items, np.random.default_rng(7)))
        results.append(asyncio.run(desc.describe(items)).values)
    np.testing.assert_array_equal(results[0], results[1])

    restored = ground_truth_descriptor(hidden, features, refit_at=(40,))
    assert np.isnan(asyncio.run(restored.describe(items)).values).all()
    restored.load_state_dict({k: v.copy() for k, v in desc.state_dict().items()})
    assert all(isinstance(v, np.ndarray) for v in desc.state_dict().values())
    np.testing.assert_array_equal(asyncio.run(restored.describe(items)).values, results[0])
    assert restored.refits == 1 and not restored.needs_fit(60)


def test_schedule_fit_after_and_human_judgments_from_the_store(tmp_path):
    hidden, features = synthetic(30, seed=2)
    early = ground_truth_descriptor(hidden, features, refit_at=(20, 40), fit_after=(8, 16))
    assert not early.needs_fit(7) and early.needs_fit(8) and early.needs_fit(30)

    human = LearnedDescriptor(
        judge="human", refit_at=(3, 6), steps=50, features=lambda texts: features[[index(t) for t in texts]]
    )
    with Store(tmp_path / "s.sqlite") as store:
        store_items(store, range(30))
        human.attach(store.ports())
        assert not human.needs_fit(30)  # people have not judged yet: nothing to fit
        store.judgments.add([(0, 1, 2, 0), (3, 4, 5, 1), (6, 7, 8, 0)], "human")
        assert human.needs_fit(30)
        asyncio.run(human.fit(stored_items(store), np.random.default_rng(0)))
        assert len(store.judgments.read()) == 3  # trained on them, asked nobody
        assert not human.needs_fit(30)
        out = asyncio.run(human.describe(stored_items(store)))
    assert out.valid.all() and np.isfinite(out.values).all()


def test_parse_choice_is_strict():
    answers = (
        "B",
        " c.",
        "**C**",
        "Answer: B",
        "Text C",
        "'b'",
        "Text A is more similar to Text B, as it",
        "Text A is more similar to C.\n\nBecause",
        "Text A is more similar to text B than text C.",
    )
    assert [parse_choice(s) for s in answers] == [0, 1, 1, 0, 1, 0, 0, 1, 0]
    garbage = (
        "B or C",
        "A",
        "",
        "B is closer",
        "BC",
        "neither",
        "Text A is more similar to B or C than Text B",
        "Text A is more similar to B than B",
        "Text A is more similar to B or",
    )
    assert [parse_choice(s) for s in garbage] == [None] * len(garbage)


def test_llm_judge_parses_answers_and_skips_garbage(scripted_llm):
    server = scripted_llm(
        [
            Rule("anchor-0", reply="B"),
            Rule("anchor-1", reply=" C."),
            Rule("anchor-2", reply="B or C"),
            Rule("anchor-3", reply="Answer: c"),
            Rule("anchor-4", fault="500"),
        ]
    )
    triplets = [(Item(f"anchor-{i}"), Item("first"), Item("second")) for i in range(5)]

    async def go():
        client = LLMClient(
            LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),), max_retries=0)
        )
        try:
            judge = LLMJudge(client)
            return judge, await judge(triplets)
        finally:
            await client.aclose()

    judge, answers = asyncio.run(go())
    assert answers == [0, 1, None, 1, None]
    assert (judge.asked, judge.skipped, judge.failed) == (5, 1, 1)
    # The judge asks concurrently, so the server may see anchor-0's request after another one.
    prompt = next(p for p in (r["messages"][-1]["content"] for r in server.requests) if "anchor-0" in p)
    assert prompt.startswith("Text A:\nanchor-0") and "Text C:\nsecond" in prompt
    assert prompt.endswith("Is text A more similar to B or to C? Answer B or C.")


@pytest.mark.slow
def test_llm_judge_against_the_real_llama_server(llama_server):
    texts = [
        ("The cat sat on the mat.", "A kitten slept on the rug.", "Interest rates rose again this quarter."),
        ("def add(a, b): return a + b", "Stocks fell sharply on Monday.", "def plus(x, y): return x + y"),
        ("It is raining heavily outside.", "Heavy rain is falling today.", "The recipe needs two eggs."),
        ("I love playing football.", "Quantum computers use qubits.", "Soccer is my favourite sport."),
    ]
    # Each triplet as written and with B and C swapped: 8 distinct questions, half answered "B" by a person.
    triplets = [tuple(Item(t) for t in row) for row in texts] + [
        (Item(a), Item(c), Item(b)) for a, b, c in texts
    ]
    expected = [0, 1, 0, 1] + [1, 0, 1, 0]

    async def go():
        client = LLMClient(
            LLMSettings(
                base_url=llama_server.base_url,
                models=(ModelSpec(llama_server.model),),
                timeout_s=120.0,
                max_retries=1,
                seed=0,
            )
        )
        try:
            judge = LLMJudge(client)  # temperature 0, as LearnedDescriptor asks it in a run
            return judge, await judge(triplets)
        finally:
            await client.aclose()

    judge, answers = asyncio.run(go())
    parsed = sum(a is not None for a in answers)
    agree = sum(a == e for a, e in zip(answers, expected))
    print(
        f"SmolLM2 judge: asked {judge.asked}, parsed {parsed} ({agree} as a person would), "
        f"skipped {judge.skipped}, failed {judge.failed}"
    )
    assert all(a in (0, 1, None) for a in answers)
    assert judge.asked == len(triplets) and parsed + judge.skipped + judge.failed == len(triplets)
    # Measured on these 4 triplets and 2 other sets of 4 (each with B/C swapped): at temperature 0,
    # parsed 8 of 8 in all 3 sets; at temperature 0.7 (what this test used before) parsed min 0,
    # median 2, max 6 of 8 over 19 runs (seeds 0-9 of the old layout, 0-2 of each set). Floor: 6 of 8.
    # Agreement is not floored: SmolLM2-135M answers "B" to every question (agree = 4 of 8 in every
    # measured run, chance level), so nothing above chance can be asserted of this judge.
    assert parsed >= 6, answers


def _judge_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    with Store(run / "store.sqlite") as store:
        store_items(store, range(6))
        store.add(
            [
                Candidate(
                    kind="text",
                    island=0,
                    fitness=float("nan"),
                    descriptor=None,
                    valid=False,
                    text="broken",
                    error="evaluator: crashed",
                )
            ]
        )
    return run


def _human_rows(run: Path) -> list[tuple]:
    with sqlite3.connect(run / "store.sqlite") as db:
        return db.execute(
            "SELECT anchor, first, second, closer, source FROM judgments ORDER BY seq"
        ).fetchall()


def test_qd_judge_stores_human_judgments_from_piped_stdin(tmp_path, monkeypatch, capsys):
    from qd.cli import main

    run = _judge_run(tmp_path)
    # b; an unknown key then c; skip; quit before the fourth.
    monkeypatch.setattr(sys, "stdin", io.StringIO("b\nx\nc\ns\nq\n"))
    main(["judge", str(run), "--count", "5", "--seed", "0"])
    rows = _human_rows(run)
    assert [r[3:] for r in rows] == [(0, "human"), (1, "human")]
    assert all(6 not in r[:3] and len(set(r[:3])) == 3 for r in rows)  # never the invalid candidate
    out = capsys.readouterr().out
    assert "--- A (#" in out and "stored 2 judgments (1 skipped)" in out


def test_qd_judge_console_script_reads_a_pipe(tmp_path):
    run = _judge_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", "from qd.cli import main; main()", "judge", str(run), "--count", "3"],
        input="c\nb\nc\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [r[3:] for r in _human_rows(run)] == [(1, "human"), (0, "human"), (1, "human")]
    usage = subprocess.run(
        [sys.executable, "-c", "from qd.cli import main; main()"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert (
        usage.returncode == 2 and usage.stderr.strip() == USAGE and "judge" in USAGE
    )  # the list names every command


def _program(request: dict) -> str:
    """A valid program per sample: f(x) = a*x + b with (a, b) from the sample seed."""
    n = int(request.get("seed") or 0)
    return f"```python\ndef f(x):\n    return {n % 7}.0 * x + {(n // 7) % 5}.0\n```"


def _hidden_of(text: str) -> np.ndarray:
    """The hidden 2-D truth of a program: its slope and intercept (seeds count as 0, 0)."""
    import re

    m = re.search(r"return ([\d.]+) \* x \+ ([\d.]+)", text or "")
    return np.array([float(m[1]), float(m[2])] if m else [0.0, 0.0])


def test_engine_reinserts_every_candidate_after_each_learned_refit(tmp_path, scripted_llm):
    """QDHF in a run: judgments from a hidden truth, three refits, no candidate lost."""
    import contextlib
    import json

    from helpers import text_engine

    from qd.plan import compose
    from qd.rundir import checkpoint

    mix = np.random.default_rng(1).normal(size=(2, 32))
    server = scripted_llm([Rule("", _program)])
    cfg = compose(
        [
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={server.base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "runner.progress=false",
            "runner.max_llm_calls=44",
            "runner.initial_population=4",
            "operators.mix=[{name: rewrite}]",
        ]
    )
    desc = LearnedDescriptor(
        refit_at=(10, 20, 40),
        judge=lambda it: _hidden_of(it.text),
        steps=300,
        features=lambda texts: np.tanh(np.stack([_hidden_of(t) for t in texts]) @ mix / 4),
    )
    with contextlib.ExitStack() as stack:
        engine = text_engine(cfg, tmp_path, desc, stack)
        try:
            summary = engine.run()
        finally:
            engine.close()
    assert summary["descriptor"]["fits"] == 3
    refits = [
        e
        for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
        if e.get("event") == "refit"
    ]
    assert len(refits) == 3
    for e in refits:  # every valid stored candidate re-placed at each refit
        assert e["placed"] == e["candidates"] > 0
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        assert len(store.judgments.read()) >= 40
        valid = [c for c in store.iter() if c.valid]
    state, _, _ = checkpoint.load(tmp_path / "checkpoints")
    placed = set(np.asarray(state.genome_id).ravel().tolist()) - {-1}
    described = asyncio.run(desc.describe([Item(c.text, c.fitness, id=c.id) for c in valid]))
    cells = {tuple(np.minimum((v * 8).astype(int), 7)) for v in described.values}
    assert len(placed) == len(cells)  # one elite per distinct cell of the final fit
