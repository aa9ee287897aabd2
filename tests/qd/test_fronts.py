"""Reading a Pareto run's fronts (qd.fronts): the reference in own units, the meter, the closing lines."""

from __future__ import annotations

import numpy as np
import pytest

from qd.archive import pareto
from qd.archive.grid import GridSpec
from qd.fronts import EVENT_FIELD, Hypervolumes, front, front_lines, own_units
from qd.task import objective_matrix

OBJECTIVES = (("error", "min"), ("size", "min"))


def fronts_state(members: dict[tuple[int, int], list[tuple[int, tuple[float, float]]]], islands: int = 2):
    """A ParetoState of 3 cells x 3 slots holding ``members`` ((island, cell) -> [(id, maximised)])."""
    spec = pareto.ParetoSpec(GridSpec((3,), (0.0,), (3.0,)), front_size=3, num_objectives=2)
    state = pareto.init(spec, islands=islands)
    objectives, ids = np.asarray(state.objectives).copy(), np.asarray(state.genome_id).copy()
    for (island, cell), rows in members.items():
        for slot, (genome_id, values) in enumerate(rows):
            objectives[island, cell, slot], ids[island, cell, slot] = values, genome_id
    return state._replace(objectives=objectives, genome_id=ids)


def test_own_units_flips_min_objectives_as_objective_matrix_does_both_ways():
    own = np.array([[0.25, 12.0], [1.5, 3.0]])
    maximised = objective_matrix(OBJECTIVES, [{"error": 0.25, "size": 12.0}, {"error": 1.5, "size": 3.0}])
    np.testing.assert_allclose(own_units(OBJECTIVES, own), maximised)
    np.testing.assert_allclose(own_units(OBJECTIVES, maximised), own)
    np.testing.assert_allclose(own_units((("acc", "max"), ("tokens", "min")), [0.5, 7.0]), [0.5, -7.0])


def test_a_declared_reference_in_own_units_measures_each_front_and_the_total():
    state = fronts_state({(0, 1): [(3, (-1.0, -4.0)), (5, (-2.0, -1.0))], (1, 0): [(8, (-0.5, -0.5))]})
    meter = Hypervolumes(OBJECTIVES, reference=[3.0, 5.0])  # error <= 3, size <= 5
    np.testing.assert_allclose(meter.cells(state), [[0, 2 * 1 + 1 * 4 - 1, 0], [2.5 * 4.5, 0, 0]])
    reading = meter.reading(state)
    assert reading == {
        "total": pytest.approx(5 + 11.25),
        "islands": [pytest.approx(5.0), pytest.approx(11.25)],
        "best": pytest.approx(11.25),
        "best_cell": [1, 0],
        "reference": [3.0, 5.0],
    }


def test_a_derived_reference_is_fixed_by_the_first_fronts_with_a_member_and_recorded():
    meter = Hypervolumes(OBJECTIVES)
    assert meter.reading(fronts_state({})) is None  # nothing to derive from yet
    first = fronts_state({(0, 0): [(1, (-1.0, -10.0)), (2, (-3.0, -2.0))]})
    reading = meter.reading(first)
    np.testing.assert_allclose(reading["reference"], [3.2, 10.8])  # worst + a tenth of the range
    later = fronts_state({(0, 0): [(1, (-1.0, -10.0)), (2, (-3.0, -2.0))], (0, 2): [(9, (-9.0, -9.0))]})
    assert meter.reading(later)["reference"] == reading["reference"]  # fixed once
    resumed = Hypervolumes.of_run(OBJECTIVES, None, [{"event": "commit"}, {EVENT_FIELD: reading}])
    assert resumed.reading(later) == meter.reading(later)
    assert Hypervolumes.of_run(OBJECTIVES, [9.0, 9.0], [{EVENT_FIELD: reading}]).reading(later)[
        "reference"
    ] == [9.0, 9.0]


def test_the_closing_lines_show_the_front_with_the_largest_hypervolume_in_own_units():
    state = fronts_state({(0, 1): [(3, (-1.0, -4.0))], (1, 2): [(4, (-0.5, -3.0)), (7, (-2.0, -1.0))]})
    meter = Hypervolumes(OBJECTIVES, reference=[3.0, 5.0])
    assert [genome_id for genome_id, _ in front(state, 1, 2)] == [4, 7]
    assert front_lines(state, meter) == [
        "front of island 1, cell 2 (hypervolume 7):",
        "  #4: error 0.5, size 3",
        "  #7: error 2, size 1",
    ]
    assert front_lines(fronts_state({}), Hypervolumes(OBJECTIVES)) == []
