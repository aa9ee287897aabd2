"""The readers' view of any archive (qd.archive.slots): a front's members as slots, and
the best member of each cell, checked against the fronts read off by hand."""

from __future__ import annotations

import dataclasses

import numpy as np

import qd.archive as qa
from qd.archive import pareto

CELLS = qa.GridSpec((3,), (0.0,), (3.0,))
FRONTS = qa.ParetoSpec(CELLS, front_size=3, num_objectives=2)


def _fronts() -> qa.ParetoState:
    """Island 0: cell 0 holds ids 4 and 7 (a trade-off), cell 2 holds id 9; island 1 is empty."""
    state = pareto.init(FRONTS, 2)
    state, _ = pareto.insert(
        FRONTS,
        state,
        0,
        np.asarray([[0.5], [0.2], [2.5]]),
        np.asarray([[1.0, -3.0], [2.0, -5.0], [-1.0, 0.0]]),
        np.asarray([4, 7, 9]),
    )
    return state


def test_a_front_shows_every_member_as_a_slot_of_its_cell_scored_by_its_first_objective():
    view = qa.slots_of(_fronts())
    ids = np.asarray(view.elites.genome_id)
    assert ids.shape == (2, 9) and np.asarray(view.cell).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ids[0].tolist() == [4, 7, -1, -1, -1, -1, 9, -1, -1] and (ids[1] == -1).all()
    fitness = np.asarray(view.elites.fitness)
    assert fitness[0, [0, 1, 6]].tolist() == [1.0, 2.0, -1.0] and np.isneginf(fitness[0, 2])
    np.testing.assert_array_equal(np.asarray(view.values)[0, 1], [2.0, -5.0])
    assert np.asarray(view.elites.descriptor)[0, 6, 0] == 2.5


def test_a_cell_counts_once_with_its_best_member_so_coverage_is_cells_with_a_member():
    best = qa.best_per_cell(_fronts())
    assert np.asarray(best.genome_id).tolist() == [[7, -1, 9], [-1, -1, -1]]
    s = qa.stats(_fronts())  # stats read a front as its best member per cell
    assert np.asarray(s.num_elites).tolist() == [2.0, 0.0, 2.0]
    assert float(s.coverage[-1]) == np.float32(2 / 6) and float(s.qd_score[-1]) == 2.0 - 1.0


def test_an_archive_of_one_elite_per_cell_is_its_own_view():
    state = qa.init(CELLS, 2)
    assert qa.best_per_cell(state) is state
    view = qa.slots_of(state)
    assert view.elites is state and np.asarray(view.cell).tolist() == [0, 1, 2]


def test_cells_a_pareto_run_adopts_get_its_fronts_and_a_pareto_spec_keeps_its_own():
    fitted = qa.CVTSpec(np.asarray([[0.0], [1.0]], np.float32))
    adopted = qa.with_thresholds(fitted, FRONTS)
    assert adopted == dataclasses.replace(FRONTS, cells=fitted)
    assert qa.with_thresholds(FRONTS, CELLS) is FRONTS
