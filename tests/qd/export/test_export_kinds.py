"""The ``dpo``, ``diverse`` and ``trajectory`` export kinds, read straight from finished runs:
preference pairs share their prompt and their margin is the stored fitness gap, the
diverse picks are reproducible and spread wider than chance, and agent trajectories
hold every model call and fit the shipped JSON Schema."""

import json
import shutil
from collections import Counter

import jsonschema
import numpy as np
import pytest
from helpers import run_config
from scripted_llm import Rule

from qd import history
from qd.export import diverse, dpo, trajectory
from qd.export.rows import messages
from qd.plan import compose
from qd.rundir import RunDir
from qd.store import Store
from qd.task import load_task

# An agent that asks, then asks again in the same conversation: its trajectory must read as one.
TWO_TURNS = """```python
def forward(task, llm):
    said = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task}]
    first = llm(said, max_tokens=16)
    return llm(said + [{"role": "assistant", "content": first}, {"role": "user", "content": "Sure?"}],
               max_tokens=16)
```"""


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory, scripted_llm_module):
    """A finished agent_design run: the six hand-designed agents and meta_agent's two-turn children."""
    server = scripted_llm_module([Rule("You design LLM agents", TWO_TURNS), Rule("", "Answer: 9")])
    path = tmp_path_factory.mktemp("agent_run")
    run_config(
        compose(
            [
                "experiment=agent_design",
                "llm.provider=server",
                f"llm.base_url={server.base_url}",
                "llm.models=[{name: scripted}]",
                "llm.api_key_env=null",
                "llm.timeout_s=10",
                "runner.progress=false",
                "experiment.params.search_items=2",
                "runner.max_llm_calls=30",
                "eval_llm.calls=4",
                "runner.workers=2",
                "sandbox.wall_s=20",
                "operators.mix=[{name: meta_agent, num_inspirations: 1, debug_rounds: 0}]",
            ]
        ),
        path,
    )
    return path


@pytest.fixture(scope="module")
def scripted_llm_module():
    """``scripted_llm`` for a module-scoped fixture."""
    from scripted_llm import ScriptedLLM

    servers = []

    def make(rules):
        servers.append(ScriptedLLM(rules).start())
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


# -- dpo ------------------------------------------------------------------------------------------


def group_of(run, row) -> tuple:
    """What ``max_pairs_per_prompt`` caps: a sibling group (first parent, operator, prompt) or a cell."""
    if row["source"] == "cell":
        return row["island"], row["cell"]
    (chosen,) = run.store.get([row["chosen_id"]])
    return chosen.parent_ids[0], chosen.operator, chosen.prompt


def test_dpo_pairs_share_their_prompt_and_their_margin_is_the_stored_fitness_gap(text_run):
    with RunDir(text_run) as run:
        rows = list(dpo.rows(run, {}))
        assert rows == list(dpo.rows(run, {}))  # deterministic
        assert Counter(r["source"] for r in rows).keys() == {"siblings", "cell"}
        cfg = run.config()
        task = load_task(cfg.experiment.task, dict(cfg.experiment.params))
        snap, fates = run.snapshot(), history.fates(run)
        at = {int(i): k for k, i in enumerate(fates["id"])}
        for r in rows:
            chosen, rejected = run.store.get([r["chosen_id"], r["rejected_id"]])
            assert chosen.valid and rejected.valid
            assert r["margin"] == chosen.fitness - rejected.fitness > 0
            assert r["chosen"] != r["rejected"]
            assert [m["role"] for m in r["chosen"] + r["rejected"]] == ["assistant", "assistant"]
            if r["source"] == "siblings":  # the same parent, operator and prompt; the answers differ
                assert chosen.parent_ids[0] == rejected.parent_ids[0] and chosen.operator == rejected.operator
                assert chosen.prompt == rejected.prompt and r["prompt"] == messages(chosen.prompt)
                assert (r["chosen"][0]["content"], r["rejected"][0]["content"]) == (
                    chosen.response,
                    rejected.response,
                )
            else:  # the cell's elite against one it beat there; the task is the prompt
                assert r["prompt"] == [{"role": "user", "content": task.description}]
                assert snap.genome_id[r["island"], r["cell"]] == chosen.id
                assert rejected.island == r["island"] and fates["cell"][at[rejected.id]] == r["cell"]
                assert (r["chosen"][0]["content"], r["rejected"][0]["content"]) == (
                    chosen.text,
                    rejected.text,
                )
        groups = Counter(group_of(run, r) for r in rows)
        assert max(groups.values()) <= dpo.OPTIONS["max_pairs_per_prompt"]


def test_dpo_options_set_the_margin_the_pairs_per_prompt_and_the_sources(text_run):
    with RunDir(text_run) as run:
        every = list(dpo.rows(run, {}))
        wide = list(dpo.rows(run, {"min_margin": 1.0}))
        assert wide and all(r["margin"] >= 1.0 for r in wide) and len(wide) < len(every)
        one = list(dpo.rows(run, {"max_pairs_per_prompt": 1, "task_pairs": False}))
        assert {r["source"] for r in one} == {"siblings"}
        widest: dict[tuple, dict] = {}  # each group's first pair: its widest margin
        for r in every:
            if r["source"] == "siblings":
                widest.setdefault(group_of(run, r), r)
        assert one == list(widest.values())


# -- diverse -------------------------------------------------------------------------------------


def check_picks(run, rows, k):
    assert len(rows) == k and [r["rank"] for r in rows] == list(range(k))
    top = run.best()["fitness"]  # the best elite first; of tied ones, the lowest id
    assert rows[0]["id"] == min(e["id"] for e in run.elites() if e["fitness"] == top)
    assert rows[0]["min_distance"] is None
    gaps = [r["min_distance"] for r in rows[1:]]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] >= 0
    assert len({r["id"] for r in rows}) == k


def vector_run(path):
    """A run directory made by hand: four vectors, one per cell of a 2x2 grid on [0, 10]^2."""
    from qd.contract import Candidate
    from qd.rundir import Geometry

    path.mkdir()
    (path / "config.yaml").write_text("experiment: {task: sphere}\n")
    Geometry(
        kind="grid",
        islands=1,
        cells=4,
        dim=2,
        bins=(2, 2),
        lower=(0.0, 0.0),
        upper=(10.0, 10.0),
        axes=("a", "b"),
    ).save(path)
    with Store(path / "store.sqlite") as store:
        store.add(
            [
                Candidate(
                    kind="vector",
                    island=0,
                    fitness=f,
                    descriptor=np.asarray(d, np.float32),
                    valid=True,
                    vector=np.asarray(d, np.float32),
                    genome="vector",
                )
                for f, d in [(5.0, (1, 1)), (1.0, (9, 9)), (2.0, (9, 1)), (3.0, (1, 9))]
            ]
        )
    return path


def test_diverse_picks_the_best_then_the_farthest_in_the_scaled_descriptor_space(tmp_path):
    with RunDir(vector_run(tmp_path / "run")) as run:
        rows = list(diverse.rows(run, {}))
        assert rows == list(diverse.rows(run, {}))
        check_picks(run, rows, 4)
        # (9, 1) and (1, 9) are equally far from both picks before them: the lower id first
        assert [(r["id"], r["fitness"], r["space"]) for r in rows] == [
            (0, 5.0, "descriptor"),
            (1, 1.0, "descriptor"),
            (2, 2.0, "descriptor"),
            (3, 3.0, "descriptor"),
        ]
        assert [r["min_distance"] for r in rows[1:]] == pytest.approx([0.8 * 2**0.5, 0.8, 0.8])
        assert json.loads(rows[1]["text"]) == [9.0, 9.0]
        floor = diverse.report(run, {"min_fitness": 2.5, "k": 2})
        assert (floor["pool"], floor["below_floor"], floor["selected"]) == (
            2,
            2,
            {"diversity": 0.8, "quality": 4.0},
        )
        r = diverse.report(run, {"k": 2})
        assert r["selected"]["diversity"] >= r["random"]["diversity"]


def test_diverse_uses_the_cached_embeddings_when_every_elite_has_one(text_run, tmp_path):
    """Without an embedding descriptor the run cached nothing: descriptors; with every
    elite's embedding in the store's cache (put there here), the embedding space."""
    from descriptors.embedding import CACHE_KIND, _key

    with RunDir(text_run) as run:
        assert {r["space"] for r in diverse.rows(run, {"k": 4})} == {"descriptor"}
        elites = run.elites()
    copy = tmp_path / "run"
    shutil.copytree(text_run, copy)
    unit = np.random.default_rng(0).normal(size=(len(elites), 384)).astype("<f4")
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    vector = {e["text"]: v for e, v in zip(elites, unit)}  # elites may share a text, and so its embedding
    with Store(copy / "store.sqlite") as store:
        store.cache.put(CACHE_KIND, {_key(text): v.tobytes() for text, v in vector.items()})
    with RunDir(copy) as run:
        rows = list(diverse.rows(run, {"k": 4}))
        check_picks(run, rows, 4)
        assert {r["space"] for r in rows} == {"embedding"}
        for k, r in enumerate(rows[1:], 1):
            assert r["min_distance"] == pytest.approx(
                min(np.linalg.norm(vector[r["text"]] - vector[p["text"]]) for p in rows[:k]), rel=1e-5
            )
        r = diverse.report(run, {"k": 4, "seed": 3})
        assert r["space"] == "embedding" and r["selected"]["diversity"] >= r["random"]["diversity"]
        longest = max(len(e["text"]) for e in elites)
        short = diverse.report(run, {"max_chars": longest - 1})
        assert short["too_long"] >= 1 and short["pool"] == len(elites) - short["too_long"]
        assert all(len(r["text"]) < longest for r in diverse.rows(run, {"max_chars": longest - 1}))


# -- trajectory ----------------------------------------------------------------------------------


def test_trajectories_hold_every_model_call_per_task_item_and_fit_the_shipped_schema(agent_run):
    schema = json.loads(trajectory.SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    with RunDir(agent_run) as run:
        rows = list(trajectory.rows(run, {}))
        agents = [c for c in run.store.iter() if c.genome == "agent" and run.store.traces.of(c.id)]
        assert (
            len(agents) >= 7
        )  # the six founders and a child (duplicates reuse its evaluation, without calls)
        items = [
            (c, item)
            for c in agents
            for item in sorted({call.get("item") for call in run.store.traces.of(c.id)})
        ]
        assert {item for _, item in items} == {
            0,
            1,
        }  # search_items=2: every call says which question it served
        assert [r["id"] for r in rows] == [f"{run.name}/{c.id}/{item}" for c, item in items]
        answered_per_agent: dict[int, int] = {}
        for r, (c, item) in zip(rows, items):
            validator.validate(r)
            calls = [call for call in run.store.traces.of(c.id) if call["item"] == item]
            said = [s["content"] for s in r["content"]]
            answered = [call for call in calls if "text" in call]
            assert r["details"]["calls"] == len(answered)
            assert r["details"]["item"] == item
            answered_per_agent[c.id] = answered_per_agent.get(c.id, 0) + len(answered)
            assert r["details"]["candidate"] == c.id and r["details"]["fitness"] == c.fitness
            at = 0
            for call in calls:  # every call's messages (new ones) and its answer, in order
                for m in (call["messages"] or [])[-1:]:
                    at = said.index(m["content"], at)
                at = said.index(call.get("text", call.get("error")), at)
        assert answered_per_agent == {c.id: c.metrics["model_calls"] for c in agents}
        two_turns = [r for r, (c, _) in zip(rows, items) if c.operator == "meta_agent" and c.valid]
        assert len(two_turns) == 2, "meta_agent made a valid two-turn agent, answering both questions"
        questions = [r["content"][1]["content"] for r in two_turns]
        assert questions[0] != questions[1]
        for r, question in zip(two_turns, questions):
            assert [(s["type"], s["source"], s["content"]) for s in r["content"]] == [
                ("observation", "environment", "Be brief."),
                ("message", "user", question),
                ("message", "agent", "Answer: 9"),
                ("message", "user", "Sure?"),
                ("message", "agent", "Answer: 9"),
            ]


def test_trajectory_steps_of_a_failed_call_and_of_a_fresh_conversation():
    ask = [{"role": "user", "content": "q"}]
    assert trajectory.steps(
        [
            {"messages": ask, "text": "a"},
            {"messages": [{"role": "user", "content": "other"}], "error": "llm: call budget spent"},
            {"messages": None, "error": "llm: messages: got int"},
        ]
    ) == [
        {"type": "message", "source": "user", "content": "q"},
        {"type": "message", "source": "agent", "content": "a"},
        {"type": "message", "source": "user", "content": "other"},
        {"type": "observation", "source": "environment", "content": "llm: call budget spent"},
        {"type": "observation", "source": "environment", "content": "llm: messages: got int"},
    ]


def test_a_run_without_agents_has_no_trajectories_and_says_so_in_one_line(text_run):
    with RunDir(text_run) as run, pytest.raises(ValueError) as err:
        next(trajectory.rows(run, {}))
    assert "no agent genomes" in str(err.value) and "\n" not in str(err.value)
