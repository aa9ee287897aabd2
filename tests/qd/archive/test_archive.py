"""Behaviour of the JAX archive: grid geometry, islands, sampling, migration, reset,
rebuild, padding and donation, and the novelty archive.

Parity of single-island inserts with pyribs lives in ``test_parity_pyribs.py``.
Specs and batch sizes are kept to a few shapes so the jitted functions compile
only a handful of times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa

# The cell archive's module (``qd.archive.insert`` is the kind-dispatching function).
insert_module = importlib.import_module("qd.archive.cells")

SPEC = qa.GridSpec.create((5, 4), (-1.0, 0.0), (1.0, 2.0))  # 20 cells
ISLANDS = 4  # most tests share this archive shape (fewer compiles)
PROPERTY = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _centre(spec: qa.GridSpec, cell: int) -> np.ndarray:
    """The centre of a flat cell index of ``spec``."""
    coords = np.unravel_index(cell, spec.bins)
    lower, upper = np.asarray(spec.lower), np.asarray(spec.upper)
    width = (upper - lower) / np.asarray(spec.bins)
    return (lower + (np.asarray(coords) + 0.5) * width).astype(np.float32)


def _centres(spec, cells) -> np.ndarray:
    return np.stack([_centre(spec, c) for c in cells]).astype(np.float32)


def _host(x):
    return jax.device_get(x)


# --------------------------------------------------------------------- grid index


_index = jax.jit(lambda spec, x: spec.index(x), static_argnums=0)


def test_grid_index_boundaries_go_to_the_upper_cell():
    spec = qa.GridSpec.create((4,), (0.0,), (1.0,))
    x = np.asarray([0.0, 0.2499, 0.25, 0.2501, 0.5, 0.75, 0.9999, 1.0], np.float32)
    np.testing.assert_array_equal(np.asarray(_index(spec, x[:, None])), [0, 0, 1, 1, 2, 3, 3, 3])
    # A range that does not start at 0 and whose boundaries are not exact in f32.
    spec = qa.GridSpec.create((5,), (-1.0,), (1.0,))
    x = np.asarray([-1.0, -0.6, -0.2, 0.2, 0.6, 1.0, -0.61, 0.59], np.float32)
    np.testing.assert_array_equal(np.asarray(_index(spec, x[:, None])), [0, 1, 2, 3, 4, 4, 0, 3])


def test_grid_index_clips_out_of_bounds_descriptors_into_edge_cells():
    spec = qa.GridSpec.create((4, 3), (0.0, -1.0), (1.0, 1.0))
    x = np.asarray(
        [
            [-10.0, 0.0],  # below on dim 0
            [-1e-3, 0.0],
            [1.001, 0.0],  # above
            [10.0, 0.0],
            [1e30, -1e30],  # huge values must not overflow the int cast
            [-1e30, 1e30],
            [np.inf, -np.inf],
            [-np.inf, np.inf],
        ],
        np.float32,
    )
    expected = np.ravel_multi_index(([0, 0, 3, 3, 3, 0, 3, 0], [1, 1, 1, 1, 0, 2, 0, 2]), (4, 3))
    np.testing.assert_array_equal(np.asarray(_index(spec, x)), expected)


INDEX_SPECS = [
    qa.GridSpec.create((5, 4), (-1.0, 0.0), (1.0, 2.0)),
    qa.GridSpec.create((3, 3, 3), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    qa.GridSpec.create((2, 3, 4, 5), (0.0, -2.0, 10.0, -0.5), (1.0, 2.0, 20.0, 0.5)),
]


@PROPERTY
@given(data=st.data())
def test_grid_index_is_c_order_ravel_of_per_axis_cells(data):
    spec = data.draw(st.sampled_from(INDEX_SPECS))
    n = 16  # fixed batch: one compile per spec
    coords = np.stack(
        [np.asarray(data.draw(st.lists(st.integers(0, b - 1), min_size=n, max_size=n))) for b in spec.bins],
        axis=1,
    )
    # Anywhere inside the cell, away from its edges.
    frac = np.asarray(
        data.draw(st.lists(st.floats(0.01, 0.99), min_size=n * len(spec.bins), max_size=n * len(spec.bins)))
    ).reshape(n, -1)
    lower, upper = np.asarray(spec.lower), np.asarray(spec.upper)
    width = (upper - lower) / np.asarray(spec.bins)
    x = (lower + (coords + frac) * width).astype(np.float32)
    expected = np.ravel_multi_index(tuple(coords.T), spec.bins)
    np.testing.assert_array_equal(np.asarray(_index(spec, x)), expected)


@PROPERTY
@given(data=st.data())
def test_grid_index_matches_pyribs_index_of(data):
    ribs_archives = pytest.importorskip("ribs.archives")
    spec = data.draw(st.sampled_from(INDEX_SPECS))
    n = 16
    lower, upper = np.asarray(spec.lower), np.asarray(spec.upper)
    span = upper - lower
    x = np.stack(
        [
            np.asarray(data.draw(st.lists(st.floats(lo - s, hi + s, width=32), min_size=n, max_size=n)))
            for lo, hi, s in zip(lower, upper, span)
        ],
        axis=1,
    ).astype(np.float32)
    # Stay clear of the boundaries themselves (there float32 vs float64 rounding of
    # the scaled coordinate may legitimately differ; the parity tests cover exact
    # boundary points).
    scaled = np.asarray(spec.bins) * (x.astype(np.float64) - lower) / span
    assume_clear = np.abs(scaled - np.round(scaled)) > 1e-4
    x = x[np.all(assume_clear, axis=1)]
    x = np.concatenate([x, np.broadcast_to(lower, (n - len(x), len(lower)))]).astype(np.float32)
    archive = ribs_archives.GridArchive(
        solution_dim=1,
        dims=spec.bins,
        ranges=list(zip(lower, upper)),
        dtype=np.float32,
    )
    np.testing.assert_array_equal(np.asarray(_index(spec, x)), archive.index_of(x))


def test_grid_spec_validation_and_geometry():
    spec = qa.GridSpec.create([5, 4], [-1, 0], [1, 2])
    assert spec.num_cells == 20
    assert spec.descriptor_dim == 2
    # Static and hashable: equal specs are interchangeable jit keys.
    assert spec == SPEC and hash(spec) == hash(SPEC)
    with pytest.raises(ValueError):
        qa.GridSpec.create((5, 4), (0.0,), (1.0, 1.0))
    with pytest.raises(ValueError):
        qa.GridSpec.create((0,), (0.0,), (1.0,))
    with pytest.raises(ValueError):
        qa.GridSpec.create((3,), (1.0,), (1.0,))
    with pytest.raises(ValueError):
        qa.GridSpec.create((3,), (2.0,), (1.0,))


def test_init_is_empty_and_validates():
    state = qa.init(dataclasses.replace(SPEC, threshold_min=-2.0), islands=ISLANDS)
    assert state.num_islands == ISLANDS and state.num_cells == 20
    assert state.descriptor.shape == (ISLANDS, 20, 2)
    assert np.all(np.asarray(state.genome_id) == -1)
    assert np.all(np.isneginf(np.asarray(state.fitness)))
    assert np.all(np.asarray(state.threshold) == -2.0)
    assert qa.elites(state, 0).cell.size == 0
    stats = _host(qa.stats(state, 0.0))
    assert np.all(stats.num_elites == 0) and np.all(stats.qd_score == 0)
    with pytest.raises(ValueError, match="descriptor_dim"):
        qa.init(SPEC, islands=1, descriptor_dim=3)
    with pytest.raises(ValueError, match="islands"):
        qa.init(SPEC, islands=0)


# ------------------------------------------------------------------------ islands


def test_islands_are_independent():
    state = qa.init(SPEC, islands=ISLANDS)
    x = _centres(SPEC, [0, 7, 7])
    state, result = qa.insert(SPEC, state, 1, x, [1.0, 2.0, 3.0], [10, 11, 12])
    np.testing.assert_array_equal(np.asarray(result.status), [2, 2, 2])
    for island in (0, 2, 3):
        assert qa.elites(state, island).cell.size == 0
    mine = qa.elites(state, 1)
    assert mine.cell.tolist() == [0, 7]
    assert mine.genome_id.tolist() == [10, 12]
    # The same cell on another island is still new and does not see island 1.
    state, result = qa.insert(SPEC, state, 2, x[:1], [0.5], [13])
    assert int(result.status[0]) == qa.NEW_CELL
    assert float(result.improvement[0]) == 0.5
    assert qa.elites(state, 1).genome_id.tolist() == [10, 12]
    assert qa.elites(state, 2).genome_id.tolist() == [13]
    # elites(state) stacks all islands with cell = island * C + cell.
    everything = qa.elites(state)
    assert everything.cell.tolist() == [20, 27, 40]
    assert everything.genome_id.tolist() == [10, 12, 13]


def test_one_call_for_16_islands_equals_16_single_island_archives():
    rng = np.random.default_rng(0)
    n = 64
    island = rng.integers(0, 16, n)
    x = rng.uniform([-1.2, -0.2], [1.2, 2.2], (n, 2)).astype(np.float32)
    fitness = rng.integers(-3, 4, n).astype(np.float32)
    ids = np.arange(n, dtype=np.int32)
    state = qa.init(SPEC, islands=16)
    state, result = qa.insert(SPEC, state, island, x, fitness, ids)
    for i in range(16):
        mask = island == i
        single = qa.init(SPEC, islands=1)
        single, single_result = qa.insert(SPEC, single, 0, x[mask], fitness[mask], ids[mask])
        for field in ("status", "improvement", "cell", "displaced_id"):
            np.testing.assert_array_equal(
                np.asarray(getattr(result, field))[mask],
                np.asarray(getattr(single_result, field)),
            )
        mine, theirs = qa.elites(state, i), qa.elites(single, 0)
        for field in mine._fields:
            np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field))


NUM_ISLANDS = 16
_POINTS = [tuple(_centre(SPEC, c)) for c in (0, 3, 7, 19)] + [(-5.0, 9.0), (0.0, 1.0)]


@st.composite
def _island_batches(draw):
    # Learning rate 1 only (one compile); soft thresholds still follow the batch rule.
    learning_rate, threshold_min = draw(st.sampled_from([(1.0, -math.inf), (1.0, -5.0)]))
    candidate = st.tuples(
        st.integers(-1, NUM_ISLANDS),  # -1 and 16 are out of range
        st.sampled_from(_POINTS),
        st.integers(-3, 3).map(float),
    )
    batches = draw(st.lists(st.lists(candidate, min_size=1, max_size=64), min_size=1, max_size=3))
    return learning_rate, threshold_min, batches


@settings(PROPERTY, max_examples=50)
@given(case=_island_batches())
def test_multi_island_insert_matches_one_pyribs_archive_per_island(case):
    ribs_archives = pytest.importorskip("ribs.archives")
    learning_rate, threshold_min, batches = case
    spec = dataclasses.replace(SPEC, learning_rate=learning_rate, threshold_min=threshold_min)
    state = qa.init(spec, islands=NUM_ISLANDS)
    archives = [
        ribs_archives.GridArchive(
            solution_dim=1,
            dims=SPEC.bins,
            ranges=list(zip(SPEC.lower, SPEC.upper)),
            learning_rate=None if threshold_min == -math.inf else learning_rate,
            threshold_min=threshold_min,
            dtype=np.float32,
        )
        for _ in range(NUM_ISLANDS)
    ]
    next_id = 0
    for batch in batches:
        island = np.asarray([c[0] for c in batch], np.int32)
        x = np.asarray([c[1] for c in batch], np.float32)
        fitness = np.asarray([c[2] for c in batch], np.float32)
        ids = np.arange(next_id, next_id + len(batch), dtype=np.int32)
        next_id += len(batch)
        before = np.asarray(state.genome_id).copy()
        state, result = qa.insert(spec, state, island, x, fitness, ids)
        result = _host(result)
        after = np.asarray(state.genome_id)
        in_range = (island >= 0) & (island < NUM_ISLANDS)
        assert np.all(result.status[~in_range] == 0)
        assert np.all(result.improvement[~in_range] == 0)
        assert np.all(result.displaced_id[~in_range] == -1)
        for i in range(NUM_ISLANDS):
            mask = island == i
            if not mask.any():
                continue
            expected = archives[i].add(ids[mask, None].astype(np.float32), fitness[mask], x[mask])
            np.testing.assert_array_equal(result.status[mask], expected["status"])
            np.testing.assert_allclose(result.improvement[mask], expected["value"], rtol=1e-5, atol=1e-5)
        # displaced_id: exactly the previous elites of the cells whose elite changed.
        changed = (after != before) & (before >= 0)
        displaced = result.displaced_id[result.displaced_id >= 0]
        assert sorted(displaced.tolist()) == sorted(before[changed].tolist())

    total, fitness_sum = 0, 0.0
    for i, archive in enumerate(archives):
        mine = qa.elites(state, i)
        data = archive.data()
        order = np.argsort(data["index"])
        np.testing.assert_array_equal(mine.cell, data["index"][order])
        np.testing.assert_array_equal(mine.genome_id, data["solution"][order, 0].astype(np.int64))
        np.testing.assert_allclose(mine.threshold, data["threshold"][order], rtol=1e-5, atol=1e-5)
        total += len(archive)
        fitness_sum += float(np.sum(data["objective"]))
    stats = _host(qa.stats(state, -2.0))
    assert stats.num_elites[-1] == total
    assert stats.num_elites[:-1].tolist() == [len(a) for a in archives]
    np.testing.assert_allclose(stats.coverage[-1], total / (NUM_ISLANDS * 20))
    np.testing.assert_allclose(stats.qd_score[-1], fitness_sum + 2.0 * total, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        stats.norm_qd_score[-1], (fitness_sum + 2.0 * total) / (NUM_ISLANDS * 20), rtol=1e-5, atol=1e-5
    )


# ------------------------------------------------------------------ sample/elites


def _filled(cells_by_island, islands, fitness=1.0):
    """A state whose island i holds genome id 100*i + j in cells_by_island[i][j]."""
    state = qa.init(SPEC, islands=islands)
    island, x, ids = [], [], []
    for i, cells in cells_by_island.items():
        for j, cell in enumerate(cells):
            island.append(i)
            x.append(_centre(SPEC, cell))
            ids.append(100 * i + j)
    state, result = qa.insert(
        SPEC, state, np.asarray(island), np.asarray(x), np.full(len(ids), fitness), np.asarray(ids)
    )
    assert np.all(np.asarray(result.status) == qa.NEW_CELL)
    return state


def test_sample_draws_only_filled_cells_uniformly():
    from scipy import stats as scipy_stats

    cells = [0, 3, 4, 9, 10, 11, 15, 19]
    state = _filled({0: cells, 2: [5]}, islands=ISLANDS)
    n = 8000
    ids, cell = _host(qa.sample(state, jax.random.key(0), 0, n))
    assert ids.shape == (n,) and cell.shape == (n,)
    assert set(cell.tolist()) == set(cells)  # every filled cell, nothing else
    np.testing.assert_array_equal(ids, np.asarray(state.genome_id)[0, cell])
    counts = np.bincount(cell, minlength=20)[cells]
    assert scipy_stats.chisquare(counts).pvalue > 1e-4
    # Another key gives another draw.
    ids2, _ = _host(qa.sample(state, jax.random.key(1), 0, n))
    assert not np.array_equal(ids, ids2)
    # A single filled cell, and an empty island.
    ids, cell = _host(qa.sample(state, jax.random.key(2), 2, n))
    assert set(ids.tolist()) == {200} and set(cell.tolist()) == {5}
    ids, _ = _host(qa.sample(state, jax.random.key(3), 1, n))
    assert np.all(ids == -1)


def test_elites_lists_filled_cells_with_their_data():
    state = qa.init(SPEC, islands=ISLANDS)
    x = np.asarray([[0.9, 1.9], [-0.9, 0.1], [-0.95, 0.05]], np.float32)
    state, _ = qa.insert(SPEC, state, np.asarray([1, 1, 1]), x, [4.0, 2.0, 3.0], [7, 8, 9])
    mine = qa.elites(state, 1)
    assert mine.cell.tolist() == [0, 19]
    assert mine.genome_id.tolist() == [9, 7]
    assert mine.fitness.tolist() == [3.0, 4.0]
    assert mine.threshold.tolist() == [3.0, 4.0]
    np.testing.assert_array_equal(mine.descriptor, x[[2, 0]])
    assert qa.elites(state, 0).cell.size == 0


# ---------------------------------------------------------------------- migration

KEY = jax.random.key(42)


def _island_sets(state):
    """genome ids present on each island, as sets."""
    ids = np.asarray(state.genome_id)
    return [set(row[row >= 0].tolist()) for row in ids]


def test_ring_migration_sends_island_i_to_i_plus_1_in_the_same_cell():
    cells = {0: [1], 1: [6], 2: [11], 3: [16]}
    state = _filled(cells, islands=ISLANDS)
    before = {i: qa.elites(state, i) for i in range(4)}
    # k = 2 throughout this section (one compile per topology); each island has
    # a single elite, so its second migrant is an empty cell and is not sent.
    state, result = qa.migrate(SPEC, state, KEY, "ring", 2)
    # Migrants come source island-major, then target, then rank.
    np.testing.assert_array_equal(np.asarray(result.status), [qa.NEW_CELL, qa.NOT_ADDED] * 4)
    for i in range(4):
        target = (i + 1) % 4
        mine = qa.elites(state, target)
        source = before[i]
        where = mine.cell.tolist().index(source.cell[0])
        assert mine.genome_id[where] == source.genome_id[0]
        assert mine.fitness[where] == source.fitness[0]
        np.testing.assert_array_equal(mine.descriptor[where], source.descriptor[0])
    assert _island_sets(state) == [{0, 300}, {100, 0}, {200, 100}, {300, 200}]


def test_complete_migration_sends_to_every_other_island():
    state = _filled({0: [1], 1: [6], 2: [11], 3: [16]}, islands=ISLANDS)
    state, result = qa.migrate(SPEC, state, KEY, "complete", 2)
    assert np.asarray(result.status).shape == (4 * 3 * 2,)
    assert _island_sets(state) == [{0, 100, 200, 300}] * 4
    for island in range(4):  # every elite sits in its original cell
        mine = qa.elites(state, island)
        assert dict(zip(mine.genome_id.tolist(), mine.cell.tolist())) == {0: 1, 100: 6, 200: 11, 300: 16}


def test_random_migration_sends_to_one_other_island():
    state = _filled({0: [1], 1: [6], 2: [11], 3: [16]}, islands=ISLANDS)
    for seed in range(3):
        key = jax.random.key(seed)
        migrated, _ = qa.migrate(SPEC, jax.tree_util.tree_map(jnp.copy, state), key, "random", 2)
        sets = _island_sets(migrated)
        for source in range(4):
            holders = [i for i in range(4) if 100 * source in sets[i]]
            assert source in holders and len(holders) == 2, (seed, sets)


def test_migrants_only_replace_worse_elites():
    # island 0: cell 1 (5.0, id 1), cell 2 (4.0, id 2)
    # island 1: cell 1 (3.0, id 3), cell 2 (4.0, id 4), cell 3 (9.0, id 5)
    # island 2: cell 1 (7.0, id 6), cell 2 (6.0, id 7); island 3 empty.
    state = qa.init(SPEC, islands=ISLANDS)
    island = np.asarray([0, 0, 1, 1, 1, 2, 2])
    cells = [1, 2, 1, 2, 3, 1, 2]
    fitness = np.asarray([5.0, 4.0, 3.0, 4.0, 9.0, 7.0, 6.0], np.float32)
    ids = np.asarray([1, 2, 3, 4, 5, 6, 7])
    state, _ = qa.insert(SPEC, state, island, _centres(SPEC, cells), fitness, ids)
    # ring, k=2: 0 -> 1 sends ids 1 (cell 1, 5.0: better, replaces 3.0) and 2 (cell
    # 2, 4.0: a tie, does not replace); 1 -> 2 sends ids 5 (cell 3: new) and 4 (cell
    # 2, 4.0: worse than 6.0); 2 -> 3 sends ids 6 and 7; island 3 sends nothing.
    state, result = qa.migrate(SPEC, state, KEY, "ring", 2)
    zero = qa.elites(state, 0)
    assert dict(zip(zero.cell.tolist(), zero.genome_id.tolist())) == {1: 1, 2: 2}
    one = qa.elites(state, 1)
    assert dict(zip(one.cell.tolist(), one.genome_id.tolist())) == {1: 1, 2: 4, 3: 5}
    two = qa.elites(state, 2)
    assert dict(zip(two.cell.tolist(), two.genome_id.tolist())) == {1: 6, 2: 7, 3: 5}
    three = qa.elites(state, 3)
    assert dict(zip(three.cell.tolist(), three.genome_id.tolist())) == {1: 6, 2: 7}
    # Elitist thresholds follow the fitness of the new elite.
    np.testing.assert_array_equal(one.threshold, one.fitness)


def test_migration_sends_the_top_k_elites():
    state = qa.init(SPEC, islands=ISLANDS)
    state, _ = qa.insert(SPEC, state, 0, _centres(SPEC, [2, 4, 6]), [1.0, 3.0, 2.0], [10, 11, 12])
    state, _ = qa.migrate(SPEC, state, KEY, "ring", 2)
    assert sorted(qa.elites(state, 1).genome_id.tolist()) == [11, 12]
    assert qa.elites(state, 0).genome_id.tolist() == [10, 11, 12]


def test_unknown_topology_raises_naming_the_argument():
    state = qa.init(SPEC, islands=ISLANDS)
    with pytest.raises(ValueError, match=r"^topology: unknown topology 'star'"):
        qa.migrate(SPEC, state, KEY, "star", 1)


def test_migration_with_one_island_changes_nothing():
    state = _filled({0: [1, 2]}, islands=1)
    expected = jax.tree_util.tree_map(np.asarray, state)
    state, result = qa.migrate(SPEC, state, KEY, "ring", 1)
    for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert np.asarray(result.status).size == 0


@pytest.mark.slow  # compiles a CVT insert (several seconds)
def test_migration_works_with_a_cvt_spec():
    cvt = pytest.importorskip("qd.archive.cvt")
    rng = np.random.default_rng(0)
    centroids = rng.uniform(0.0, 1.0, (20, 2)).astype(np.float32)
    spec = cvt.CVTSpec(centroids)
    # Island 0 holds the centroids of cells 0, 1, 2 (ids 10, 11, 12), written
    # directly into the documented state fields (no CVT insert compile needed).
    empty = jax.tree_util.tree_map(np.array, qa.init(spec, islands=ISLANDS))
    empty.fitness[0, :3] = [1.0, 2.0, 3.0]
    empty.threshold[0, :3] = [1.0, 2.0, 3.0]
    empty.genome_id[0, :3] = [10, 11, 12]
    empty.descriptor[0, :3] = centroids[:3]
    state = jax.tree_util.tree_map(jnp.asarray, empty)
    state, _ = qa.migrate(spec, state, KEY, "ring", 2)
    one = qa.elites(state, 1)
    assert dict(zip(one.genome_id.tolist(), one.cell.tolist())) == {11: 1, 12: 2}


# -------------------------------------------------------------------------- reset


def test_reset_empties_only_the_masked_islands():
    spec = dataclasses.replace(SPEC, threshold_min=-5.0)
    state = qa.init(spec, islands=ISLANDS)
    island = np.asarray([0, 1, 2, 2])
    state, _ = qa.insert(
        spec, state, island, _centres(SPEC, [1, 1, 1, 4]), [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4]
    )
    kept = {i: qa.elites(state, i) for i in (0, 1)}
    state = qa.reset(state, jnp.asarray([False, False, True, False]))
    for i in (0, 1):
        for field in kept[i]._fields:
            np.testing.assert_array_equal(getattr(qa.elites(state, i), field), getattr(kept[i], field))
    assert qa.elites(state, 2).cell.size == 0
    np.testing.assert_array_equal(np.asarray(state.genome_id)[2], -1)
    assert np.all(np.isneginf(np.asarray(state.fitness)[2]))
    np.testing.assert_array_equal(np.asarray(state.threshold)[2], -5.0)
    np.testing.assert_array_equal(np.asarray(state.descriptor)[2], 0.0)
    # A reset island behaves as new: status 2, improvement against threshold_min.
    state, result = qa.insert(spec, state, 2, _centres(SPEC, [1]), [0.0], [9])
    assert int(result.status[0]) == qa.NEW_CELL
    assert float(result.improvement[0]) == 5.0
    stats = _host(qa.stats(state))
    assert stats.num_elites.tolist() == [1.0, 1.0, 1.0, 0.0, 3.0]


# ------------------------------------------------------------------------ rebuild


@st.composite
def _rebuild_case(draw):
    points = [tuple(_centre(SPEC, c)) for c in (0, 5, 13)] + [(3.0, -1.0)]
    candidate = st.tuples(
        st.integers(0, ISLANDS - 1),
        st.sampled_from(points),
        st.integers(-2, 2).map(float),
        st.booleans().map(lambda b: b or None),  # None: valid, False: invalid
    )
    candidates = draw(st.lists(candidate, min_size=1, max_size=120))
    n = len(candidates)
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=6)))
    cuts = [c for c in cuts if c < n]
    return candidates, [0, *cuts, n]


@PROPERTY
@given(case=_rebuild_case())
def test_rebuild_equals_sequential_inserts_whatever_the_batching(case):
    candidates, cuts = case
    island = np.asarray([c[0] for c in candidates], np.int32)
    x = np.asarray([c[1] for c in candidates], np.float32)
    fitness = np.asarray([c[2] for c in candidates], np.float32)
    valid = np.asarray([c[3] is None for c in candidates])
    ids = np.arange(len(candidates), dtype=np.int32)
    state = qa.init(SPEC, islands=ISLANDS)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if hi - lo > 64:  # keep sequential batches in one padding bucket
            for mid in range(lo, hi, 64):
                top = min(mid + 64, hi)
                state, _ = qa.insert(
                    SPEC, state, island[mid:top], x[mid:top], fitness[mid:top], ids[mid:top], valid[mid:top]
                )
        else:
            state, _ = qa.insert(
                SPEC, state, island[lo:hi], x[lo:hi], fitness[lo:hi], ids[lo:hi], valid[lo:hi]
            )
    rebuilt = qa.rebuild(SPEC, ISLANDS, island, x, fitness, ids, valid)
    for got, want in zip(rebuilt, state):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_rebuild_with_soft_thresholds_equals_one_batch():
    x = np.zeros((3, 2), np.float32)
    soft = dataclasses.replace(SPEC, threshold_min=-5.0, learning_rate=0.5)
    rebuilt = qa.rebuild(soft, 1, 0, x, [1.0, 3.0, 2.0], [10, 11, 12])
    mine = qa.elites(rebuilt, 0)
    assert mine.genome_id.tolist() == [11] and mine.threshold.tolist() == [1.125]


# --------------------------------------------------------- padding and donation


def test_padded_size_buckets():
    assert qa.padded_size(0) == 64
    assert qa.padded_size(1) == 64
    assert qa.padded_size(64) == 64
    assert qa.padded_size(65) == 256
    assert qa.padded_size(256) == 256
    assert qa.padded_size(257) == 1024
    assert qa.padded_size(4096) == 4096
    assert qa.padded_size(16384) == 16384
    assert qa.padded_size(16385) == 32768
    assert qa.padded_size(40000) == 49152
    for n in range(1, 3000, 37):
        assert qa.padded_size(n) >= n


# The jitted insert entry points of ``qd.archive.cells``: the public
# ``insert_device`` and ``_insert_packed`` (which :func:`qa.insert` goes through).
JITTED_INSERTS = ("insert_device", "_insert_packed")


def insert_devices():
    """The jitted functions named in JITTED_INSERTS."""
    jitted = [getattr(insert_module, name) for name in JITTED_INSERTS]
    assert all(hasattr(fn, "lower") for fn in jitted), jitted
    return jitted


@contextlib.contextmanager
def _count_insert_compiles():
    """Counts compilations of the jitted insert inside the block."""
    jitted = insert_devices()
    box = {"n": 0}
    if jitted and all(hasattr(f, "_cache_size") for f in jitted):
        start = sum(f._cache_size() for f in jitted)
        yield box
        box["n"] = sum(f._cache_size() for f in jitted) - start
        return

    class Handler(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if "Compiling" in message and "insert" in message:
                box["n"] += 1

    handler = Handler()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield box
    finally:
        logger.removeHandler(handler)


def test_batches_in_one_padding_bucket_share_a_compile():
    spec = qa.GridSpec.create((7,), (0.0,), (1.0,))  # a shape used nowhere else
    state = qa.init(spec, islands=2)
    rng = np.random.default_rng(0)

    def batch(n):
        return (
            rng.integers(0, 2, n),
            rng.uniform(0, 1, (n, 1)),
            rng.normal(size=n),
            rng.integers(0, 1000, n),
        )

    with _count_insert_compiles() as first:
        state, result = qa.insert(spec, state, *batch(10))
    assert first["n"] == 1  # the counter sees compiles
    assert np.asarray(result.status).shape == (10,)
    with _count_insert_compiles() as same_bucket:
        state, result = qa.insert(spec, state, *batch(50))
        state, result = qa.insert(spec, state, *batch(64))
        state, result = qa.insert(spec, state, *batch(1))
    assert same_bucket["n"] == 0
    assert np.asarray(result.status).shape == (1,)


def test_padding_does_not_leak_into_the_archive():
    state = qa.init(SPEC, islands=1)
    state, result = qa.insert(SPEC, state, 0, _centres(SPEC, [3]), [-100.0], [5])
    assert int(result.status[0]) == qa.NEW_CELL
    mine = qa.elites(state, 0)
    # Padding rows (island 0, descriptor 0, fitness -inf, id -1) changed nothing.
    assert mine.cell.tolist() == [3] and mine.genome_id.tolist() == [5]
    assert float(_host(qa.stats(state)).num_elites[-1]) == 1.0


def test_insert_donates_the_state_and_returns_a_new_one():
    state = qa.init(SPEC, islands=1)
    new_state, _ = qa.insert(SPEC, state, 0, _centres(SPEC, [3]), [1.0], [5])
    assert new_state is not state
    assert all(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(new_state))
    with pytest.raises(RuntimeError):
        np.asarray(state.fitness)


def test_insert_batch_is_traceable_and_matches_insert():
    rng = np.random.default_rng(3)
    n = 8
    args = (
        rng.integers(0, ISLANDS, n).astype(np.int32),
        rng.uniform(-1, 2, (n, 2)).astype(np.float32),
        rng.integers(-2, 3, n).astype(np.float32),
        np.arange(n, dtype=np.int32),
        np.ones(n, bool),
    )
    traced = jax.jit(lambda s, *a: qa.insert_batch(SPEC, s, *a))
    state_a, result_a = traced(qa.init(SPEC, islands=ISLANDS), *args)
    state_b, result_b = qa.insert(SPEC, qa.init(SPEC, islands=ISLANDS), *args)
    for got, want in zip([*state_a, *result_a], [*state_b, *result_b]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_insert_device_runs_and_matches_insert():
    """``qa.insert_device`` (jitted, state donated, no padding) on device arrays gives
    the host path's new state and results, and leaves its results on the device."""
    assert qa.insert_device is insert_module.insert_device
    rng = np.random.default_rng(5)
    n = 24  # repeats cells and islands, so batch-local winners are exercised
    args = (
        rng.integers(0, ISLANDS, n).astype(np.int32),
        rng.uniform(-1.2, 2.2, (n, 2)).astype(np.float32),  # some out of bounds
        rng.integers(-3, 4, n).astype(np.float32),  # ties within a cell
        np.arange(100, 100 + n, dtype=np.int32),
        rng.random(n) < 0.8,
    )
    before = [(a[: n // 2], a[n // 2 :]) for a in args]
    # Soft (CMA-MAE) thresholds, so the spec's (static) learning rate matters too.
    spec = dataclasses.replace(SPEC, threshold_min=-5.0, learning_rate=0.5)
    state_host = qa.init(spec, islands=ISLANDS)
    state_dev = qa.init(spec, islands=ISLANDS)
    for half in (0, 1):  # two batches: the second lands on an occupied archive
        batch = [b[half] for b in before]
        state_host, want = qa.insert(spec, state_host, *batch)
        old_dev = state_dev
        state_dev, got = qa.insert_device(spec, state_dev, *map(jnp.asarray, batch))
        assert all(isinstance(x, jax.Array) for x in got)  # results stay on device
        assert old_dev.fitness.is_deleted()  # the state was donated
        assert {int(s) for s in np.asarray(got.status)} >= {qa.NOT_ADDED, qa.NEW_CELL}
        for name in qa.InsertResult._fields:
            np.testing.assert_array_equal(
                np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
            )
        for name in qa.ArchiveState._fields:
            np.testing.assert_array_equal(
                np.asarray(getattr(state_dev, name)), np.asarray(getattr(state_host, name)), err_msg=name
            )
    assert int(np.sum(np.asarray(got.status) == qa.IMPROVED)) > 0  # all three outcomes seen


def _archive_sized_copies(hlo: str, cells: int) -> list[str]:
    """HLO ``copy`` instructions whose result has at least ``cells`` elements."""
    copies = []
    for line in hlo.splitlines():
        match = re.search(r"=\s*([a-z0-9]+)\[([0-9,]*)\][^=]*\bcopy\(", line)
        if match:
            dims = [int(d) for d in match.group(2).split(",") if d]
            if math.prod(dims) >= cells:
                copies.append(line.strip())
    return copies


BIG_SPEC = qa.GridSpec.create((1000, 1000), (0.0, 0.0), (1.0, 1.0))


@functools.cache
def _compiled_insert(name: str, batch: int = 64) -> str:
    """The compiled HLO text of the jitted insert ``name`` (``insert_device`` or
    ``_insert_packed``) on a one-island 1M-cell grid."""
    fn = getattr(insert_module, name)
    state = jax.eval_shape(lambda: qa.init(BIG_SPEC, islands=1))
    lowered = fn.lower(
        BIG_SPEC,
        state,
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        jax.ShapeDtypeStruct((batch, 2), jnp.float32),
        jax.ShapeDtypeStruct((batch,), jnp.float32),
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        jax.ShapeDtypeStruct((batch,), jnp.bool_),
    )
    return lowered.compile().as_text()


def _kernels(hlo: str) -> list[str]:
    """The ops of the entry computation that run work (fusions, conditionals,
    copies, ...), i.e. everything but parameters, constants and views."""
    free = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}
    entry = hlo[hlo.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    ops = [
        re.search(r"\s([a-z][a-z0-9-]*)\(", line.split("=", 1)[1])
        for line in entry.splitlines()[1:]
        if "=" in line
    ]
    return [op.group(1) for op in ops if op and op.group(1) not in free]


def test_insert_does_not_copy_archive_sized_buffers():
    """Donation must let XLA update the archive in place: no copy of any buffer as
    large as the archive (a copy makes every insert O(cells) instead of O(batch))."""
    for name in JITTED_INSERTS:
        hlo = _compiled_insert(name)
        # The archive buffers are aliased to the outputs (donation) ...
        assert "input_output_alias" in hlo
        # ... and none of them (nor a flattened view) is copied.
        copies = _archive_sized_copies(hlo, BIG_SPEC.num_cells)
        assert not copies, "\n".join(copies)


# Kernels XLA:CPU runs per grid insert call (one each per fusion or conditional):
# each costs a dispatch, which dominates small batches, and a pass over the batch,
# which dominates large ones. The segment-reduction formulation this replaced
# compiled to 29 (``_insert_packed``) and 31 (``insert_device``, which returns
# five arrays where the packed one returns one).
MAX_GRID_INSERT_KERNELS = {"_insert_packed": 15, "insert_device": 19}


@pytest.mark.parametrize("name", JITTED_INSERTS)
def test_grid_insert_compiles_to_few_kernels(name):
    kernels = _kernels(_compiled_insert(name))
    assert 0 < len(kernels) <= MAX_GRID_INSERT_KERNELS[name], kernels


# ------------------------------------------------------------------------ novelty


def test_empty_novelty_archive_gives_infinite_novelty():
    state = qa.novelty_init(8, 2)
    score = np.asarray(qa.novelty(state, np.zeros((4, 2), np.float32), 3))
    assert np.all(np.isposinf(score))


def _brute_force_novelty(archive: np.ndarray, queries: np.ndarray, k: int):
    if len(archive) == 0:
        return np.full(len(queries), np.inf)
    dist = np.linalg.norm(
        queries[:, None, :].astype(np.float64) - archive[None].astype(np.float64),
        axis=-1,
    )
    nearest = np.sort(dist, axis=1)[:, :k]
    return nearest.mean(axis=1)


@PROPERTY
@given(
    entries=st.lists(st.tuples(st.floats(-10, 10, width=32), st.floats(-10, 10, width=32)), max_size=16),
    queries=st.lists(
        st.tuples(st.floats(-10, 10, width=32), st.floats(-10, 10, width=32)), min_size=8, max_size=8
    ),
    k=st.sampled_from([1, 3, 5]),
)
def test_novelty_is_mean_distance_to_k_nearest(entries, queries, k):
    capacity, batch = 16, 16
    state = qa.novelty_init(capacity, 2)
    m = len(entries)
    descriptor = np.zeros((batch, 2), np.float32)
    if m:
        descriptor[:m] = entries
    fitness = np.where(np.arange(batch) < m, 0.0, np.nan).astype(np.float32)
    # Threshold -inf: everything with a finite fitness is added (NaN rows are not).
    state, added, _ = qa.novelty_add(state, descriptor, fitness, np.arange(batch, dtype=np.int32), -np.inf, 1)
    assert np.asarray(added).tolist() == [i < m for i in range(batch)]
    queries = np.asarray(queries, np.float32)
    score = np.asarray(qa.novelty(state, queries, k))
    # float32 distances (|a|^2 + |b|^2 - 2ab) cannot order neighbours closer than ~1e-4 of each
    # other: the k nearest may swap, moving the mean by up to that much (found by hypothesis:
    # entries 0 and 1.9e-5 apart, query on one of them).
    np.testing.assert_allclose(score, _brute_force_novelty(descriptor[:m], queries, k), rtol=1e-5, atol=1e-4)


def test_novelty_add_gates_on_the_threshold():
    state = qa.novelty_init(8, 1)
    state, added, score = qa.novelty_add(
        state,
        np.asarray([[0.0], [10.0]], np.float32),
        np.zeros(2, np.float32),
        np.asarray([0, 1], np.int32),
        1.0,
        1,
    )
    assert np.asarray(added).tolist() == [True, True]  # empty archive: +inf novelty
    candidates = np.asarray([[0.5], [5.0], [20.0], [30.0], [40.0], [40.0]], np.float32)
    fitness = np.asarray([1.0, 1.0, 1.0, np.nan, 1.0, 1.0], np.float32)
    state, added, score = qa.novelty_add(state, candidates, fitness, np.arange(2, 8, dtype=np.int32), 1.0, 1)
    np.testing.assert_allclose(np.asarray(score), [0.5, 5.0, 10.0, 20.0, 30.0, 30.0])
    # Below threshold: no; NaN fitness: no; two identical novel candidates are both
    # judged against the archive before the batch, so both enter.
    assert np.asarray(added).tolist() == [False, True, True, False, True, True]
    ids = np.asarray(state.genome_id)
    assert sorted(ids[ids >= 0].tolist()) == [0, 1, 3, 4, 6, 7]
    assert int(state.count) == 6
    stored = np.asarray(state.descriptor)[np.argsort(ids)][ids[np.argsort(ids)] >= 0]
    np.testing.assert_array_equal(stored[:, 0], [0.0, 10.0, 5.0, 20.0, 40.0, 40.0])


def test_novelty_archive_is_a_ring_buffer_once_full():
    state = qa.novelty_init(4, 1)
    for start in range(0, 6, 2):  # 3 batches of 2, always novel (threshold -inf)
        ids = np.asarray([start, start + 1], np.int32)
        state, added, _ = qa.novelty_add(
            state,
            ids[:, None].astype(np.float32),
            np.zeros(2, np.float32),
            ids,
            -np.inf,
            1,
        )
        assert np.asarray(added).all()
    assert int(state.count) == 6
    # Slot = insertion number mod capacity: 4 and 5 overwrote the oldest, 0 and 1.
    np.testing.assert_array_equal(np.asarray(state.genome_id), [4, 5, 2, 3])
    np.testing.assert_array_equal(np.asarray(state.descriptor)[:, 0], [4, 5, 2, 3])
    score = np.asarray(qa.novelty(state, np.asarray([[0.0]], np.float32), 1))
    assert score.tolist() == [2.0]  # entry 0 is gone; the nearest is 2


def test_novelty_batch_larger_than_capacity_keeps_the_latest():
    state = qa.novelty_init(4, 1)
    ids = np.arange(6, dtype=np.int32)
    state, added, _ = qa.novelty_add(
        state,
        ids[:, None].astype(np.float32),
        np.zeros(6, np.float32),
        ids,
        -np.inf,
        1,
    )
    assert np.asarray(added).all() and int(state.count) == 6
    # The latest additions win their slots (slot = insertion number mod capacity).
    np.testing.assert_array_equal(np.asarray(state.genome_id), [4, 5, 2, 3])
    np.testing.assert_array_equal(np.asarray(state.descriptor)[:, 0], [4, 5, 2, 3])


def test_negative_genome_id_is_masked_not_a_ghost_elite():
    spec = qa.GridSpec((4,), (0.0,), (1.0,))
    state = qa.init(spec, 1)
    state, result = qa.insert(spec, state, 0, [[0.5]], [7.0], [-1])
    assert result.status.tolist() == [0]
    stats = qa.stats(state)
    assert float(stats.num_elites[-1]) == 0 and float(stats.max_fitness[-1]) == -np.inf
    state, result = qa.insert(spec, state, 0, [[0.5]], [5.0], [3])
    assert result.status.tolist() == [2]


def test_out_of_range_island_is_an_error_for_host_calls():
    spec = qa.GridSpec((4,), (0.0,), (1.0,))
    state = qa.init(spec, 2)
    with pytest.raises(ValueError, match="island 5 is out of range for 2 islands"):
        qa.elites(state, 5)
    with pytest.raises(ValueError, match="island -1 is out of range"):
        qa.sample(state, jax.random.key(0), -1, 3)


def test_union_stats_merge_islands_cell_by_cell():
    spec = qa.GridSpec((4,), (0.0,), (1.0,))
    state = qa.init(spec, islands=3)
    # cell 0 on islands 0 and 1 (a migrant copy), cell 2 on island 2
    state, _ = qa.insert(
        spec,
        state,
        np.array([0, 1, 2]),
        np.array([[0.1], [0.1], [0.6]]),
        np.array([2.0, 3.0, 5.0]),
        np.array([0, 1, 2]),
    )
    u = qa.union_stats(state, 1.0)
    assert float(u.num_elites[0]) == 2 and float(u.coverage[0]) == 0.5
    assert float(u.qd_score[0]) == (3.0 - 1.0) + (5.0 - 1.0)  # best per cell, minus the offset
    assert float(u.max_fitness[0]) == 5.0
    g = qa.stats(state, 1.0)
    assert float(g.num_elites[-1]) == 3  # the global entry counts the copy again
