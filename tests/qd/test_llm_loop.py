"""The loop on a text task with LLM operators: scripted server (fast) and real llama.cpp (slow).

Runs function_fit end to end: LLM call -> child -> sandbox -> store -> archive,
with malformed answers, dead servers, budgets, and cache replay.
"""

import json
import shutil

import pytest
from helpers import run_config, stored, varied_program
from scripted_llm import Rule

from qd.contract import Completion
from qd.plan import compose

PERFECT = "```python\ndef f(x):\n    return x * x + 0.5 * x + 2.0\n```"
CLOSE = "Try this:\n```python\ndef f(x):\n    return x * x - x\n```"
NO_CODE = "I am sorry, I cannot write code."
SYNTAX = "```python\ndef f(x)\n    return x\n```"
LOOPS = "```python\ndef f(x):\n    while True:\n        pass\n```"
ANSWERS = [PERFECT, CLOSE, NO_CODE, SYNTAX, LOOPS]


def by_seed(request: dict) -> str:
    """A different canned answer per sample (the client derives the seed from the sample index)."""
    return ANSWERS[int(request.get("seed") or 0) % len(ANSWERS)]


def config(base_url: str, *overrides: str):
    return compose(
        [
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={base_url}",
            "llm.models=[{name: scripted, price_in: 1.0, price_out: 2.0}]",
            "llm.api_key_env=null",
            "llm.backoff_s=0.01",
            "llm.backoff_max_s=0.02",
            "llm.timeout_s=5",
            "runner.progress=false",
            "runner.max_llm_calls=24",
            "runner.in_flight=4",
            "runner.workers=2",
            "sandbox.wall_s=1",
            "sandbox.cpu_s=2",  # an endless loop always hits the wall clock first
            "operators.mix=[{name: rewrite}]",
            *overrides,
        ]
    )


def test_llm_children_are_evaluated_in_the_sandbox_and_malformed_ones_stored(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", by_seed)])
    summary = run_config(config(server.base_url), tmp_path)
    rows = stored(tmp_path)
    children = [c for c in rows if c.operator == "rewrite"]
    assert len(children) == 24 == summary["llm"]["calls"]  # max_llm_calls, exactly
    errors = " | ".join(c.error or "" for c in children)
    assert "no code block" in errors and "syntax error" in errors and "timeout" in errors
    assert all(not c.valid and c.error for c in children if c.response in (NO_CODE, SYNTAX, LOOPS))
    best = max(c.fitness for c in rows if c.valid)
    assert best == pytest.approx(0.0, abs=1e-9)  # the perfect answer found and scored
    seeds = [c for c in rows if c.operator == "init"]
    assert seeds and all(c.model is None and c.tokens_in == 0 for c in seeds)
    for c in children:  # cost ledger per candidate, from the configured prices
        assert c.model == "scripted" and c.tokens_in > 0 and c.prompt and c.response
        assert c.cost == pytest.approx((c.tokens_in * 1.0 + c.tokens_out * 2.0) / 1e6)
    assert summary["llm"]["cost"] == pytest.approx(sum(c.cost for c in children))
    assert summary["global"]["max_fitness"] == pytest.approx(0.0, abs=1e-6)
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["llm"]["calls"] == 24


def test_parents_feedback_reaches_later_prompts(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", by_seed)])
    run_config(config(server.base_url), tmp_path)
    prompts = "\n".join(json.dumps(r["messages"]) for r in server.requests)
    assert "rmse_held_out" in prompts  # the parent's metrics
    assert "def f(x)" in prompts and "f(-3) = 9.5" in prompts  # program and task


class Programs:
    """A ChatClient the caller brings: a plain class, no HTTP, answering ``ANSWERS`` by sample."""

    def __init__(self):
        self.calls = 0

    def pick_model(self, rng):
        return "scripted"

    async def complete(
        self,
        messages,
        *,
        model=None,
        temperature=None,
        max_tokens=None,
        sample_index=0,
        stop=None,
        role="operator",
    ):
        self.calls += 1
        return Completion(ANSWERS[sample_index % len(ANSWERS)], model, 50, 20, 0.0, False, "stop", 0.0)


def test_a_callers_chat_client_runs_in_the_ledger_and_stops_at_max_llm_calls(tmp_path, monkeypatch):
    """Wrapped as ``LLMClient(settings, transport=ChatTransport(chat))``, a caller's client is held to
    ``runner.max_llm_calls`` and priced by ``llm.models`` like the endpoint; the endpoint is never asked."""
    from qd import run
    from qd.llm import ChatTransport, LLMClient

    chat = Programs()
    monkeypatch.setattr(
        run, "build_llm", lambda p, run_dir, stack: LLMClient(p.llm.settings, transport=ChatTransport(chat))
    )
    summary = run_config(config("http://127.0.0.1:9/v1", "runner.max_llm_calls=6"), tmp_path)
    children = [c for c in stored(tmp_path) if c.operator == "rewrite"]
    assert chat.calls == 6 == summary["llm"]["calls"] == len(children)
    assert all(c.cost == pytest.approx((50 * 1.0 + 20 * 2.0) / 1e6) for c in children)
    assert max(c.fitness for c in children if c.valid) == pytest.approx(0.0, abs=1e-9)  # PERFECT, scored


def test_rerun_with_the_cache_replays_the_run_exactly_without_the_server(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", by_seed)], latency_s=0.01)
    cache = tmp_path / "cache"
    run_config(config(server.base_url, f"llm.cache_dir={cache}"), tmp_path / "a")
    server.stop()  # the replay must not need it
    run_config(config(server.base_url, f"llm.cache_dir={cache}", "llm.max_retries=0"), tmp_path / "b")

    def fingerprint(path):
        return [
            (
                c.text,
                c.operator,
                list(c.parent_ids),
                c.fitness,
                c.valid,
                c.error,
                c.tokens_in,
                c.cost,
                c.island,
            )
            for c in stored(path)
        ]

    assert fingerprint(tmp_path / "a") == fingerprint(tmp_path / "b")


@pytest.mark.parametrize(
    "budget, field", [("runner.max_tokens=3000", "tokens"), ("runner.max_cost=0.002", "cost")]
)
def test_token_and_cost_budgets_stop_the_run(tmp_path, scripted_llm, budget, field):
    server = scripted_llm([Rule("", PERFECT)])
    summary = run_config(
        config(server.base_url, budget, "runner.max_llm_calls=500", "runner.in_flight=1"), tmp_path
    )
    ledger = summary["llm"]
    assert 0 < ledger["calls"] < 500
    if field == "tokens":
        assert 3000 <= ledger["tokens_in"] + ledger["tokens_out"] < 3000 + 1000
    else:
        assert 0.002 <= ledger["cost"] < 0.002 + 0.0005


@pytest.mark.slow
def test_real_llama_server_produces_valid_children_that_fill_new_cells(tmp_path, llama_server):
    """SmolLM2's children run, and the archive grows past the seed programs: valid children in cells
    that no seed program holds.

    Named "..._that_improve_on_the_seed" before, it checked that some child beat its own parent. Neither
    is something SmolLM2-135M does reliably in 40 calls. Measured with this config, run seeds 0-4: a
    child beat the best seed program's fitness in 3 of 5 runs (at children 8, 21, 29; never when that
    program is `x * x`: run seed 0 had none in 80 calls, run seed 2 none in 40); a child beat its own
    parent in 4 of 5. With runner.initial_population=1 (one weak seed program), run seeds 0, 1, 3-6:
    a child beat it in 2 of 6. So neither is asserted; fitness progress is left to the scripted-server
    tests and the benchmarks.
    """
    cfg = compose(
        [
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={llama_server.base_url}",
            f"llm.models=[{{name: {llama_server.model}}}]",
            "llm.api_key_env=null",
            "runner.progress=false",
            "runner.max_llm_calls=40",
            "runner.in_flight=2",
        ]
    )
    summary = run_config(cfg, tmp_path)
    rows = stored(tmp_path)
    seeds = [c for c in rows if c.operator == "init"]
    children = [c for c in rows if c.model is not None]
    assert len(children) >= 40
    valid = [c for c in children if c.valid]
    assert seeds
    # Cells the seeds hold: at most one per distinct seed descriptor, so this undercounts new cells.
    seed_cells = len({tuple(c.descriptor) for c in seeds if c.valid})
    new_cells = summary["global"]["num_elites"] - seed_cells
    # Measured over 11 runs of 40 calls (this config with run seeds 0-4, and initial_population=1 with
    # run seeds 0, 1, 3-6): valid children min 7, median 16, max 22 (this config: 15-18); new cells min 4,
    # median 8, max 12 (this config: 7-9). Floors: 8 valid children, 3 new cells.
    assert len(valid) >= 8, [c.error for c in children]
    assert new_cells >= 3, (summary["global"], seed_cells)
    assert summary["llm"]["tokens_out"] > 0
    # every answered call is a stored child, and the ledger says who made it
    assert summary["llm"]["calls"] == len(children) == summary["llm"]["per_role"]["operator"]["calls"]


def test_progress_line_shows_llm_calls_tokens_and_cost(tmp_path, scripted_llm, capsys):
    server = scripted_llm([Rule("", PERFECT)])
    run_config(config(server.base_url, "runner.progress=true", "runner.max_llm_calls=4"), tmp_path)
    done = [line for line in capsys.readouterr().err.splitlines() if line.startswith("done")][-1]
    assert "llm_calls=4 failed=0" in done and "in_flight=0" in done and "tokens=" in done and "cost=$" in done


def test_resume_continues_the_ledger_and_the_llm_budget(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", by_seed)])
    first = run_config(config(server.base_url, "runner.max_llm_calls=12"), tmp_path)
    second = run_config(config(server.base_url, "runner.max_llm_calls=20"), tmp_path)
    rows = stored(tmp_path)
    assert sum(c.model is not None for c in rows) == 20 == second["llm"]["calls"]
    assert second["llm"]["tokens_in"] > first["llm"]["tokens_in"]
    assert second["llm"]["cost"] == pytest.approx(sum(c.cost for c in rows))


def test_rows_stored_after_the_checkpoint_move_the_resumed_proposal_clock_past_theirs(tmp_path, scripted_llm):
    """``kill -9`` between a commit's rows and its checkpoint (made here by putting back the checkpoint
    of the proposal before): the resume replays the rows and goes on with the next proposal, as the
    run left alone does. Drawing the replayed proposal's number again repeats its island, parents and
    seed: a duplicate child where the run left alone has a new one."""
    server = scripted_llm([Rule("", varied_program)])
    runs = {name: tmp_path / name for name in ("before", "killed", "alone")}

    def run(name: str, calls: int) -> None:
        one_at_a_time = ("runner.in_flight=1", "runner.checkpoint_every=1", "islands.count=2", "seed=2")
        run_config(config(server.base_url, *one_at_a_time, f"runner.max_llm_calls={calls}"), runs[name])

    run("before", 5)
    run("killed", 6)
    shutil.copytree(runs["before"] / "checkpoints", runs["killed"] / "checkpoints", dirs_exist_ok=True)
    run("killed", 10)
    run("alone", 10)
    children = {name: [(c.island, c.parent_ids, c.text) for c in stored(runs[name])] for name in runs}
    assert len(children["alone"]) == len(children["killed"]) > len(children["before"]) + 1
    assert children["killed"] == children["alone"]


def test_wide_in_flight_seeds_only_the_initial_population(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", by_seed)])
    run_config(
        config(
            server.base_url, "runner.in_flight=32", "runner.initial_population=3", "runner.max_llm_calls=40"
        ),
        tmp_path,
    )
    rows = stored(tmp_path)
    assert sum(c.operator == "init" for c in rows) == 3
    assert sum(c.model is not None for c in rows) == 40


def test_a_wave_of_proposals_is_one_store_transaction_and_one_insert(tmp_path, scripted_llm, monkeypatch):
    from qd import loop
    from qd.store import Store

    adds, inserts = [], []
    add, insert = Store.add, loop.archive.insert
    monkeypatch.setattr(
        Store,
        "add",
        lambda self, cands, calls=(), **kw: adds.append(len(cands)) or add(self, cands, calls, **kw),
    )
    monkeypatch.setattr(loop.archive, "insert", lambda *a, **k: inserts.append(1) or insert(*a, **k))
    server = scripted_llm([Rule("", by_seed)])
    run_config(config(server.base_url, "runner.in_flight=8", "runner.max_llm_calls=32"), tmp_path)
    commits = [
        e
        for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
        if e["event"] == "commit"
    ]
    assert len(commits) == len(stored(tmp_path))  # batch 1: a line per proposal
    assert max(e["wave"] for e in commits) == 4  # waves of in_flight / 2
    assert len(adds) == len(inserts) == round(sum(1 / e["wave"] for e in commits)) < len(commits)
    assert [e["evaluations"] for e in commits] == list(range(1, len(commits) + 1))


@pytest.mark.parametrize("rule", ["uniform", "fitness"])
def test_parents_are_drawn_per_wave_never_per_proposal(tmp_path, scripted_llm, monkeypatch, rule):
    """Uniform selection costs no jitted dispatch (numpy on the host); any other rule, one per
    wave (``select.wave``); the per-proposal draws are never used by the loop."""
    from qd.search import select

    def per_proposal(*args, **kwargs):
        raise AssertionError("a jitted draw per proposal")

    calls = {"wave": 0, "wave_uniform": 0}
    for name in calls:
        real = getattr(select, name)
        monkeypatch.setattr(
            select,
            name,
            lambda *a, real=real, name=name, **k: calls.__setitem__(name, calls[name] + 1) or real(*a, **k),
        )
    monkeypatch.setattr(select, "parents", per_proposal)
    monkeypatch.setattr(select, "inspirations", per_proposal)
    server = scripted_llm([Rule("", by_seed)])
    run_config(
        config(
            server.base_url,
            "runner.in_flight=8",
            f"select.parents={rule}",
            "operators.mix=[{name: inspiration}]",
        ),
        tmp_path,
    )
    children = sum(c.model is not None for c in stored(tmp_path))
    used, unused = ("wave", "wave_uniform") if rule == "fitness" else ("wave_uniform", "wave")
    assert children == 24 and 0 < calls[used] <= children / 2 and calls[unused] == 0


def test_a_childs_prompt_generator_is_made_only_when_drawn_from(tmp_path, scripted_llm, monkeypatch):
    """Making a numpy generator per child cost ~50 us of the loop's ~1.2 ms per candidate. With
    one model and no meta prompts nothing draws from it, and none is made; with two models each
    child's weighted pick draws from its own, and the run is what the eager generator gave."""
    import numpy as np

    from qd import proposers

    made = []
    real = proposers._LazyGenerator._generator
    monkeypatch.setattr(proposers._LazyGenerator, "_generator", lambda self: made.append(1) or real(self))
    server = scripted_llm([Rule("", by_seed)])
    run_config(config(server.base_url), tmp_path / "one")
    assert made == []
    two = "llm.models=[{name: a}, {name: b}]"
    run_config(config(server.base_url, two), tmp_path / "lazy")
    assert made
    monkeypatch.setattr(proposers, "_LazyGenerator", np.random.default_rng)
    run_config(config(server.base_url, two), tmp_path / "eager")
    lazy, eager = ([(c.model, c.text) for c in stored(tmp_path / d)] for d in ("lazy", "eager"))
    assert lazy == eager and {m for m, _ in lazy} == {None, "a", "b"}


def test_objects_alive_when_a_run_starts_sit_out_its_collections(tmp_path, scripted_llm, monkeypatch):
    """The imports and built parts are frozen out of the garbage collector's passes for the run
    (its full passes walked them all, 66 ms each at function_fit's size), and given back after."""
    import gc

    from qd import loop

    frozen = []
    commit = loop.Engine._commit

    async def counting(self, proposals):
        frozen.append(gc.get_freeze_count())
        return await commit(self, proposals)

    monkeypatch.setattr(loop.Engine, "_commit", counting)
    before = gc.get_freeze_count()
    run_config(config(scripted_llm([Rule("", by_seed)]).base_url), tmp_path)
    assert frozen and min(frozen) > before + 10_000 and gc.get_freeze_count() == before
