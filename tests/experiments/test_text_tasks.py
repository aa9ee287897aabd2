"""function_fit and circle_packing: seeds run in the real sandbox, scoring is strict and host-side."""

import math

import numpy as np
import pytest
from helpers import evaluate_in_sandbox
from hypothesis import given, settings
from hypothesis import strategies as st

from qd.task import load_task

evaluate = evaluate_in_sandbox


def packing_seed():
    task = load_task("circle_packing", {})
    namespace = {}
    exec(task.initial(np.random.default_rng(0), 1)[0], namespace)
    return task, [list(c) for c in namespace["pack"]()]


def test_function_fit_seeds_run_in_the_sandbox_and_score_on_held_out_points(tmp_path):
    task = load_task("function_fit", {})
    seeds = task.initial(np.random.default_rng(0), 8)
    perfect = "def f(x):\n    return x * x + 0.5 * x + 2.0\n\nprint(input())  # ignored: not a def\n"
    ev = evaluate(task, [*seeds, perfect, "def g(x):\n    return 1\n"])
    assert ev.valid[:-1].all() and -100 <= ev.fitness[:-2].min() and ev.fitness[:-2].max() < -1
    assert ev.fitness[-2] == pytest.approx(0.0, abs=1e-9)
    assert [m["stages"] for m in ev.metrics[:-1]] == [2] * 9  # the cascade reached the held-out stage
    assert "defines no function f(x)" in ev.error[-1]
    assert "(want 9.5)" in ev.artifacts[0]["values"]  # the values the model can act on
    assert ev.descriptor.shape == (10, 2)


def test_function_fit_never_shows_the_target_or_held_out_points():
    task = load_task("function_fit", {"target": "wave"})
    assert "sin" not in task.description and "x * x" not in task.description
    shown = [float(x) for x in task.train_x]
    assert not set(shown) & set(task.held_out_x)
    assert f"f({shown[0]:g}) =" in task.description


FIT = load_task("function_fit", {})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=64, max_size=64), st.booleans())
def test_function_fit_score_is_minus_the_rmse_numpy_computes(values, as_ints):
    """The score in plain floats (no numpy per candidate) is numpy's RMSE, clipped at 100."""
    values = [int(v) for v in values] if as_ints else values
    scored = FIT.score("def f(x):\n    return x\n", [[0.0] * 7, values])
    want = float(np.sqrt(np.mean((np.asarray(values, np.float64) - FIT._held_out_y) ** 2)))
    assert scored.metrics["rmse_held_out"] == pytest.approx(round(want, 6), rel=1e-12, abs=1e-12)
    assert scored.fitness == pytest.approx(-min(want, 100.0), rel=1e-12)


def test_function_fit_score_of_values_too_large_to_square_is_the_worst():
    scored = FIT.score("def f(x):\n    return x\n", [[1e300] * 7])
    assert scored.fitness == -100.0 and scored.valid


def test_circle_packing_seed_is_valid_and_scores_its_sum_of_radii(tmp_path):
    task = load_task("circle_packing", {})
    ev = evaluate(task, task.initial(np.random.default_rng(0), 1))
    assert ev.valid[0] and ev.fitness[0] == pytest.approx(26 / 12)
    assert ev.metrics[0]["min_r"] == pytest.approx(1 / 12)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda c: c.__setitem__(0, [0.05, 0.05, 0.2]), "not inside the unit square"),
        (lambda c: c.__setitem__(1, [c[0][0] + 0.01, c[0][1], c[0][2]]), "overlap"),
        (lambda c: c.__setitem__(2, [0.5, 0.5, None]), "not three finite numbers"),
        (lambda c: c.__setitem__(3, [0.5, 0.5, True]), "not three finite numbers"),
        (lambda c: c.__setitem__(4, [0.5, 0.5, -0.01]), "radius <= 0"),
        (lambda c: c.pop(), "expected 26 circles, got 25"),
        (lambda c: c.append([0.5, 0.5, 0.001]), "expected 26 circles, got 27"),
    ],
)
def test_circle_packing_rejects_invalid_packings_with_the_reason(mutate, reason):
    task, circles = packing_seed()
    mutate(circles)
    scored = task.score("", [circles])
    assert not scored.valid and math.isnan(scored.fitness) and reason in scored.error


ODD = st.sampled_from([math.nan, math.inf, -math.inf])
MOVE = st.one_of(st.floats(-0.003, 0.003), ODD)
GROW = st.one_of(st.floats(-0.008, 0.0005), ODD)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(MOVE, MOVE, GROW), min_size=26, max_size=26))
def test_circle_packing_never_scores_an_invalid_packing_as_a_number(nudges):
    """The seed packing (circles touching) nudged: moved, shrunk or grown a little, or made
    non-finite; some stay valid (about 1 in 7 without non-finite values), most do not."""
    task, seed = packing_seed()
    circles = [[v + d for v, d in zip(c, n)] for c, n in zip(seed, nudges)]
    scored = task.score("", [circles])
    if (
        scored.valid
    ):  # then it truly is a packing (checked independently, in float64 and without tolerance games)
        a = np.asarray(circles, np.float64)
        x, y, r = a.T
        assert np.isfinite(a).all() and (r > 0).all()
        assert (
            (x - r >= -1e-9).all()
            and (x + r <= 1 + 1e-9).all()
            and (y - r >= -1e-9).all()
            and (y + r <= 1 + 1e-9).all()
        )
        for i in range(26):
            for j in range(i + 1, 26):
                assert math.hypot(x[i] - x[j], y[i] - y[j]) >= r[i] + r[j] - 1e-9
        assert scored.fitness == pytest.approx(r.sum())
    else:
        assert math.isnan(scored.fitness)


def test_circle_packing_program_that_lies_about_itself_is_rejected(tmp_path):
    task = load_task("circle_packing", {})
    liar = "def pack():\n    return [(0.5, 0.5, 0.5)] * 26\n"
    ev = evaluate(task, [liar])
    assert not ev.valid[0] and "overlap" in ev.error[0]
