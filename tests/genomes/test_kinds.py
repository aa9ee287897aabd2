"""Genome kinds: every kind through every operator; answers that are unusable become reasons."""

import asyncio
import json
import sqlite3

import pytest
from helpers import FakeClient, run_engine, stored
from scripted_llm import Rule

import genomes
from genomes import GenomeKind
from operators import Parent, PromptContext, make_llm_operator
from qd.contract import Candidate, ConfigError
from qd.store import Store

AGENT = '"""Direct: ask once."""\n\ndef forward(task, llm):\n    return llm(task)\n'
GENOMES = {
    "program": "def f(x):\n    return x + 1\n",
    "agent": AGENT,
    "prompt": "Solve the problem step by step.\n",
    "team": '{"roles": ["solver", "checker"]}\n',
    "text": "A short poem about the sea.\n",
}
CHILDREN = {
    "program": "def f(x):\n    return x * 2\n",
    "agent": AGENT.replace("llm(task)", "llm(task + ' Think step by step.')"),
    "prompt": "Think carefully, then give only the answer.\n",
    "team": '{"roles": ["planner", "solver"]}\n',
    "text": "A long poem about the sea at night.\n",
}
# per kind: an answer that parses to nothing usable, and the reason stored for it
MALFORMED = {
    "program": ("```python\ndef f(x) return 1\n```", "syntax error"),
    "agent": ("```python\ndef solve(task):\n    return 1\n```", "no top-level function forward(task, llm)"),
    "prompt": ("", "empty answer"),
    "team": ("```json\n[1, 2]\n```", "team must be a JSON object"),
    "text": ("   \n", "empty answer"),
}


def fence(kind: str, text: str) -> str:
    return f"Here it is:\n```{genomes.get(kind).language}\n{text}```\nDone."


def parent(kind: str, fitness: float = 0.5) -> Parent:
    return Parent(id=1, text=GENOMES[kind], fitness=fitness, metrics={"accuracy": fitness})


def run(op, parents, inspirations=()):
    context = PromptContext(task="Do well.", sample_index=3)
    return asyncio.run(op(list(parents), list(inspirations), context))


@pytest.mark.parametrize("kind", sorted(GENOMES))
@pytest.mark.parametrize("name", ["rewrite", "crossover", "inspiration", "meta_agent"])
def test_every_kind_round_trips_through_every_operator(kind, name):
    g = genomes.get(kind)
    client = FakeClient(fence(kind, CHILDREN[kind]))
    op = make_llm_operator(name, client, genome=g)
    parents = [parent(kind)] * op.num_parents
    [child] = run(op, parents, [parent(kind, 0.9)] * op.num_inspirations)
    assert child.text == CHILDREN[kind] and child.error is None
    system, user = (m["content"] for m in client.calls[0]["messages"])
    assert f"```{g.language}" in user and g.noun in user
    if kind != "program":
        assert system == open(g.templates["system"]).read().strip()  # the kind's own system prompt


@pytest.mark.parametrize("kind", sorted(GENOMES))
def test_unusable_and_truncated_answers_become_children_with_reasons(kind):
    g = genomes.get(kind)
    answer, reason = MALFORMED[kind]
    [child] = run(make_llm_operator("rewrite", FakeClient(answer), genome=g), [parent(kind)])
    assert child.text is None and reason in child.error and child.response == answer
    cut = f"```{g.language}\n{GENOMES[kind][:5]}"  # an answer cut off inside its block
    [child] = run(
        make_llm_operator("rewrite", FakeClient(cut, finish_reason="length"), genome=g), [parent(kind)]
    )
    assert child.text is None and child.error == "rewrite: unterminated code block (answer truncated?)"
    [child] = run(
        make_llm_operator("rewrite", FakeClient(fence(kind, GENOMES[kind])), genome=g), [parent(kind)]
    )
    assert child.error == "rewrite: answer repeats the parent unchanged"


def test_a_data_kind_takes_an_unfenced_answer_whole_and_a_code_kind_does_not():
    [child] = run(
        make_llm_operator(
            "rewrite", FakeClient("New prompt: Answer in one word."), genome=genomes.get("prompt")
        ),
        [parent("prompt")],
    )
    assert child.text == "Answer in one word.\n"
    [child] = run(
        make_llm_operator(
            "rewrite", FakeClient("def forward(task, llm): return 1"), genome=genomes.get("agent")
        ),
        [parent("agent")],
    )
    assert child.text is None and child.error == "rewrite: no code block"


def test_diff_needs_a_code_kind():
    with pytest.raises(ConfigError, match=r"^name: diff edits code; prompt genomes are text data"):
        make_llm_operator("diff", FakeClient(), genome=genomes.get("prompt"))


def test_debug_rounds_show_the_reason_and_ask_again_within_the_budget():
    reserved = []
    bad, good = MALFORMED["agent"][0], fence("agent", CHILDREN["agent"])
    client = FakeClient(bad, good)
    op = make_llm_operator("meta_agent", client, genome=genomes.get("agent"), debug_rounds=2)
    context = PromptContext(task="Do well.", reserve_call=lambda: reserved.append(1) or True)
    [child] = asyncio.run(op([parent("agent")], [], context))
    assert child.text == CHILDREN["agent"] and len(client.calls) == 2 and reserved == [1]
    retry = client.calls[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": bad}
    assert "no top-level function forward(task, llm)" in retry[-1]["content"]
    assert json.loads(child.prompt) == retry and child.tokens_in == 101 + 102
    # no call left in the run's budget: no second round
    client = FakeClient(bad, good)
    op = make_llm_operator("meta_agent", client, genome=genomes.get("agent"), debug_rounds=2)
    [child] = asyncio.run(op([parent("agent")], [], PromptContext(task="x", reserve_call=lambda: False)))
    assert child.text is None and len(client.calls) == 1


def test_meta_agent_shows_the_archive_as_one_line_summaries():
    client = FakeClient(fence("agent", CHILDREN["agent"]))
    op = make_llm_operator("meta_agent", client, genome=genomes.get("agent"), num_inspirations=2)
    shown = [
        Parent(
            2,
            '"""Vote over three samples."""\ndef forward(task, llm):\n    return 1\n',
            0.75,
            {"calls_per_problem": 3.0},
        ),
        Parent(3, "def forward(task, llm):\n    return 2\n", 0.25),
    ]
    run(op, [parent("agent")], shown)
    user = client.calls[0]["messages"][1]["content"]
    assert "1. Vote over three samples. (score 0.75; calls_per_problem=3)" in user
    assert "2. def forward(task, llm): (score 0.25)" in user
    assert "return 1" not in user  # summaries, not whole designs


def test_a_kind_registered_from_outside_is_found_by_name():
    haiku = GenomeKind(
        "haiku_test",
        "haiku",
        "text",
        bare=True,
        validate=lambda t: None if len(t.strip().splitlines()) == 3 else "a haiku has 3 lines",
    )
    assert genomes.register(haiku) is genomes.get("haiku_test")
    with pytest.raises(ValueError, match="already registered"):
        genomes.register(GenomeKind("haiku_test", "poem", "text"))
    with pytest.raises(ConfigError, match=r"^experiment.genome: unknown genome kind 'sonnet'"):
        genomes.get("sonnet")
    [child] = run(
        make_llm_operator("rewrite", FakeClient("one\ntwo"), genome=haiku), [Parent(1, "a\nb\nc\n", 0.1)]
    )
    assert child.error == "rewrite: a haiku has 3 lines"


def test_the_kind_is_stored_with_each_candidate_and_old_stores_still_load(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # a store written before genome kinds: no genome column, programs as "text"
    db.execute(
        "CREATE TABLE candidates (id INTEGER PRIMARY KEY, created REAL NOT NULL, kind TEXT NOT NULL, "
        "text TEXT, vector BLOB, parent_ids TEXT NOT NULL, island INTEGER NOT NULL, operator TEXT, "
        "model TEXT, prompt TEXT, response TEXT, tokens_in INTEGER NOT NULL DEFAULT 0, tokens_out INTEGER "
        "NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0, fitness REAL, descriptor BLOB, valid INTEGER "
        "NOT NULL, metrics TEXT, error TEXT, eval_seconds REAL, artifacts TEXT)"
    )
    db.execute(
        "INSERT INTO candidates (id, created, kind, text, parent_ids, island, valid) "
        "VALUES (0, 0, 'text', 'def f(x): pass', '[]', 0, 1)"
    )
    db.commit()
    db.close()
    with Store(path, readonly=True) as store:
        [old] = store.get([0])
        assert old.genome == "program" and store.traces.of(0) == []
    with Store(path) as store:
        call = {"n": 0, "messages": [{"role": "user", "content": "q"}], "text": "a", "tokens_in": 3}
        store.add(
            [
                Candidate(
                    kind="text",
                    genome="agent",
                    island=0,
                    fitness=1.0,
                    descriptor=None,
                    valid=True,
                    text=AGENT,
                    trace=[call],
                )
            ]
        )
        old, new = store.get([0, 1])
        assert (old.genome, new.genome) == ("program", "agent") and store.traces.of(1) == [call]


HAIKU = GenomeKind(
    "haiku_external",
    "haiku",
    "text",
    bare=True,
    validate=lambda t: None if len(t.strip().splitlines()) == 3 else "a haiku has 3 lines",
)


class HaikuTask:
    """A task of a kind the engine has never heard of: it brings the kind itself."""

    kind, genome, descriptor_dim = "text", HAIKU, 1
    description = "Write a haiku about the sea."

    def __init__(self, entry: str):
        from qd.task import Stage

        self.host_entry, self.stages = entry, [Stage()]

    def initial(self, rng, n):
        return ["an old silent pond\na frog jumps into the pond\nsplash silence again\n"] * n

    def score(self, text, outputs):
        from qd.task import Scored

        words = outputs[-1]
        return Scored(-abs(words - 12), [min(words / 24, 1.0)], True, {"words": words})


def haiku_answer(request: dict) -> str:
    seed = int(request.get("seed") or 0)
    if seed % 4 == 0:
        return "```text\njust one line\n```"
    return f"```text\nwaves {seed} fold\nsalt wind over the harbor\ngulls turn home\n```"


def test_a_kind_registered_outside_qd_runs_through_the_engine(tmp_path, scripted_llm):
    from qd import Budget, Settings, archive, build
    from qd.evaluator import HostRunner, StagedEvaluator
    from qd.llm import LLMClient, LLMSettings, ModelSpec

    entry = tmp_path / "haiku_entry.py"
    entry.write_text("def run(text):\n    return len(text.split())\n")
    server = scripted_llm([Rule("", haiku_answer)])
    task = HaikuTask(f"{entry}:run")
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), seed=0))
    engine = build(
        task=task,
        spec=archive.GridSpec((4,), (0.0,), (1.0,)),
        operators=[(make_llm_operator("rewrite", client, genome=genomes.of_task(task)), 1.0)],
        evaluator=StagedEvaluator(task, HostRunner(task.host_entry)),
        run_dir=tmp_path / "run",
        budget=Budget(max_llm_calls=8),
        settings=Settings(batch_size=1, in_flight=2, progress=False),
        llm=client,
    )
    run_engine(engine)
    rows = stored(tmp_path / "run")
    assert {c.genome for c in rows} == {"haiku_external"} and genomes.get("haiku_external") is HAIKU
    children = [c for c in rows if c.operator == "rewrite"]
    assert len(children) == 8 and any(c.valid for c in children)
    assert all(c.error == "rewrite: a haiku has 3 lines" for c in children if not c.valid)
    assert all(c.metrics["words"] == len(c.text.split()) for c in children if c.valid)
    assert "Current haiku" in server.requests[0]["messages"][1]["content"]
