"""Search strategies in whole runs: bandit scheduler, meta-prompts, novelty gate,
exact-duplicate reuse, CycleQD rotation, island resets, and start-time checks."""

import itertools
import json

import numpy as np
import pytest
from helpers import run_config, small_config, stored
from scripted_llm import Rule

from qd import archive
from qd.contract import ConfigError
from qd.plan import compose, plan


def config(base_url: str, *overrides: str):
    return compose(
        [
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={base_url}",
            "llm.api_key_env=null",
            "llm.backoff_s=0.01",
            "llm.backoff_max_s=0.02",
            "llm.timeout_s=5",
            "runner.progress=false",
            "runner.in_flight=1",
            "runner.workers=2",
            "sandbox.wall_s=2",
            "sandbox.cpu_s=2",
            "operators.mix=[{name: rewrite}]",
            # one cell per node count and per constant count: many cells to discover
            "archive.bins=[80,12]",
            *overrides,
        ]
    )


def new_cells():
    """Replies that each land in a new cell (more constants / more nodes), exact target."""
    count = itertools.count()

    def reply(request: dict) -> str:
        k = next(count)
        terms = " + 0.0" * (k % 8) + " + (x - x)" * ((k // 8) % 6)
        return f"```python\ndef f(x):\n    return x * x + 0.5 * x + 2.0{terms}\n```"

    return reply


def events(path) -> list[dict]:
    return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rule", ["ucb1", "thompson", "epsilon_greedy"])
def test_bandit_gives_the_clearly_better_arm_most_calls(tmp_path, scripted_llm, rule):
    # Two arms: the same operator on two models; "good" keeps finding new cells,
    # "bad" never answers with code (its children are invalid: no credit).
    good = new_cells()
    server = scripted_llm([Rule("", lambda r: good(r) if r["model"] == "good" else "Sorry, no code.")])
    cfg = config(
        server.base_url,
        f"scheduler={rule}",
        "llm.models=[{name: good}, {name: bad}]",
        "runner.max_llm_calls=100",
    )
    run_config(cfg, tmp_path)
    calls = [c.model for c in stored(tmp_path) if c.model is not None]
    assert len(calls) == 100
    assert calls.count("good") > 70, (rule, calls.count("good"))
    arms = [e["arm"] for e in events(tmp_path) if "arm" in e]
    assert len(arms) == 100 and set(arms) == {"rewrite@good", "rewrite@bad"}
    credited = [e for e in events(tmp_path) if e.get("arm") == "rewrite@good" and e["credit"] > 0]
    assert credited and all(e["cost"] == 1.0 for e in credited)


def test_bandit_state_survives_a_resume(tmp_path, scripted_llm):
    good = new_cells()
    server = scripted_llm([Rule("", lambda r: good(r) if r["model"] == "good" else "Sorry, no code.")])
    base = ["scheduler=ucb1", "llm.models=[{name: good}, {name: bad}]"]
    run_config(config(server.base_url, *base, "runner.max_llm_calls=20"), tmp_path)
    pulls = sum(1 for e in events(tmp_path) if "arm" in e)
    run_config(config(server.base_url, *base, "runner.max_llm_calls=40"), tmp_path)
    from qd.rundir import checkpoint

    saved = checkpoint.load_arrays(tmp_path / "checkpoints")
    assert pulls == 20 and float(saved["bandit.0.pulls"].sum()) == 40.0


def test_meta_prompt_credit_goes_to_the_instruction_whose_children_improved(tmp_path, scripted_llm):
    good = new_cells()

    def reply(request: dict) -> str:
        prompt = request["messages"][-1]["content"]
        if "Answer with the new instruction only" in prompt:  # the instruction mutation prompt
            return "Use method ALPHA, and add one more term."
        return good(request) if "ALPHA" in prompt else "Sorry, no code."

    server = scripted_llm([Rule("", reply)])
    cfg_overrides = [
        "meta=evolve",
        "meta.seeds=['Use method ALPHA.', 'Use method BETA.']",
        "meta.evolve_every=10",
        "llm.models=[{name: scripted}]",
        "runner.max_llm_calls=40",
    ]
    run_config(config(server.base_url, *cfg_overrides), tmp_path)
    rows = stored(tmp_path)
    instructions = {c.id: c for c in rows if c.kind == "instruction"}
    by_text = {c.text: c.id for c in instructions.values()}
    assert {"Use method ALPHA.", "Use method BETA."} <= set(by_text)
    meta = [e for e in events(tmp_path) if e.get("event") == "meta"]
    assert meta, "the instruction population never evolved"
    members = {m[0]: m for m in meta[-1]["members"]}
    alpha, beta = members[by_text["Use method ALPHA."]], members[by_text["Use method BETA."]]
    assert alpha[2] > 0 and beta[2] == 0 and alpha[1] > 0 and beta[1] > 0  # [id, uses, mean credit]
    evolved = [c for c in instructions.values() if c.operator == "meta" and c.text]
    assert evolved and all(c.parent_ids and c.parent_ids[0] in instructions for c in evolved)
    llm_rows = [c for c in rows if c.model is not None]
    assert len(llm_rows) == 40  # instruction mutations count against max_llm_calls
    # A resume counts them once: the budget is met exactly again.
    run_config(config(server.base_url, *cfg_overrides[:-1], "runner.max_llm_calls=60"), tmp_path)
    assert len([c for c in stored(tmp_path) if c.model is not None]) == 60


class WhitespaceBlindEncoder:
    """Stands in for MiniLM's ``Encoder``: cannot see whitespace (as MiniLM), so texts equal up to
    spaces embed identically (cosine 1) and any other edit gives an unrelated vector."""

    dim = 384

    def __init__(self, *args, **kwargs):
        pass

    def encode(self, texts):
        import hashlib

        seeds = [int(hashlib.sha256("".join(t.split()).encode()).hexdigest()[:16], 16) for t in texts]
        return np.stack([np.random.default_rng(s).normal(size=self.dim) for s in seeds]).astype(np.float32)


def test_novelty_gate_skips_a_near_duplicate_and_never_a_distinct_child(tmp_path, scripted_llm, monkeypatch):
    # The gate is the one gate=embedding builds (its threshold, its store-backed embedding cache);
    # only the model under it is a stand-in, so the test needs no MiniLM.
    import descriptors.embedding

    monkeypatch.setattr(descriptors.embedding, "Encoder", WhitespaceBlindEncoder)
    distinct = new_cells()

    def reply(request: dict) -> str:
        prompt = request["messages"][-1]["content"]
        code = prompt.split("```python\n", 1)[1].split("```", 1)[0]
        if request.get("seed", 0) % 2:  # the parent again, re-spaced: a near-duplicate
            return "```python\n" + code.replace("return ", "return  ") + "```"
        return distinct(request)

    server = scripted_llm([Rule("", reply)])
    cfg = config(
        server.base_url,
        "llm.models=[{name: scripted, weight: 1}]",
        "llm.seed=0",
        "runner.max_llm_calls=30",
        "gate=embedding",
        "gate.resample=0",
    )
    assert plan(cfg).strategy.gate == {
        "threshold": 1.0,
        "against": ("elites", "parents"),
        "resample": 0,
        "measure": "embedding",
    }
    run_config(cfg, tmp_path)
    children = [c for c in stored(tmp_path) if c.operator == "rewrite"]
    rejected = [c for c in children if c.error and c.error.startswith("novelty gate")]
    assert rejected and all(not c.valid and c.eval_seconds is None for c in rejected)
    assert all(c.metrics["gate_similarity"] >= 1.0 - 1e-6 for c in rejected)
    near = [c for c in children if "return  " in (c.text or "")]
    assert {c.id for c in near} == {c.id for c in rejected}  # every near-duplicate, nothing else


def test_exact_duplicates_reuse_the_stored_evaluation(tmp_path, scripted_llm):
    same = "```python\ndef f(x):\n    return x * x + 1.0\n```"
    server = scripted_llm([Rule("", same)])
    cfg = config(server.base_url, "llm.models=[{name: scripted}]", "runner.max_llm_calls=6")
    run_config(cfg, tmp_path)
    children = [c for c in stored(tmp_path) if c.operator == "rewrite" and c.text]
    first, *again = children
    assert first.eval_seconds is not None and again
    for c in again:
        assert c.artifacts["reused"] == first.id and c.eval_seconds is None
        assert c.fitness == first.fitness and c.valid == first.valid


def test_cycleqd_rotation_rebuilds_the_archive_with_every_stored_candidate(tmp_path):
    cfg = compose(
        [
            "experiment=skills",
            "cycle=skills",
            "cycle.every=1000",
            "cycle.bins=[8,8,8]",
            "runner.batch_size=100",
            "runner.max_evaluations=3500",
            "runner.progress=false",
            "runner.checkpoint_every=1000",
        ]
    )
    summary = run_config(cfg, tmp_path)
    rotations = [e for e in events(tmp_path) if e.get("event") == "rotate"]
    assert [e["phase"] for e in rotations] == [1, 2, 0]
    assert [e["quality"] for e in rotations] == ["skill_b", "skill_c", "skill_a"]
    for e in rotations:  # every valid stored candidate was offered again
        assert e["placed"] == e["candidates"] >= 1000
    # The final archive is exactly the rebuild of the whole store in the last phase.
    from qd.search.cycle import CyclicObjective

    rows = stored(tmp_path)
    cycle = CyclicObjective.create(["skill_a", "skill_b", "skill_c"], [0] * 3, [1] * 3, [8] * 3, 1000)
    fitness, descriptor, valid, _ = cycle.score(0, [c.metrics for c in rows], [c.valid for c in rows])
    spec = cycle.spec(0)
    expected = archive.rebuild(
        spec,
        1,
        np.zeros(len(rows), np.int32),
        descriptor,
        fitness,
        np.asarray([c.id for c in rows]),
        valid,
    )
    from qd.rundir import checkpoint

    state, _, _ = checkpoint.load(tmp_path / "checkpoints")
    # rows after the last rotation were inserted incrementally: same elites as a rebuild
    np.testing.assert_array_equal(np.asarray(state.genome_id), np.asarray(expected.genome_id))
    assert summary["global"]["num_elites"] == int((np.asarray(expected.genome_id) >= 0).sum())


def test_island_reset_is_recorded_and_a_resume_replays_it(tmp_path):
    cfg = small_config(
        "islands=funsearch", "islands.count=4", "islands.reset_patience=96", "runner.max_evaluations=1280"
    )
    run_config(cfg, tmp_path / "a")
    resets = [e for e in events(tmp_path / "a") if e.get("event") == "reset"]
    assert resets and all(len(e["islands"]) == 2 for e in resets)
    # a fresh engine on the same store rebuilds the same archive from the store alone
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints")
    from qd.run import build_engine

    engine = build_engine(cfg, tmp_path / "b")
    try:
        from qd.rundir import checkpoint

        live, _, _ = checkpoint.load(tmp_path / "a" / "checkpoints")
        np.testing.assert_array_equal(np.asarray(engine.state.archive.genome_id), np.asarray(live.genome_id))
    finally:
        engine.close()


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["islands.reset_patience=10"], "islands.reset_patience"),
        (["select.inspirations=islands"], "select.inspirations"),
        (["select.parents=greedy"], "select.parents"),
        (["select=instance"], "select.parents"),  # the task has no validation rows
        (["select=pareto"], "select.parents"),  # nor objectives
        (["select=hypervolume"], "select.parents"),
        (["select.inspirations=complement"], "select.inspirations"),
        (["scheduler.rule=softmax"], "scheduler.rule"),
        (
            [
                "islands=ring4",
                "islands.mix=[{isoline: 1}, {isoline: 1}, {isoline: 1}, {isoline: 1}]",
                "scheduler=ucb1",
            ],
            "islands.mix",
        ),
        (["islands=ring4", "islands.mix=[{isoline: 1.0}]"], "islands.mix"),
        (["meta=evolve"], "meta.enabled"),
        (["gate=embedding"], "gate.enabled"),
        (["cycle=skills", "cycle.bins=[8,8]"], "cycle.bins"),
        (["cycle=skills", "archive=cvt"], "cycle.metrics"),
    ],
)
def test_unknown_combinations_fail_at_start_naming_the_field(overrides, field):
    cfg = compose(["experiment=skills", *overrides])
    with pytest.raises(ConfigError) as err:
        plan(cfg)
    assert str(err.value).startswith(field), str(err.value)


@pytest.mark.slow
def test_all_llm_strategies_together_on_the_real_llama_server(tmp_path, llama_server):
    # Islands + inspiration from other islands + UCB1 over operators + evolving
    # instructions + the MiniLM gate, on SmolLM2: the run completes on budget,
    # every strategy leaves its trace, and a resume picks the state back up.
    overrides = [
        "experiment=function_fit",
        "llm.provider=server",
        f"llm.base_url={llama_server.base_url}",
        f"llm.models=[{{name: {llama_server.model}}}]",
        "llm.api_key_env=null",
        "runner.progress=false",
        "runner.in_flight=2",
        "islands=ring4",
        "islands.migrate_every=4",
        "select.inspirations=islands",
        "scheduler=ucb1",
        "scheduler.arms=operators",
        "meta=evolve",
        "meta.evolve_every=6",
        "gate=embedding",
    ]
    run_config(compose([*overrides, "runner.max_llm_calls=12"]), tmp_path)
    run_config(compose([*overrides, "runner.max_llm_calls=18"]), tmp_path)  # resume
    rows = stored(tmp_path)
    assert len([c for c in rows if c.model is not None]) == 18
    lines = events(tmp_path)
    pulled = [e["arm"] for e in lines if "arm" in e]
    assert set(pulled) <= {"rewrite", "inspiration", "crossover"} and len(set(pulled)) >= 2
    assert any(e.get("event") == "meta" for e in lines)
    assert {c.island for c in rows if c.kind == "text"} == {0, 1, 2, 3}
    instructions = [c for c in rows if c.kind == "instruction"]
    assert instructions and all(
        c.operator in ("seed", "seed>hyper", "meta", "meta>hyper") for c in instructions
    )
    from qd.rundir import checkpoint

    saved = checkpoint.load_arrays(tmp_path / "checkpoints")
    assert float(saved["bandit.0.pulls"].sum()) == len(pulled)


def test_per_island_models_send_each_island_to_its_own_model(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", lambda r: new_cells()(r))])
    cfg = config(
        server.base_url,
        "llm.models=[{name: a}, {name: b}]",
        "islands.count=2",
        "islands.models=[{a: 1}, {b: 1}]",
        "runner.max_llm_calls=8",
    )
    run_config(cfg, tmp_path)
    children = [c for c in stored(tmp_path) if c.model is not None]
    assert len(children) == 8 and {(c.island, c.model) for c in children} == {(0, "a"), (1, "b")}


def test_instruction_mutations_count_once_with_proposals_in_flight_and_across_a_resume(
    tmp_path, scripted_llm
):
    count = itertools.count()

    def reply(request: dict) -> str:
        if "Answer with the new instruction only" in request["messages"][-1]["content"]:
            return f"Try idea number {next(count)}."
        return f"```python\ndef f(x):\n    return x * x + {next(count) % 7}.0\n```"

    server = scripted_llm([Rule("", reply)])
    overrides = [
        "llm.models=[{name: scripted}]",
        "runner.in_flight=2",
        "islands=ring4",
        "islands.migrate_every=4",
        "select.inspirations=islands",
        "operators=llm",
        "scheduler=ucb1",
        "scheduler.arms=operators",
        "meta=evolve",
        "meta.evolve_every=6",
    ]
    for budget in (24, 32):
        summary = run_config(config(server.base_url, *overrides, f"runner.max_llm_calls={budget}"), tmp_path)
        assert len([c for c in stored(tmp_path) if c.model is not None]) == budget == summary["llm"]["calls"]
    assert any(c.kind == "instruction" and c.operator == "meta" for c in stored(tmp_path))
