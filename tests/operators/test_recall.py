"""The run-memory block of LLM prompts (``operators.recall``): compact lines, the lessons note,
the token cap, and every operator showing it."""

import asyncio

import hypothesis.strategies as st
import pytest
from helpers import FakeClient
from hypothesis import given, settings

from operators import Parent, PromptContext, make_llm_operator
from operators.recall import CHARS_PER_TOKEN, attempt_line, memory_block
from qd.contract import Attempt
from qd.memory import Recalled

PARENT = Parent(id=7, text="def f(x):\n    return x\n", fitness=-2.0)
OTHER = Parent(id=9, text="def f(x):\n    return 2 * x\n", fitness=-1.0)
FAILED = Attempt(812, "rewrite", "failed", float("nan"), -2.0, "NameError: name 'np' is not defined")
WORSE = Attempt(790, "diff", "worse", -3.1, -2.0)
MEMORY = Recalled({7: (FAILED, WORSE)}, "Keep the quadratic term; avoid numpy.")


def test_lines_say_what_became_of_each_child():
    assert attempt_line(FAILED) == "- child #812 (rewrite): failed: NameError: name 'np' is not defined"
    assert attempt_line(WORSE) == "- child #790 (diff): scored -3.1 vs parent -2 (worse)"
    kept = Attempt(1, "rewrite", "kept", -1.5, None)
    assert attempt_line(kept) == "- child #1 (rewrite): scored -1.5 vs parent none (kept)"
    trial = Attempt(3, "agent>trial", "trial", -2.5, -2.0)
    assert attempt_line(trial) == "- child #3 (agent>trial): scored -2.5 vs parent -2 (trial)"
    broken = Attempt(4, "agent>trial", "trial", float("nan"), -2.0, "SyntaxError")
    assert attempt_line(broken) == "- child #4 (agent>trial): trial: SyntaxError"


def test_the_block_shows_children_newest_first_then_the_note():
    block = memory_block(MEMORY, [PARENT], 300, "program")
    assert block.splitlines() == [
        "Recent children of this program and what became of them:",
        attempt_line(FAILED),
        attempt_line(WORSE),
        "Lessons from this run: Keep the quadratic term; avoid numpy.",
    ]
    assert memory_block(None, [PARENT], 300, "program") == ""
    assert memory_block(Recalled({}), [PARENT], 300, "program") == ""


def test_a_tight_cap_drops_the_oldest_lines_first():
    block = memory_block(MEMORY, [PARENT], 40, "program")
    assert attempt_line(FAILED) in block and attempt_line(WORSE) not in block


attempts = st.builds(
    Attempt,
    id=st.integers(0, 10**6),
    operator=st.sampled_from(["rewrite", "diff", "crossover"]),
    fate=st.sampled_from(["failed", "rejected", "duplicate", "worse", "kept"]),
    fitness=st.floats(-1e9, 1e9),
    parent_fitness=st.none() | st.floats(-1e9, 1e9),
    reason=st.none() | st.text(max_size=400),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(attempts, max_size=8),
    st.lists(attempts, max_size=8),
    st.none() | st.text(max_size=2000),
    st.integers(0, 400),
)
def test_the_whole_block_stays_within_its_token_cap(first, second, note, max_tokens):
    memory = Recalled({7: tuple(first), 9: tuple(second)}, note)
    block = memory_block(memory, [PARENT, OTHER], max_tokens, "program")
    assert len(block) <= max_tokens * CHARS_PER_TOKEN + 1  # (+ its closing newline)


@pytest.mark.parametrize("name", ["rewrite", "diff", "crossover", "inspiration", "meta_agent"])
def test_every_llm_operator_shows_the_block_before_the_answer_format(name):
    client = FakeClient("no code")
    op = make_llm_operator(name, client, fallback_to_rewrite=False, memory_tokens=300)
    parents = [PARENT, OTHER][: op.num_parents]
    context = PromptContext(task="Fit f.", memory=MEMORY, instruction="Tune it.")
    asyncio.run(op(parents, [OTHER], context))
    prompt = client.calls[0]["messages"][-1]["content"]
    assert attempt_line(FAILED) in prompt and "Lessons from this run" in prompt
    assert prompt.index(attempt_line(WORSE)) < prompt.index("Instruction: Tune it.")
