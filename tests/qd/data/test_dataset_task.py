"""dataset_task's evaluation on the scripted server: the minibatch -> validation cascade, per-row
scores, feedback from wrong training rows only, and the test split scored only by ``heldout``."""

import asyncio

import pytest
from helpers import evaluate_on_host
from scripted_llm import Rule

from qd.contract import ConfigError, Parent
from qd.data import dataset_task
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.task import evaluating_children

ROWS = [{"id": f"r{i}", "input": f"Q{i}: what is {i} times 3?", "answer": str(3 * i)} for i in range(20)]
GOOD, HALF = "Always answer right.", "Answer the even ones."


def solver(request: dict) -> str:
    """Right on every row for GOOD, on even answers for HALF, wrong otherwise."""
    prompt, question = request["messages"][0]["content"], request["messages"][-1]["content"]
    i = int(question.split(":")[0][1:])
    right = prompt == GOOD or (prompt == HALF and i % 2 == 0)
    return f"Working...\nAnswer: {3 * i if right else -1}"


@pytest.fixture
def task():
    return dataset_task([HALF], ROWS, "numeric", minibatch=4, seed=3)


def asked(server) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.requests]


def inputs(rows) -> set[str]:
    return {row.input for row in rows}


def test_a_founder_is_scored_on_the_minibatch_then_validation(task, scripted_llm):
    server = scripted_llm([Rule("", solver)])
    ev = evaluate_on_host(task, server.base_url, [HALF], task.eval_budget)
    s = task.splits
    assert len(s.train) == 10 and len(s.validation) == 5 and len(s.test) == 5 and len(task.batch) == 4
    assert asked(server) == [r.input for r in task.batch + s.validation]  # minibatch first, no test row
    metrics = ev.metrics[0]
    even = {r.id: float(int(r.answer) % 2 == 0) for r in s.train + s.validation}
    assert metrics["row_scores"] == {
        "train": {r.id: even[r.id] for r in task.batch},
        "validation": {r.id: even[r.id] for r in s.validation},
    }
    assert ev.fitness[0] == pytest.approx(metrics["validation"]) and metrics["minibatch"] == pytest.approx(
        sum(even[r.id] for r in task.batch) / 4
    )
    feedback = ev.artifacts[0]["wrong_rows"]
    wrong = [r for r in task.batch if not even[r.id]]
    assert wrong and all(
        f"input: {r.input}" in feedback and f"expected: {r.answer}" in feedback for r in wrong
    )
    assert "output: 'Working...\\nAnswer: -1'" in feedback
    assert not [text for text in inputs(s.validation) | inputs(s.test) if text in feedback]


def test_a_candidate_past_the_cascade_keeps_its_validation_scores_and_its_declared_objectives(scripted_llm):
    objectives = (("accuracy", "max"), ("tokens", "min"))
    task = dataset_task([HALF], ROWS, "numeric", minibatch=4, seed=3, objectives=objectives)
    server = scripted_llm([Rule("", solver)])
    ev = evaluate_on_host(task, server.base_url, [HALF], task.eval_budget)
    metrics, validation = ev.metrics[0], task.splits.validation
    assert metrics["validation_scores"] == [float(int(r.answer) % 2 == 0) for r in validation]  # split order
    assert metrics["accuracy"] == ev.fitness[0] == pytest.approx(sum(metrics["validation_scores"]) / 5)
    answered = len(task.batch) + len(validation)  # the model's output tokens per answer
    assert metrics["tokens"] == sum(call["tokens_out"] for call in ev.traces[0]) / answered > 0
    plain = evaluate_on_host(
        dataset_task([HALF], ROWS, "numeric", minibatch=4, seed=3), server.base_url, [HALF], task.eval_budget
    )
    assert "accuracy" not in plain.metrics[0] and "validation_scores" in plain.metrics[0]  # declared only
    with pytest.raises(ConfigError, match=r"^objectives: a dataset task computes no objective 'speed'"):
        dataset_task([HALF], ROWS, "numeric", objectives=[("speed", "max")])


def test_a_child_that_loses_on_its_minibatch_makes_no_validation_call(task, scripted_llm):
    server = scripted_llm([Rule("", solver)])
    parent = Parent(1, HALF, 0.6, {"minibatch": 0.5})
    with evaluating_children({"Be wrong.": [parent], GOOD: [parent]}):
        ev = evaluate_on_host(task, server.base_url, ["Be wrong.", GOOD], task.eval_budget)
    lost, won = ev.metrics
    assert "validation" not in lost and set(lost["row_scores"]) == {"train"} and lost["model_calls"] == 4
    assert ev.fitness[0] == 0.0 and ev.traces[0] and {t["stage"] for t in ev.traces[0]} == {"minibatch"}
    assert won["validation"] == 1.0 and won["model_calls"] == 9 and ev.fitness[1] == 1.0
    assert ev.artifacts[1] is None  # nothing wrong: no feedback
    assert sorted(asked(server)) == sorted(
        [r.input for r in task.batch] * 2 + [r.input for r in task.splits.validation]
    )


def test_a_lost_child_keeps_an_estimate_below_its_parent(task, scripted_llm):
    server = scripted_llm([Rule("", solver)])
    parent = Parent(1, GOOD, 0.1, {"minibatch": 1.0})  # its minibatch says 1.0, its validation 0.1
    with evaluating_children({HALF: [parent]}):
        ev = evaluate_on_host(task, server.base_url, [HALF], task.eval_budget)
    assert ev.metrics[0]["minibatch"] == 0.25 and ev.fitness[0] == pytest.approx(0.1)


def test_heldout_scores_the_test_split_under_its_own_role(task, scripted_llm, tmp_path):
    server = scripted_llm([Rule("", solver)])
    cache = tmp_path / "llm_cache"
    client = LLMClient(
        LLMSettings(
            base_url=server.base_url, models=(ModelSpec("scripted"),), timeout_s=10, cache_dir=str(cache)
        )
    )
    asyncio.run(client.aclose())  # as a run leaves its client
    score, (lo, hi) = task.heldout(HALF, client)
    even = [float(int(r.answer) % 2 == 0) for r in task.splits.test]
    assert score == pytest.approx(sum(even) / 5) and lo <= score <= hi
    assert asked(server) == [r.input for r in task.splits.test]
    assert client.ledger.split("role")["heldout"].calls == 5 and set(client.ledger.split("role")) == {
        "heldout"
    }


def test_heldout_scores_a_text_too_long_to_be_a_path(task, scripted_llm):
    """A genome with a line longer than a file name may be (a model's long answer) is a text, not
    a failed folder lookup (ENAMETOOLONG)."""
    server = scripted_llm([Rule("", solver)])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),), timeout_s=10))
    long_text = "Answer well. " + "x" * 400 + "\nThen stop."
    score, _ = task.heldout(long_text, client)
    assert score == 0.0 and asked(server) == [r.input for r in task.splits.test]


def test_heldout_works_inside_a_running_event_loop(task, scripted_llm):
    server = scripted_llm([Rule("", solver)])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),), timeout_s=10))

    async def notebook_cell():
        return task.heldout(GOOD, client)

    assert asyncio.run(notebook_cell()) == (1.0, (1.0, 1.0))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"genome": "program"}, "genome"),
        ({"minibatch": 0}, "minibatch"),
        ({"splits": (0.9, 0.2, 0.0)}, "splits"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_argument(kwargs, field):
    with pytest.raises(ConfigError) as e:
        dataset_task([HALF], ROWS, "numeric", **kwargs)
    assert e.value.field == field and e.value.fix and "\n" not in str(e.value)


def test_only_a_cascade_with_a_conditional_stage_is_told_the_childrens_parents(task):
    from qd.callable_tasks import host_task
    from qd.task import reads_parents

    assert reads_parents(task)  # its validation stage runs only for a child that beats its parents
    assert not reads_parents(host_task(["Be brief."], lambda candidate, llm: 1.0))


def test_an_experiments_make_task_builds_its_own_task_or_one_on_a_dataset():
    import dataclasses

    from qd.data.task import DatasetTask, experiment_make_task
    from qd.task import declared_params

    @dataclasses.dataclass
    class Generated:
        problem_seed: int = 0
        search_items: int = 4

    make_task = experiment_make_task(Generated, [GOOD], "prompt")
    assert declared_params(make_task)[-2:] == ["problem_seed", "search_items"]  # seen through the factory
    assert make_task(search_items=2) == Generated(search_items=2)
    on_rows = make_task(dataset="arith60", metric="numeric", minibatch=3, problem_seed=5, search_items=2)
    assert isinstance(on_rows, DatasetTask) and on_rows.seeds == [GOOD] and on_rows.genome == "prompt"
    assert (on_rows.seed, len(on_rows.batch), on_rows.metric.name) == (5, 3, "numeric")
