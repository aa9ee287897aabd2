"""``qd-run experiment=prompt_evolution experiment.dataset=FILE experiment.metric=numeric`` end to end on
the scripted server: children that lose on their minibatch make no validation call (their stored
traces), wrong training rows reach the operators' prompts, validation and test rows never do."""

import json
import re

import pytest
from helpers import qd_run, stored
from scripted_llm import Rule

from qd.data import dataset_task
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.store import Store

ROWS = [{"id": f"r{i}", "input": f"Q{i}: what is {i} times 3?", "answer": str(3 * i)} for i in range(20)]
QUESTION = re.compile(r"^Q(\d+): what is \d+ times 3\?$")


def reply(request: dict) -> str:
    """The solver (a row's question): right on every row for a prompt that says so, on even rows for the
    seed prompts, wrong for the rest; an operator: a new prompt, right or wrong by its seed."""
    question = QUESTION.match(request["messages"][-1]["content"])
    if question is None:
        seed = int(request.get("seed") or 0)
        return f"Always answer right, variant {seed}." if seed % 2 else f"Guess wildly, variant {seed}."
    i, prompt = int(question.group(1)), request["messages"][0]["content"]
    right = prompt.startswith("Always answer right") or (not prompt.startswith("Guess") and i % 2 == 0)
    return f"Answer: {3 * i if right else -1}"


@pytest.mark.slow  # a qd-run process: about 10 s
def test_prompt_evolution_on_a_dataset_from_the_command_line(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", reply)])
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = tmp_path / "run"
    qd_run(
        "experiment=prompt_evolution",
        "experiment.dataset=rows.jsonl",  # relative to where qd-run is run
        "experiment.metric=numeric",
        "experiment.params.minibatch=4",
        "llm.provider=server",
        f"llm.base_url={server.base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "descriptor=task",
        "meta=none",
        "archive.bins=[4,4]",
        "archive.upper=[40.0,60.0]",
        "runner.progress=false",
        "runner.max_llm_calls=100",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    splits = dataset_task(["x"], ROWS, "numeric", minibatch=4).splits
    rows = [c for c in stored(run) if c.kind == "text"]
    founders, children = [c for c in rows if c.operator == "init"], [c for c in rows if c.operator != "init"]
    assert len(founders) == 6 and all(
        set(c.metrics["row_scores"]) == {"train", "validation"} for c in founders
    )
    assert {row.id for row in splits.validation} == set(founders[0].metrics["row_scores"]["validation"])
    lost = [c for c in children if c.valid and c.text.startswith("Guess")]
    won = [c for c in children if c.valid and c.text.startswith("Always")]
    assert lost and won
    with Store(run / "store.sqlite", readonly=True) as store:
        for c in lost:  # no validation call: read from the calls stored with it
            stages = {t["stage"] for t in store.traces.of(c.id)}
            assert "validation" not in c.metrics and stages == {"minibatch"}
        for c in won:
            assert c.metrics["validation"] == 1.0 == c.fitness
    operator_prompts = "\n".join(c.prompt or "" for c in children)
    assert "expected: " in operator_prompts  # a parent's wrong training rows, shown to the operator
    asked = "\n".join(m["content"] for r in server.requests for m in r["messages"])
    assert not [row.input for row in splits.test if row.input in asked]
    assert not [row.input for row in splits.validation if row.input in operator_prompts]
    # after the run: the best prompt (right on every row) on the test split, under the role heldout
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),), timeout_s=10))
    before = len(server.requests)
    assert dataset_task(["x"], data, "numeric").heldout(run, client) == (1.0, (1.0, 1.0))
    assert sorted(r["messages"][-1]["content"] for r in server.requests[before:]) == sorted(
        row.input for row in splits.test
    )


@pytest.mark.slow  # six agents in the sandbox: about 15 s
def test_agent_design_on_a_dataset(tmp_path, scripted_llm):
    """The hand-designed agents run in the sandbox on a dataset's rows; test rows reach no model call."""
    from helpers import run_config

    from qd.plan import compose

    server = scripted_llm([Rule("", "Answer: 9")])
    data = tmp_path / "rows.csv"
    data.write_text(
        "id,question,answer\n" + "".join(f"r{i},Q{i}: what is {i} times 3?,{3 * i}\n" for i in range(20))
    )
    cfg = compose(
        [
            "experiment=agent_design",
            f"experiment.dataset={data}",
            "experiment.metric=numeric",
            "experiment.params.input=question",
            "experiment.params.minibatch=2",
            "llm.provider=server",
            f"llm.base_url={server.base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "runner.progress=false",
            "runner.max_llm_calls=200",
            "sandbox.wall_s=20",
        ]
    )
    run_config(cfg, tmp_path / "run")
    splits = dataset_task(["x"], data, "numeric", input="question", minibatch=2).splits
    founders = [c for c in stored(tmp_path / "run") if c.operator == "init"]
    assert len(founders) == 6 and {c.genome for c in founders} == {"agent"}
    for c in founders:  # the model always says 9: only row r3 (3 times 3) can be right
        scores = {**c.metrics["row_scores"]["train"], **c.metrics["row_scores"]["validation"]}
        assert c.valid and set(c.metrics["row_scores"]["validation"]) == {r.id for r in splits.validation}
        assert not [row for row, score in scores.items() if score and row != "r3"]
    asked = "\n".join(m["content"] for r in server.requests for m in r["messages"])
    assert not [row.input for row in splits.test if row.input in asked]


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["experiment.metric=fuzzy"], "experiment.metric: unknown metric 'fuzzy' (use one of ["),
        (["experiment.params.input=question"], "experiment.params.input: row 0 of the dataset has no column"),
        (["experiment.dataset=no/such.jsonl"], "experiment.dataset: no file or folder"),
        (["experiment.params.minibatch=0"], "experiment.params.minibatch: 0 is not a row count"),
    ],
)
def test_a_bad_dataset_argument_is_one_line_naming_it(overrides, says):
    from qd.contract import ConfigError
    from qd.plan import compose, plan

    with pytest.raises(ConfigError) as e:
        plan(compose(["experiment=prompt_evolution", "experiment.dataset=arith60", *overrides]))
    assert str(e.value).startswith(says) and "\n" not in str(e.value) and e.value.fix
