"""What an instruction pool accepts (``operators.instruction_checks``), and how it picks
(``operators.meta.selection_probabilities``), checked without a pool, a store or a model."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from genomes.answers import MalformedAnswer
from operators.instruction_checks import checked_settings, instruction_key, parse_instruction
from operators.meta import (
    DEFAULT_MUTATION_PROMPT,
    DEFAULT_SEEDS,
    Instruction,
    InstructionPool,
    selection_probabilities,
)
from qd.contract import ConfigError


@pytest.mark.parametrize(
    "answer",
    [
        "Square each term.",
        "  New instruction:  Square each term.  \n",
        '"Square each term."',
        "Improved prompt: `Square each term.`",
        "**Square each term.**",
    ],
)
def test_a_label_and_enclosing_quotes_are_dropped(answer):
    assert parse_instruction(answer, 200, None, {}) == "Square each term."


@pytest.mark.parametrize(
    "answer, parent, others, reason",
    [
        ("", None, {}, "empty answer"),
        ("Instruction: ''", None, {}, "empty answer"),
        ("One.\n\nTwo.", None, {}, "answer has 2 lines (expected one)"),
        ("x" * 11, None, {}, "answer has 11 characters (at most 10)"),
        ("square  EACH term", "Square each term", {}, "answer repeats the parent unchanged"),
        ("Square each term", None, {3: "Add one.", 7: "square each TERM"}, "answer repeats instruction 7"),
    ],
)
def test_unusable_answers_say_why(answer, parent, others, reason):
    max_chars = 10 if reason.startswith("answer has 11") else 200
    with pytest.raises(MalformedAnswer) as err:
        parse_instruction(answer, max_chars, parent, others)
    assert err.value.reason == reason


def test_the_key_ignores_case_and_spacing_only():
    assert instruction_key(" Square\teach  TERM ") == instruction_key("square each term")
    assert instruction_key("Square each term.") != instruction_key("Square each term")


def test_checked_settings_returns_the_one_line_texts_and_the_templates():
    seeds, mutation, templates = checked_settings(
        seeds=["Instruction: A.", "B."],
        mutation_prompt='"Improve it."',
        size=2,
        evolve_every=1,
        min_uses=0,
        temperature=0.1,
        explore=0.0,
        hyper_every=1,
        max_chars=20,
        max_tokens=1,
        templates=None,
    )
    assert seeds == ["A.", "B."] and mutation == "Improve it."
    assert set(templates) == {"mutate", "hyper"}


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(seeds=()), r"seeds: need 1 to size=12 seeds, got 0"),
        (dict(seeds=("A.", "a. ")), r"seeds\[1\]: repeats another seed"),
        (dict(seeds=("A.",), mutation_prompt="a."), r"mutation_prompt: repeats another seed"),
        (dict(max_tokens=0), r"max_tokens: must be >= 1, got 0"),
        (dict(explore=-1.0), r"temperature, explore"),
        (dict(colour="red"), r"colour: unknown setting"),
    ],
)
def test_check_settings_fails_as_construction_does_without_building_a_pool(settings, message):
    with pytest.raises(ConfigError, match=message):
        InstructionPool.check_settings(**settings)
    with pytest.raises((ConfigError, TypeError)):
        InstructionPool(object(), **settings)  # the log is never touched while checking


def test_check_settings_accepts_the_defaults():
    InstructionPool.check_settings()
    InstructionPool.check_settings(seeds=list(DEFAULT_SEEDS), mutation_prompt=DEFAULT_MUTATION_PROMPT)


members = st.lists(
    st.tuples(st.integers(0, 50), st.floats(-1e3, 1e3, allow_nan=False)), min_size=1, max_size=8
).map(lambda rows: [Instruction(i, f"I{i}.", None, uses, credit) for i, (uses, credit) in enumerate(rows)])


@given(members, st.floats(0.0, 2.0), st.floats(0.05, 5.0), st.floats(0.01, 1e3))
def test_probabilities_are_a_distribution_independent_of_the_fitness_scale(pool, explore, temperature, k):
    p = selection_probabilities(pool, explore, temperature)
    assert p.shape == (len(pool),) and np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    scaled = [Instruction(m.id, m.text, None, m.uses, m.credit * k) for m in pool]
    np.testing.assert_allclose(selection_probabilities(scaled, explore, temperature), p, atol=1e-9)


def test_a_better_mean_is_likelier_and_exploration_favours_the_untried():
    tried = Instruction(0, "A.", None, uses=10, credit=10.0)
    worse = Instruction(1, "B.", None, uses=10, credit=5.0)
    new = Instruction(2, "C.", None)
    p = selection_probabilities([tried, worse], 0.0, 0.25)
    assert p[0] > p[1]
    assert (
        selection_probabilities([tried, new], 0.0, 0.25)[1]
        < selection_probabilities([tried, new], 1.0, 0.25)[1]
    )
