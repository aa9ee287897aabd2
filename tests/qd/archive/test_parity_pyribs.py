"""Parity of the JAX archive (``qd.archive``) with pyribs 0.12's GridArchive/CVTArchive.

The same random sequences of batches go into a pyribs archive (storing the genome
id as its 1-d solution) and into a one-island ``qd.archive`` state. After every
batch the statuses must be identical and the improvements equal pyribs's
``value``; at the end the elites (cell, genome id, fitness, threshold) and the
statistics must agree.

Deliberate differences, each pinned by its own test below:

* qd masks invalid candidates (``valid=False``, NaN/inf fitness, NaN/inf
  descriptor, island out of range) where pyribs raises; an invalid candidate
  never blocks a valid one in its cell.
* pyribs keeps ``obj_max`` as a running maximum, which goes stale once a soft
  (finite ``threshold_min``) archive replaces an elite by a worse one (pyribs
  issue #445); qd reports the maximum of the current elites. This happens with
  ``learning_rate == 1`` too (the threshold becomes the batch *mean*), so
  ``obj_max`` is compared with pyribs only where ``threshold_min == -inf``; qd's
  max is always compared with the best elite in pyribs's ``data()``.
* pyribs 0.12 takes custom CVT centroids as ``centroids=`` (``custom_centroids``
  is the pre-0.9 name and raises).

Hypothesis draws descriptors from a small per-example pool of points (grid
boundaries, cell centres and points beyond the ranges) and small integer fitness
values, so repeated cells and ties within and across batches are frequent. The
archive shapes come from a small fixed set and batch sizes stay <= 100 (padded
to 64 or 256 inside qd), so each jitted shape compiles only a few times.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa

ribs_archives = pytest.importorskip("ribs.archives")

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# name -> (bins, ranges); a small fixed set so that each shape compiles once.
GRIDS = {
    "5x4": ((5, 4), ((-1.0, 1.0), (0.0, 2.0))),
    "10": ((10,), ((0.0, 1.0),)),
    "3x3x3": ((3, 3, 3), ((0.0, 1.0), (0.0, 1.0), (0.0, 1.0))),
}

# (learning_rate, threshold_min): the combinations pyribs accepts. The learning
# rate is static in qd's jitted insert, so every value costs a compile (~1.5 s) per
# archive shape and padding bucket: all of them run on the 5x4 grid, the other
# grids use learning_rate 1 (elitist, or soft thresholds with the plain batch mean).
SOFT_SETTINGS = [
    (1.0, -math.inf),
    (1.0, -math.inf),  # weighted: the only setting where obj_max is compared
    (1.0, -5.0),
    (0.5, -5.0),
    (0.5, 0.0),
    (0.1, -5.0),
    (0.1, 0.0),
]
UNIT_RATE_SETTINGS = [(1.0, -math.inf), (1.0, -5.0), (1.0, 0.0)]
SETTINGS_BY_GRID = {"5x4": SOFT_SETTINGS, "10": UNIT_RATE_SETTINGS, "3x3x3": UNIT_RATE_SETTINGS}

QD_SCORE_OFFSETS = [-7.0, 1.5]
FITNESS_LEVELS = (0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0)  # small: ties are frequent


def _axis_values(bins: int, lower: float, upper: float) -> list[float]:
    """Cell boundaries, cell centres, the bounds and points beyond them."""
    width = upper - lower
    inside = [lower + width * j / (2 * bins) for j in range(2 * bins + 1)]
    outside = [lower - 3 * width, lower - 0.01 * width, upper + 0.01 * width, upper + 3 * width]
    return inside + outside


def _point(bins, ranges) -> st.SearchStrategy:
    return st.tuples(*(st.sampled_from(_axis_values(b, lo, hi)) for b, (lo, hi) in zip(bins, ranges)))


def _batches(point: st.SearchStrategy, max_batches: int = 4, max_size: int = 100) -> st.SearchStrategy:
    """A pool of 1..6 points, then 1..max_batches batches of 1..max_size candidates,
    each a pool point and an integer fitness in [-3, 3]."""
    levels = len(FITNESS_LEVELS)

    @st.composite
    def strategy(draw):
        pool = draw(st.lists(point, min_size=1, max_size=6))
        # One integer per candidate (point index * levels + fitness level): cheaper
        # to generate than a tuple, and it still shrinks towards small values.
        candidate = st.integers(0, len(pool) * levels - 1)
        batches = draw(
            st.lists(st.lists(candidate, min_size=1, max_size=max_size), min_size=1, max_size=max_batches)
        )
        return [
            (
                np.asarray([pool[c // levels] for c in batch], np.float32),
                np.asarray([FITNESS_LEVELS[c % levels] for c in batch], np.float32),
            )
            for batch in batches
        ]

    return strategy()


def _ribs_options(learning_rate, threshold_min, offset) -> dict:
    """What every pyribs archive here shares: the genome id as a 1-d float32 solution."""
    return dict(
        solution_dim=1,
        learning_rate=learning_rate,
        threshold_min=threshold_min,
        qd_score_offset=offset,
        dtype=np.float32,
    )


def _ribs_grid(bins, ranges, learning_rate, threshold_min, offset):
    return ribs_archives.GridArchive(
        dims=bins, ranges=ranges, **_ribs_options(learning_rate, threshold_min, offset)
    )


def _ribs_elites(archive):
    data = archive.data()
    order = np.argsort(data["index"])
    return (
        data["index"][order].astype(np.int64),
        data["solution"][order, 0].astype(np.int64),
        data["objective"][order],
        data["threshold"][order],
    )


def _assert_same_elites(state, archive):
    mine = qa.elites(state, 0)
    index, ids, objective, threshold = _ribs_elites(archive)
    np.testing.assert_array_equal(mine.cell, index)
    np.testing.assert_array_equal(mine.genome_id, ids)
    np.testing.assert_allclose(mine.fitness, objective, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mine.threshold, threshold, rtol=1e-5, atol=1e-5)


def _assert_same_stats(state, archive, offset, compare_obj_max):
    mine = jax.device_get(qa.stats(state, offset))
    theirs = archive.stats
    for entry in (0, -1):  # the island and the global entry (one island)
        assert float(mine.num_elites[entry]) == theirs.num_elites
        np.testing.assert_allclose(float(mine.coverage[entry]), theirs.coverage, rtol=1e-6)
        np.testing.assert_allclose(float(mine.qd_score[entry]), theirs.qd_score, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(
            float(mine.norm_qd_score[entry]), theirs.norm_qd_score, rtol=1e-5, atol=1e-5
        )
        if theirs.num_elites == 0:
            assert theirs.obj_max is None and theirs.obj_mean is None
            assert float(mine.max_fitness[entry]) == -np.inf
            assert np.isnan(float(mine.mean_fitness[entry]))
            continue
        np.testing.assert_allclose(float(mine.mean_fitness[entry]), theirs.obj_mean, rtol=1e-5, atol=1e-5)
        # qd reports the best *current* elite, which always exists in pyribs's data.
        assert float(mine.max_fitness[entry]) == pytest.approx(float(np.max(archive.data("objective"))))
        if compare_obj_max:
            assert float(mine.max_fitness[entry]) == pytest.approx(float(theirs.obj_max))


def _run_parity(spec, archive, state, batches, offset, compare_obj_max):
    next_id = 0
    for descriptor, fitness in batches:
        n = len(fitness)
        ids = np.arange(next_id, next_id + n, dtype=np.int32)
        next_id += n
        expected = archive.add(ids[:, None].astype(np.float32), fitness, descriptor)
        state, result = qa.insert(spec, state, 0, descriptor, fitness, ids)
        result = jax.device_get(result)
        np.testing.assert_array_equal(result.cell, archive.index_of(descriptor))
        np.testing.assert_array_equal(result.status, expected["status"])
        np.testing.assert_allclose(result.improvement, expected["value"], rtol=1e-5, atol=1e-5)
    _assert_same_elites(state, archive)
    _assert_same_stats(state, archive, offset, compare_obj_max)


# --------------------------------------------------------------------------- grid


def test_grid_index_matches_pyribs_on_the_generated_points():
    """Every descriptor the property tests can draw maps to pyribs's cell."""
    for bins, ranges in GRIDS.values():
        spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
        archive = _ribs_grid(bins, ranges, None, -math.inf, 0.0)
        axes = [_axis_values(b, lo, hi) for b, (lo, hi) in zip(bins, ranges)]
        points = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(bins))
        points = points.astype(np.float32)
        np.testing.assert_array_equal(np.asarray(jax.jit(spec.index)(points)), archive.index_of(points))


@st.composite
def _grid_case(draw):
    name = draw(st.sampled_from(sorted(GRIDS)))
    bins, ranges = GRIDS[name]
    learning_rate, threshold_min = draw(st.sampled_from(SETTINGS_BY_GRID[name]))
    offset = draw(st.sampled_from(QD_SCORE_OFFSETS))
    # Batches of up to 100 (two padding buckets) on the 5x4 grid with learning rate
    # 1, otherwise up to 64 (one bucket), to bound the number of compiles.
    max_size = 100 if name == "5x4" and learning_rate == 1.0 else 64
    batches = draw(_batches(_point(bins, ranges), max_batches=4, max_size=max_size))
    return bins, ranges, learning_rate, threshold_min, offset, batches


@SETTINGS
@given(case=_grid_case())
def test_grid_archive_matches_pyribs(case):
    bins, ranges, learning_rate, threshold_min, offset, batches = case
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    spec = dataclasses.replace(spec, learning_rate=learning_rate, threshold_min=threshold_min)
    state = qa.init(spec, islands=1)
    archive = _ribs_grid(
        bins,
        ranges,
        None if threshold_min == -math.inf else learning_rate,
        threshold_min,
        offset,
    )
    # pyribs's obj_max is a running max: only trustworthy for an elitist archive.
    _run_parity(spec, archive, state, batches, offset, compare_obj_max=threshold_min == -math.inf)


def test_known_cma_mae_batch_example():
    """pyribs's batch rule: t' = (1-lr)^n t + (1 - (1-lr)^n) mean(f)."""
    bins, ranges = GRIDS["5x4"]
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    descriptor = np.zeros((3, 2), np.float32)
    fitness = np.asarray([1.0, 3.0, 2.0], np.float32)
    ids = np.asarray([10, 11, 12], np.int32)

    archive = _ribs_grid(bins, ranges, 0.5, -5.0, 0.0)
    info = archive.add(ids[:, None].astype(np.float32), fitness, descriptor)
    spec = dataclasses.replace(spec, learning_rate=0.5, threshold_min=-5.0)
    state = qa.init(spec, islands=1)
    state, result = qa.insert(spec, state, 0, descriptor, fitness, ids)

    np.testing.assert_array_equal(info["status"], [2, 2, 2])
    np.testing.assert_array_equal(np.asarray(result.status), [2, 2, 2])
    np.testing.assert_allclose(np.asarray(result.improvement), [6.0, 8.0, 7.0])
    np.testing.assert_allclose(info["value"], [6.0, 8.0, 7.0])
    mine = qa.elites(state, 0)
    assert mine.fitness.tolist() == [3.0]
    assert mine.genome_id.tolist() == [11]
    assert mine.threshold.tolist() == [1.125]
    assert archive.data("objective").tolist() == [3.0]
    assert archive.data("threshold").tolist() == [1.125]


@pytest.mark.parametrize(
    "learning_rate, history",
    [
        # threshold after the first batch: 0.5 * -5 + 0.5 * 10 = 2.5 < 3
        (0.5, [[10.0], [3.0]]),
        # learning rate 1 still averages a batch: threshold mean(0, 10) = 5 < 6
        (1.0, [[0.0, 10.0], [6.0]]),
    ],
)
def test_obj_max_is_current_max_unlike_pyribs_running_max(learning_rate, history):
    """pyribs issue #445: with a soft threshold an elite can be replaced by a worse
    one; pyribs's ``obj_max`` keeps the old best, qd reports the current best."""
    bins, ranges = GRIDS["5x4"]
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    archive = _ribs_grid(bins, ranges, learning_rate, -5.0, 0.0)
    spec = dataclasses.replace(spec, learning_rate=learning_rate, threshold_min=-5.0)
    state = qa.init(spec, islands=1)
    next_id = 0
    for batch in history:
        fitness = np.asarray(batch, np.float32)
        descriptor = np.full((len(batch), 2), 0.5, np.float32)  # one cell
        ids = np.arange(next_id, next_id + len(batch), dtype=np.int32)
        next_id += len(batch)
        archive.add(ids[:, None].astype(np.float32), fitness, descriptor)
        state, result = qa.insert(spec, state, 0, descriptor, fitness, ids)
        assert np.asarray(result.status).max() > 0

    worse = history[-1][0]
    assert archive.data("objective").tolist() == [worse]  # replaced the 10
    assert float(archive.stats.obj_max) == 10.0  # stale running max
    assert qa.elites(state, 0).fitness.tolist() == [worse]
    assert float(qa.stats(state).max_fitness[-1]) == worse  # current max
    # Everything else agrees.
    np.testing.assert_allclose(float(qa.stats(state).mean_fitness[-1]), archive.stats.obj_mean)
    _assert_same_elites(state, archive)


# ------------------------------------------------------------- invalid candidates


def test_pyribs_raises_on_invalid_candidates_where_qd_masks_them():
    bins, ranges = GRIDS["5x4"]
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    good = np.asarray([[0.1, 0.1]], np.float32)
    bad_cases = [
        # (descriptor, fitness, island, valid)
        (good, np.nan, 0, True),
        (good, np.inf, 0, True),
        (good, -np.inf, 0, True),
        (np.asarray([[np.nan, 0.1]], np.float32), 1.0, 0, True),
        (np.asarray([[0.1, np.inf]], np.float32), 1.0, 0, True),
    ]
    for descriptor, f, island, valid in bad_cases:
        archive = _ribs_grid(bins, ranges, None, -math.inf, 0.0)
        with pytest.raises(ValueError):
            archive.add(np.zeros((1, 1), np.float32), np.asarray([f], np.float32), descriptor)

    # qd: each of those, plus valid=False and an out-of-range island, is masked.
    bad_cases += [(good, 1.0, 0, False), (good, 1.0, 1, True), (good, 1.0, -1, True)]
    for descriptor, f, island, valid in bad_cases:
        state = qa.init(spec, islands=1)
        state, result = qa.insert(
            spec,
            state,
            np.asarray([island]),
            descriptor,
            np.asarray([f]),
            np.asarray([7]),
            valid=np.asarray([valid]),
        )
        assert int(result.status[0]) == qa.NOT_ADDED
        assert float(result.improvement[0]) == 0.0
        assert int(result.displaced_id[0]) == -1
        assert qa.elites(state, 0).cell.size == 0
        assert float(qa.stats(state).num_elites[-1]) == 0.0


def test_invalid_candidate_never_blocks_a_valid_one_in_its_cell():
    bins, ranges = GRIDS["5x4"]
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    cell_point = [0.1, 0.1]
    descriptor = np.asarray(
        [cell_point, cell_point, cell_point, cell_point, cell_point, cell_point],
        np.float32,
    )
    # Invalid ones first (lower batch positions) and with higher or NaN fitness.
    fitness = np.asarray([100.0, np.nan, np.inf, 50.0, 60.0, 1.0], np.float32)
    valid = np.asarray([False, True, True, True, True, True])
    island = np.asarray([0, 0, 0, 5, -1, 0])
    ids = np.arange(6, dtype=np.int32)
    state = qa.init(spec, islands=1)
    state, result = qa.insert(spec, state, island, descriptor, fitness, ids, valid)
    np.testing.assert_array_equal(np.asarray(result.status), [0, 0, 0, 0, 0, 2])
    elites = qa.elites(state, 0)
    assert elites.genome_id.tolist() == [5]
    assert elites.fitness.tolist() == [1.0]

    # Also against an occupied cell: the valid improvement goes through.
    fitness2 = np.asarray([100.0, np.nan, 2.0], np.float32)
    descriptor2 = np.asarray([cell_point, [np.nan, 0.1], cell_point], np.float32)
    state, result = qa.insert(
        spec,
        state,
        0,
        descriptor2,
        fitness2,
        np.asarray([6, 7, 8]),
        np.asarray([False, True, True]),
    )
    np.testing.assert_array_equal(np.asarray(result.status), [0, 0, 1])
    assert int(result.displaced_id[2]) == 5
    assert qa.elites(state, 0).genome_id.tolist() == [8]


_INVALID_KINDS = [
    "valid_false",
    "nan_fitness",
    "inf_fitness",
    "nan_descriptor",
    "inf_descriptor",
    "island_high",
    "island_low",
]


@SETTINGS
@given(
    batches=_batches(_point(*GRIDS["5x4"]), max_batches=2, max_size=64),
    soft=st.sampled_from(SOFT_SETTINGS),
    data=st.data(),
)
def test_masked_candidates_equal_pyribs_fed_only_the_valid_ones(batches, soft, data):
    """Mixing invalid candidates into a batch changes nothing for the valid ones."""
    learning_rate, threshold_min = soft
    bins, ranges = GRIDS["5x4"]
    spec = qa.GridSpec.create(bins, [r[0] for r in ranges], [r[1] for r in ranges])
    spec = dataclasses.replace(spec, learning_rate=learning_rate, threshold_min=threshold_min)
    state = qa.init(spec, islands=1)
    archive = _ribs_grid(
        bins,
        ranges,
        None if threshold_min == -math.inf else learning_rate,
        threshold_min,
        0.0,
    )
    next_id = 0
    for descriptor, fitness in batches:
        n = len(fitness)
        kinds = data.draw(
            st.lists(st.sampled_from([None] * 3 + _INVALID_KINDS), min_size=n, max_size=n),
            label="invalid kinds",
        )
        good = np.asarray([k is None for k in kinds])
        ids = np.arange(next_id, next_id + n, dtype=np.int32)
        next_id += n
        qd_descriptor, qd_fitness = descriptor.copy(), fitness.copy()
        island, valid = np.zeros(n, np.int32), np.ones(n, bool)
        for i, kind in enumerate(kinds):
            if kind == "valid_false":
                valid[i] = False
                qd_fitness[i] = 100.0  # would win the cell if it counted
            elif kind == "nan_fitness":
                qd_fitness[i] = np.nan
            elif kind == "inf_fitness":
                qd_fitness[i] = np.inf
            elif kind == "nan_descriptor":
                qd_descriptor[i, 0] = np.nan
            elif kind == "inf_descriptor":
                qd_descriptor[i, 1] = -np.inf
            elif kind == "island_high":
                island[i] = 1
            elif kind == "island_low":
                island[i] = -3
        state, result = qa.insert(
            spec,
            state,
            island,
            qd_descriptor,
            qd_fitness,
            ids,
            valid,
        )
        status = np.asarray(result.status)
        improvement = np.asarray(result.improvement)
        assert np.all(status[~good] == 0)
        assert np.all(improvement[~good] == 0.0)
        if good.any():
            expected = archive.add(ids[good, None].astype(np.float32), fitness[good], descriptor[good])
            np.testing.assert_array_equal(status[good], expected["status"])
            np.testing.assert_allclose(improvement[good], expected["value"], rtol=1e-5, atol=1e-5)
    _assert_same_elites(state, archive)
    _assert_same_stats(state, archive, 0.0, compare_obj_max=threshold_min == -math.inf)


# ---------------------------------------------------------------------------- CVT

CVT_RANGES = ((0.0, 1.0), (0.0, 1.0))
CVT_CELLS = 20


def _cvt_setup():
    """Fixed centroids, and a pool of points none of which is (nearly) equidistant
    from its two nearest centroids, so float rounding cannot change the cell."""
    rng = np.random.default_rng(1234)
    centroids = rng.uniform(0.0, 1.0, size=(CVT_CELLS, 2)).astype(np.float32)
    candidates = np.concatenate(
        [
            centroids,
            np.asarray([[-5.0, -5.0], [5.0, 0.5], [0.5, 7.0]], np.float32),
            rng.uniform(-0.5, 1.5, size=(200, 2)).astype(np.float32),
        ]
    )
    dist = np.linalg.norm(
        candidates[:, None, :].astype(np.float64) - centroids[None].astype(np.float64),
        axis=-1,
    )
    nearest = np.sort(dist, axis=1)
    keep = (nearest[:, 1] - nearest[:, 0]) > 1e-3
    assert keep[: CVT_CELLS + 3].all()
    return centroids, candidates[keep][:40]


CVT_CENTROIDS, CVT_POOL = _cvt_setup()


# Compiling the CVT insert is costly, so the CVT runs keep to one compiled shape:
# batches of at most 64 (one padding bucket) and learning rate 1 (elitist, or soft
# thresholds; rates below 1 are covered on the grid, the update rule does not
# depend on the tessellation).
CVT_SETTINGS = [(1.0, -math.inf), (1.0, -math.inf), (1.0, -5.0), (1.0, 0.0)]


@pytest.fixture(scope="module")
def cvt_spec():
    cvt = pytest.importorskip("qd.archive.cvt")
    return cvt.CVTSpec(CVT_CENTROIDS)


def _ribs_cvt(learning_rate, threshold_min, offset):
    # pyribs 0.12 takes custom centroids as ``centroids=`` (``custom_centroids`` is
    # its deprecated pre-0.9 name and raises).
    return ribs_archives.CVTArchive(
        centroids=CVT_CENTROIDS,
        ranges=CVT_RANGES,
        **_ribs_options(learning_rate, threshold_min, offset),
    )


def test_cvt_spec_geometry_and_index_match_pyribs(cvt_spec):
    assert cvt_spec.num_cells == CVT_CELLS
    assert cvt_spec.descriptor_dim == 2
    archive = _ribs_cvt(None, -math.inf, 0.0)
    state = qa.init(cvt_spec, islands=1)
    n = len(CVT_POOL)
    assert n <= 64
    _, result = qa.insert(cvt_spec, state, 0, CVT_POOL, np.zeros(n, np.float32), np.arange(n, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(result.cell), archive.index_of(CVT_POOL))
    # Each centroid is its own cell.
    np.testing.assert_array_equal(np.asarray(result.cell)[:CVT_CELLS], np.arange(CVT_CELLS))


@st.composite
def _cvt_case(draw):
    learning_rate, threshold_min = draw(st.sampled_from(CVT_SETTINGS))
    offset = draw(st.sampled_from(QD_SCORE_OFFSETS))
    point = st.integers(0, len(CVT_POOL) - 1).map(lambda i: tuple(CVT_POOL[i]))
    batches = draw(_batches(point, max_batches=3, max_size=64))
    return learning_rate, threshold_min, offset, batches


@SETTINGS
@given(case=_cvt_case())
def test_cvt_archive_matches_pyribs(cvt_spec, case):
    learning_rate, threshold_min, offset, batches = case
    spec = dataclasses.replace(cvt_spec, learning_rate=learning_rate, threshold_min=threshold_min)
    state = qa.init(spec, islands=1)
    archive = _ribs_cvt(None if threshold_min == -math.inf else learning_rate, threshold_min, offset)
    _run_parity(spec, archive, state, batches, offset, compare_obj_max=threshold_min == -math.inf)
