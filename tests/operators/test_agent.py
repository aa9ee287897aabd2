"""The agent operator's tool loop: canned answers in, a child (or the reason it stopped) out."""

import asyncio
import json
import math

import pytest
from helpers import FakeClient

from operators import AgentOperator, check_text_operator, make_text_operator
from operators.agent import step_index
from qd.contract import Attempt, ConfigError, Parent, PromptContext, Trial, sample_index

SEED = "def f(x):\n    return x\n"
BETTER = "def f(x):\n    return x * x\n"
PARENT = Parent(7, SEED, 0.5, {"mse": 2.0}, "stderr: slow")
ELITE = Parent(9, "def f(x):\n    return 2 * x\n", 0.7)


def fenced(tool: str, code: str) -> str:
    return f"TOOL: {tool}\n```python\n{code}```"


class Bench:
    """A workbench that scores every draft 0.9 (None: no evaluation left)."""

    def __init__(self, left: int = 10):
        self.drafts, self.left = [], left

    async def trial(self, text):
        if self.left == 0:
            return None
        self.left -= 1
        self.drafts.append(text)
        return Trial(True, 0.9, {"mse": 0.1}, None)


class Memory:
    def children(self, parent_id, limit):
        return [
            Attempt(3, "rewrite", "failed", math.nan, 0.5, "train: NameError: y"),
            Attempt(4, "rewrite", "kept", 0.8, 0.5),
        ]

    def lessons(self):
        return None


def run(op, *, reserve=lambda: True, **context):
    context = PromptContext(
        task="Fit f.", sample_index=context.pop("sample_index", 11), reserve_call=reserve, **context
    )
    return asyncio.run(op([PARENT], [ELITE], context))


def agent(*answers, **settings):
    client = FakeClient(*answers)
    return make_text_operator("agent", client, **settings), client


def observations(child) -> list[str]:
    return [m["content"] for m in json.loads(child.prompt)[2:] if m["role"] == "user"]


def test_the_tools_run_and_submit_ends_the_loop_with_the_whole_conversation():
    op, client = agent(
        "TOOL: read_parent",
        "TOOL: failed_siblings",
        "**TOOL:** read_elite 1",
        fenced("trial", BETTER),
        fenced("submit", BETTER),
        max_steps=5,
    )
    bench = Bench()
    (child,) = run(op, workbench=bench, memory=Memory())
    assert isinstance(op, AgentOperator) and child.text == BETTER and child.error is None
    assert child.operator == "agent" and bench.drafts == [BETTER]
    seen = observations(child)
    assert "return x" in seen[0] and "mse=2" in seen[0] and "stderr: slow" in seen[0]
    assert "NameError: y" in seen[1] and "kept" not in seen[1]
    assert "return 2 * x" in seen[2]
    assert seen[3].startswith("Trial on the first test: score 0.9; mse=0.1")
    messages = json.loads(child.prompt)
    assert sum(m["role"] == "assistant" for m in messages) == 5 == len(client.calls)
    assert child.tokens_in == sum(100 + i for i in range(1, 6)) and child.cost == pytest.approx(1.25)
    # each step its own cached call; the first keeps the child's index, as every operator's
    indexes = [c["sample_index"] for c in client.calls]
    assert indexes[0] == 11 and len(set(indexes)) == 5
    assert indexes[1] == sample_index(11, attempt=1, stream=5)


def test_a_gate_resamples_steps_never_share_an_index_with_the_first_answers():
    first = {step_index(11, s) for s in range(64)}
    resampled = {step_index(sample_index(11, attempt=1), s) for s in range(64)}
    assert not first & resampled


def test_the_loop_is_capped_in_steps_and_says_so():
    op, client = agent(*["TOOL: read_parent"] * 5, max_steps=3)
    (child,) = run(op)
    assert child.text is None and len(client.calls) == 3
    assert (
        child.error
        == "agent: no submit in max_steps=3 (after 3 steps, 0 trials, " + child.error.split(", ")[-1]
    )


def test_trials_are_capped_and_a_budget_without_evaluations_is_said():
    op, _ = agent(
        fenced("trial", BETTER), fenced("trial", BETTER + "\n"), fenced("submit", BETTER), max_trials=1
    )
    bench = Bench()
    (child,) = run(op, workbench=bench)
    assert len(bench.drafts) == 1 and "No trials left (max_trials=1)" in observations(child)[1]
    op, _ = agent(fenced("trial", BETTER), fenced("submit", BETTER))
    (child,) = run(op, workbench=Bench(left=0))
    assert "No evaluation is left" in observations(child)[0] and child.text == BETTER


def test_tool_results_are_clipped_to_the_conversation_cap_and_the_loop_ends_at_it():
    big = Parent(7, "def f(x):\n" + "    x = x + 1\n" * 400 + "    return x\n", 0.5)
    op, _ = agent(*["TOOL: read_parent"] * 4, max_conversation_tokens=600)
    context = PromptContext(task="Fit f.", reserve_call=lambda: True)
    (child,) = asyncio.run(op([big], [], context))
    messages = json.loads(child.prompt)
    assert "characters cut" in messages[3]["content"]
    assert sum(len(m["content"]) for m in messages[:-1]) // 3 <= 600  # every prompt within the cap
    assert "reached max_conversation_tokens=600" in child.error and "after 2 steps" in child.error


def test_a_model_that_ignores_the_tools_is_reminded_once_then_stopped_with_a_reason():
    op, client = agent("Sure! Here is my idea.", "I think x squared is best.")
    (child,) = run(op)
    assert child.text is None and len(client.calls) == 2
    assert child.error.startswith("agent: the answer named no tool again after a reminder")
    assert "TOOL: read_parent" in observations(child)[0]


def test_each_step_after_the_first_reserves_its_call():
    asked = []
    op, client = agent("TOOL: read_parent", "TOOL: read_parent")
    (child,) = run(op, reserve=lambda: asked.append(1) or len(asked) < 2)
    assert len(client.calls) == 2 and len(asked) == 2
    assert child.error.startswith("agent: no model call left in the run's budget (after 2 steps")


def test_without_memory_or_workbench_the_tools_say_so():
    op, _ = agent(
        "TOOL: failed_siblings", fenced("trial", BETTER), "TOOL: read_elite 4", fenced("submit", SEED)
    )
    (child,) = run(op)
    seen = observations(child)
    assert seen[0] == "No failed earlier changes to this parent are known."
    assert seen[1].startswith("Trials are not available") and seen[2] == "No elite 4: there are 1."
    assert "repeats the parent unchanged" in seen[3] and child.text is None


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(max_steps=0), "max_steps"),
        (dict(max_steps=65), "max_steps"),
        (dict(max_trials=-1), "max_trials"),
        (dict(max_conversation_tokens=100), "max_conversation_tokens"),
    ],
)
def test_bad_agent_settings_are_refused(settings, field):
    with pytest.raises(ConfigError) as err:
        check_text_operator("agent", **settings)
    assert err.value.field == field


def test_agent_settings_on_another_operator_are_refused():
    with pytest.raises(ConfigError, match="only the agent operator") as err:
        check_text_operator("rewrite", max_steps=3)
    assert err.value.field == "max_steps"
    assert check_text_operator("agent")["max_steps"] == 4
