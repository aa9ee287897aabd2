"""Run memory on function_fit with a scripted server whose every other answer raises a marked
error: later prompts show those failures, the lessons note is a ledgered ``meta`` call, a rerun
from the cache replays it exactly and a resumed run remembers what it had committed."""

import json
import re

import pytest
from helpers import on_server, run_engine, scripted_text_config, stored
from scripted_llm import Rule, ScriptedLLM

from qd.contract import Candidate, ConfigError
from qd.memory import ChildMemory, fate
from qd.plan import compose, plan
from qd.run import build_engine
from qd.search.gate import REUSED, SIMILARITY, TRIAL
from qd.store import Store

NOTE = "Rewrites that keep x * x pay; never raise."
LINE = re.compile(r"- child #(\d+) \((\S+)\): failed: .*?MARKED-(\d+)")


def marked(request: dict) -> str:
    """Odd seeds: a program that raises a marked error; even seeds: a valid program; the lessons
    prompt: ``NOTE``."""
    if "lessons note" in request["messages"][-1]["content"]:
        return NOTE
    seed = int(request.get("seed") or 0)
    if seed % 2:
        return f"```python\ndef f(x):\n    raise ValueError('MARKED-{seed}')\n```"
    return f"```python\ndef f(x):\n    return x * x + {seed % 5} * x + {seed % 3}\n```"


def memory_config(base_url: str, *overrides: str):
    return scripted_text_config(
        base_url,
        "llm.models=[{name: scripted, price_in: 1.0, price_out: 2.0}]",
        "memory=on",
        "memory.lessons_every=4",
        "runner.max_llm_calls=24",
        "runner.in_flight=2",
        *overrides,
    )


@pytest.fixture(scope="module")
def server():
    s = ScriptedLLM([Rule("", marked)]).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def memory_run(server, tmp_path_factory):
    """One run with memory on and a response cache, and the requests it sent."""
    path = tmp_path_factory.mktemp("memory_run")
    before = len(server.requests)
    run_engine(build_engine(memory_config(server.base_url, f"llm.cache_dir={path / 'cache'}"), path / "a"))
    return path, server.requests[before:]


def test_a_prompt_shows_the_parents_failed_children_with_their_reasons(memory_run):
    path, _ = memory_run
    rows = {c.id: c for c in stored(path / "a")}
    shown = 0
    for c in rows.values():
        if c.kind != "text" or not c.prompt:
            continue
        for child, _, mark in LINE.findall(json.loads(c.prompt)[-1]["content"]):
            earlier = rows[int(child)]
            # a child of the same parent, committed before this one, failed with that very error
            assert earlier.id < c.id and earlier.parent_ids[0] == c.parent_ids[0]
            assert not earlier.valid and f"MARKED-{mark}" in earlier.error
            shown += 1
    failed = sum(1 for c in rows.values() if c.error and "MARKED" in c.error)
    assert failed >= 5 and shown >= 3, (failed, shown)


def test_the_lessons_call_is_ledgered_under_meta_and_stored_with_its_cost(memory_run):
    path, requests = memory_run
    notes = [c for c in stored(path / "a") if c.kind == "lessons"]
    with Store(path / "a" / "store.sqlite", readonly=True) as store:
        meta = sum(row[2] for row in store.calls.totals() if row[0] == "meta")
    assert len(notes) >= 1 and meta == len(notes)
    assert all(n.text == NOTE and n.response == NOTE and n.cost > 0 for n in notes)
    stats = json.loads(notes[-1].prompt)[0]["content"]
    assert "- rewrite: " in stats and "MARKED-" in stats  # the engine's statistics, to be phrased
    later = [r for r in requests if "lessons note" not in r["messages"][-1]["content"]][-4:]
    assert any(f"Lessons from this run: {NOTE}" in r["messages"][-1]["content"] for r in later)


def test_a_rerun_from_the_cache_replays_memory_exactly(memory_run, server, tmp_path):
    path, _ = memory_run
    asked = len(server.requests)
    run_engine(
        build_engine(memory_config(server.base_url, f"llm.cache_dir={path / 'cache'}"), tmp_path / "b")
    )
    assert len(server.requests) == asked  # every answer from the cache

    def fingerprint(run):
        return [(c.kind, c.text, c.prompt, list(c.parent_ids), c.fitness, c.error) for c in stored(run)]

    assert fingerprint(path / "a") == fingerprint(tmp_path / "b")


def test_a_resumed_run_rebuilds_the_memory_it_had_and_shows_it(server, tmp_path):
    first = build_engine(memory_config(server.base_url, "runner.max_llm_calls=12"), tmp_path)
    live = first.parts.proposer.memory
    run_engine(first)
    last = max(c.id for c in stored(tmp_path))
    second = build_engine(memory_config(server.base_url, "runner.max_llm_calls=24"), tmp_path)
    rebuilt = second.parts.proposer.memory
    assert repr(rebuilt.rings) == repr(live.rings) and rebuilt.rings
    assert rebuilt.tally == live.tally and (rebuilt.note, rebuilt.noted_at) == (live.note, live.noted_at)
    assert any(a.fate == "kept" for ring in rebuilt.rings.values() for a in ring)  # from the cache
    run_engine(second)
    resumed = [c for c in stored(tmp_path) if c.id > last and c.kind == "text" and c.prompt]
    assert any(int(i) <= last for c in resumed for i in re.findall(r"- child #(\d+) ", c.prompt))


def test_fates_follow_the_row_and_rings_keep_the_newest():
    memory = ChildMemory(_Cache(), children=2)
    rows = [
        Candidate("text", 0, 1.0, None, True, text="p", id=0),
        Candidate("text", 0, float("nan"), None, False, None, parent_ids=[0], error="no code", id=1),
        Candidate("text", 0, 0.5, None, True, text="a", parent_ids=[0], id=2),
        Candidate("text", 0, float("nan"), None, False, "b", parent_ids=[0], error="gate", id=3),
        Candidate("text", 0, 2.0, None, True, text="c", parent_ids=[0], id=4),
    ]
    rows[3].metrics = {SIMILARITY: 0.99}
    memory.committed(rows, [1, 0, 0, 0, 1])
    assert [(a.id, a.fate) for a in memory.recall([0]).children(0, 5)] == [(4, "kept"), (3, "rejected")]
    assert fate(Candidate("text", 0, 1.0, None, True, "d", artifacts={REUSED: 2}), False)[0] == "duplicate"
    trial = Candidate("text", 0, 0.7, None, False, "e", artifacts={TRIAL: "first stage"})
    assert fate(trial, False) == ("trial", None)  # an agent's trial: never placed, not a failure
    assert memory.recall([0]).children(0, 1)[0].parent_fitness == 1.0
    assert dict(memory.tally.failures) == {"no code": 1, "gate": 1}
    assert memory.tally.operators == {"-": [4, 1]}


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["experiment=sphere", "memory=on"], "memory"),
        (["experiment=function_fit", "memory=on", "memory.max_tokens=8"], "memory.max_tokens"),
    ],
)
def test_the_plan_refuses_memory_it_cannot_show(overrides, field):
    with pytest.raises(ConfigError) as err:
        plan(compose(overrides))
    assert err.value.field == field


class _Cache:
    """An in-memory ``qd.contract.Cache``."""

    def __init__(self):
        self.kinds: dict[str, dict[str, bytes]] = {}

    def get(self, kind, keys):
        return {k: v for k in keys if (v := self.kinds.get(kind, {}).get(k)) is not None}

    def put(self, kind, values):
        self.kinds.setdefault(kind, {}).update(values)


@pytest.mark.slow
def test_the_longest_prompt_of_a_smollm2_run_with_memory_fits_its_context(tmp_path, llama_server):
    """Prompt and answer tokens as the server counted them (the ledger's), per call, within the
    embedded model's 2,048-token context, with the memory block in the prompts."""
    cfg = compose(
        [
            "experiment=function_fit",
            *on_server(llama_server.base_url, llama_server.model),
            "runner.max_llm_calls=12",
            "runner.in_flight=2",
            "memory=on",
            "memory.lessons_every=3",
        ]
    )
    summary = run_engine(build_engine(cfg, tmp_path))
    calls = [c for c in stored(tmp_path) if c.model is not None]
    shown = sum("Recent children of this program" in c.prompt for c in calls)
    longest = max(c.tokens_in + c.tokens_out for c in calls)
    print(f"calls {len(calls)}, with the block {shown}, longest prompt + answer {longest} tokens")
    assert summary["llm"]["failed_calls"] == 0 and summary["llm"]["per_role"]["meta"]["calls"] >= 1
    assert shown >= 3 and longest <= 2048, (shown, longest)
