"""A task's named objectives (qd.task.objectives_of) and their maximised matrix."""

from __future__ import annotations

import types

import numpy as np
import pytest

from qd.contract import ConfigError
from qd.task import objective_matrix, objectives_of


def test_a_task_without_objectives_declares_none() -> None:
    assert objectives_of(types.SimpleNamespace(kind="vector", descriptor_dim=2)) == ()


def test_min_objectives_are_negated_once_and_missing_values_read_as_nan() -> None:
    task = types.SimpleNamespace(objectives=[("error", "min"), ["accuracy", "max"]])
    objectives = objectives_of(task)
    assert objectives == (("error", "min"), ("accuracy", "max"))
    metrics = [
        {"error": 0.25, "accuracy": 0.5, "other": 3},
        {"error": 2},
        None,
        {"error": True, "accuracy": 1},
    ]
    matrix = objective_matrix(objectives, metrics)
    assert matrix.dtype == np.float32 and matrix.shape == (4, 2)
    np.testing.assert_array_equal(matrix[0], [-0.25, 0.5])
    np.testing.assert_array_equal(matrix[1], [-2.0, np.nan])
    assert np.isnan(matrix[2]).all()
    np.testing.assert_array_equal(matrix[3], [np.nan, 1.0])  # a bool is not a number here


@pytest.mark.parametrize(
    "declared, problem",
    [
        ([("error", "down")], "each entry"),
        ([("error",)], "each entry"),
        ([("a", "min"), ("a", "max")], "repeat"),
    ],
)
def test_bad_declarations_name_the_field(declared: list, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        objectives_of(types.SimpleNamespace(objectives=declared))
    assert raised.value.field == "objectives"
