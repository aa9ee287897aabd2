"""Hypervolume (qd.archive.hypervolume) against a brute-force inclusion-exclusion reference.

Values come from a small set of halves, so ties, repeated points and points that do not
dominate the reference are common.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd.archive import pareto
from qd.archive.grid import GridSpec
from qd.archive.hypervolume import contributions, derived_reference, front_hypervolumes, hypervolume
from qd.contract import ConfigError

VALUES = st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0])


def brute_hypervolume(points: list[tuple], reference: tuple) -> float:
    """Inclusion-exclusion over every non-empty subset: the union of the boxes
    [reference, point] is the signed sum of the boxes' intersections."""
    total = 0.0
    for size in range(1, len(points) + 1):
        for subset in itertools.combinations(points, size):
            sides = [max(min(p[j] for p in subset) - reference[j], 0.0) for j in range(len(reference))]
            total += (-1) ** (size + 1) * float(np.prod(sides))
    return total


@st.composite
def fronts(draw, max_points: int = 7):
    m = draw(st.integers(1, 3))
    points = draw(st.lists(st.tuples(*[VALUES] * m), max_size=max_points))
    reference = draw(st.tuples(*[st.sampled_from([-1.0, -0.5, 0.0, 0.5])] * m))
    return points, reference


def _array(points: list[tuple], m: int) -> np.ndarray:
    return np.asarray(points, np.float64).reshape(len(points), m)


@settings(max_examples=300, deadline=None)
@given(fronts())
def test_hypervolume_equals_the_inclusion_exclusion_volume(case):
    points, reference = case
    got = hypervolume(_array(points, len(reference)), np.asarray(reference))
    assert got == pytest.approx(brute_hypervolume(points, reference), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(fronts(max_points=6))
def test_each_contribution_is_the_volume_lost_without_the_point(case):
    points, reference = case
    got = contributions(_array(points, len(reference)), np.asarray(reference))
    whole = brute_hypervolume(points, reference)
    lost = [whole - brute_hypervolume(points[:i] + points[i + 1 :], reference) for i in range(len(points))]
    np.testing.assert_allclose(got, lost, atol=1e-9)


def test_a_point_repeated_or_dominated_contributes_nothing_and_absent_values_count_as_absent():
    points = np.array([[2.0, 1.0], [2.0, 1.0], [1.0, 0.5], [0.5, 3.0], [np.nan, 9.0], [-np.inf, 5.0]])
    np.testing.assert_allclose(contributions(points, np.zeros(2)), [0, 0, 0, 1.0, 0, 0])
    assert hypervolume(points, np.zeros(2)) == pytest.approx(2.0 + 0.5 * 2.0)
    assert hypervolume(np.zeros((0, 2)), np.zeros(2)) == 0.0


def test_more_than_three_objectives_are_refused_with_a_config_error():
    with pytest.raises(ConfigError, match="exact for 1 to 3 objectives, got 4"):
        hypervolume(np.ones((2, 4)), np.zeros(4))
    with pytest.raises(ValueError, match="disagree"):
        hypervolume(np.ones((2, 2)), np.zeros(3))


def test_front_hypervolumes_reads_each_island_and_cell_and_ignores_empty_slots():
    spec = pareto.ParetoSpec(GridSpec((3,), (0.0,), (3.0,)), front_size=2, num_objectives=2)
    state = pareto.init(spec, islands=2)
    objectives = np.asarray(state.objectives).copy()
    ids = np.asarray(state.genome_id).copy()
    objectives[0, 1, :2], ids[0, 1, :2] = [[3.0, 1.0], [1.0, 2.0]], [4, 7]
    objectives[1, 2, 0], ids[1, 2, 0] = [2.0, 2.0], 9
    objectives[1, 0, 1] = [5.0, 5.0]  # an empty slot's stale values are no member
    state = state._replace(objectives=objectives, genome_id=ids)
    got = front_hypervolumes(state, np.zeros(2))
    np.testing.assert_allclose(got, [[0, 3 + 1, 0], [0, 0, 4]])


def test_a_derived_reference_sits_a_tenth_of_the_range_below_the_worst_value():
    seen = np.array([[0.0, -10.0], [4.0, -10.0], [np.nan, -100.0], [2.0, np.inf]])
    np.testing.assert_allclose(derived_reference(seen), [-0.4, -11.0])
    with pytest.raises(ValueError, match="no finite"):
        derived_reference(np.full((2, 2), np.nan))
