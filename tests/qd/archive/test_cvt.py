"""Tests for the CVT archive's parts: the spec (qd.archive.cvt), its exact nearest-centroid
lookup (qd.archive.centroid_index, qd.archive.bucket_grid) and CVT centroids
(qd.archive.centroids)."""

from __future__ import annotations

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qd.archive import centroid_index
from qd.archive.bucket_grid import build_grid
from qd.archive.centroid_index import CentroidIndex
from qd.archive.centroids import cvt_centroids
from qd.archive.cvt import CVTSpec

_index = jax.jit(lambda spec, x: spec.index(x))


def brute_force(centroids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 nearest centroid by squared distance, lowest index on ties.

    A float64 matmul screen keeps every centroid within a generous 1e-9 relative margin
    of the best score (float64 rounding is ~1e-15), then the argmin of direct
    differences ``(x - c)^2`` decides. (C, D), (B, D) -> (B,).
    """
    c = centroids.astype(np.float64)
    q = x.astype(np.float64)
    c_sq = np.sum(c**2, axis=1)
    out = []
    for qs in np.array_split(q, max(1, len(q) // 128)):
        score = c_sq - 2 * qs @ c.T
        slack = 1e-9 * (np.sum(qs**2, axis=1) + c_sq.max())[:, None]
        close = score <= score.min(axis=1, keepdims=True) + slack
        for row, mask in zip(qs, close, strict=True):
            cand = np.flatnonzero(mask)
            out.append(cand[np.argmin(np.sum((row - c[cand]) ** 2, axis=1))])
    return np.asarray(out)


def check_exact(centroids: np.ndarray, x: np.ndarray) -> CVTSpec:
    """Asserts the jitted index matches brute force; returns the spec for more checks."""
    spec = CVTSpec(centroids)
    got = np.asarray(_index(spec, jnp.asarray(x)))
    np.testing.assert_array_equal(got, brute_force(centroids, x))
    return spec


@st.composite
def _coordinates(draw: st.DrawFn, shape: tuple[int, int]) -> np.ndarray:
    """float32 coordinates in [-1, 1] of the given shape.

    Half the time snapped to multiples of 1/4, which makes exact ties common. Magnitudes
    below 1e-3 become 0: XLA:CPU flushes subnormal float32 to zero, so two centroids
    both within ~1e-12 of a query are outside the exactness guarantee.
    """
    values = draw(hnp.arrays(np.float32, shape, elements=st.floats(-1, 1, width=32)))
    if draw(st.booleans()):
        values = np.round(values * 4) / 4
    values[np.abs(values) < 1e-3] = 0
    return values


@st.composite
def _centroids_and_queries(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Five (C, D) shapes only, so the jitted index compiles five times."""
    num, dim = draw(st.sampled_from([(9, 1), (2, 2), (9, 2), (9, 3), (9, 5)]))
    values = draw(_coordinates((num + 32, dim)))
    centroids = values[:num]
    # Queries reach three times past the centroids' [-1, 1] bounds; some sit exactly
    # on centroids.
    x = 3 * values[num:]
    x[:4] = centroids[draw(st.lists(st.integers(0, num - 1), min_size=4, max_size=4))]
    return centroids, x


@settings(max_examples=200, deadline=None)
@given(_centroids_and_queries())
def test_index_exact_property(data: tuple[np.ndarray, np.ndarray]) -> None:
    check_exact(*data)


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(1, 40), st.integers(1, 3)).flatmap(_coordinates),
    st.integers(0, 2**32 - 1),
)
def test_grid_lists_hold_every_nearest(centroids: np.ndarray, seed: int) -> None:
    """Every centroid tied for nearest at a point of a bucket is in that bucket's list."""
    grid_lo, inv_width, lists, shape = build_grid(centroids.astype(np.float64))
    rng = np.random.default_rng(seed)
    # Points across the grid, including its edges.
    pos = rng.uniform(0, 1, (64, len(shape))) * np.asarray(shape)
    pos[:8] = np.round(pos[:8])
    x = grid_lo + pos / inv_width.astype(np.float64)
    bucket = np.ravel_multi_index(
        tuple(np.clip(np.floor(pos), 0, np.asarray(shape) - 1).astype(int).T), shape
    )
    dist = np.sum((x[:, None] - centroids.astype(np.float64)) ** 2, axis=2)
    for row, b in zip(dist, bucket, strict=True):
        assert set(np.flatnonzero(row == row.min())) <= set(lists[b])


def test_lattice_ties_and_duplicates_grid_and_off_grid() -> None:
    """Exact ties (cell midpoints), duplicate centroids, and queries off the grid."""
    rng = np.random.default_rng(0)
    lattice = np.stack(np.meshgrid(np.arange(20), np.arange(20)), -1).reshape(-1, 2)
    lattice = lattice[rng.permutation(len(lattice))].astype(np.float32)
    centroids = np.concatenate([lattice, lattice[rng.choice(400, 40)]])
    mids = lattice[:200] + np.float32(0.5)
    edges = lattice[200:300] + np.asarray([0.5, 0], np.float32)
    spec = check_exact(centroids, np.concatenate([mids, edges, lattice[300:]]))
    assert spec.lookup.grid_shape
    check_exact(centroids, rng.uniform(-50, 70, (300, 2)).astype(np.float32))


def test_lattice_ties_matmul_path() -> None:
    """Many exactly tied candidates in 5-D send rows to the exhaustive pick."""
    rng = np.random.default_rng(1)
    axes = [np.arange(4)] * 5
    lattice = np.stack(np.meshgrid(*axes), -1).reshape(-1, 5).astype(np.float32)
    centroids = lattice[rng.permutation(len(lattice))]
    x = np.concatenate([centroids[:100] + np.float32(0.5), rng.uniform(-1, 4, (100, 5))]).astype(np.float32)
    spec = check_exact(centroids, x)
    assert not spec.lookup.grid_shape


def _near_ties() -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Cases float32 gets wrong: (centroids, query, nearest index)."""
    y = np.float32(np.sqrt(2.0**-23 - 2.0**-30))
    # Squared distances 1 and 1 - 9.3e-10: both round to 1 in float32.
    rounded_sum = np.asarray([[1, 0], [1 - 2**-24, y]], np.float32)
    assert np.float32(rounded_sum[1, 0] ** 2) + np.float32(y**2) == np.float32(1)
    # x - c = 1 + 2^-40 and 2^-40 - 1 both round to +-1 in float32.
    return {
        "sum": (rounded_sum, np.zeros(2, np.float32), 1),
        "difference": (np.asarray([[-1], [1]], np.float32), np.float32([2**-40]), 1),
    }


@pytest.mark.parametrize("case", ["sum", "difference"])
@pytest.mark.parametrize("far_centroids", [0, 300])
def test_near_tie_beyond_float32(case: str, far_centroids: int) -> None:
    """The nearest of two centroids whose float32 distances tie.

    With 300 extra centroids far away, the lookup uses the bucket grid.
    """
    close, query, nearest = _near_ties()[case]
    far = np.random.default_rng(2).uniform(10, 20, (far_centroids, close.shape[1]))
    centroids = np.concatenate([close, far]).astype(np.float32)
    x = np.repeat(query[None], 3, axis=0)
    spec = check_exact(centroids, x)
    assert bool(spec.lookup.grid_shape) == (far_centroids > 0)
    np.testing.assert_array_equal(np.asarray(_index(spec, jnp.asarray(x))), nearest)


@pytest.mark.parametrize("dim", [2, 16])
def test_index_exact_100k_centroids(dim: int) -> None:
    """At 100k cells the float32 expanded-norm trick errs; index must not."""
    rng = np.random.default_rng(dim)
    centroids = rng.uniform(-1, 1, (100_000, dim)).astype(np.float32)
    x = rng.uniform(-1.1, 1.1, (2000, dim)).astype(np.float32)
    spec = check_exact(centroids, x)
    assert bool(spec.lookup.grid_shape) == (dim == 2)


def test_index_in_jit_with_traced_spec() -> None:
    """The spec is an ordinary jit argument: array fields traced, grid_shape static."""
    centroids = cvt_centroids(500, [0.0, -1.0], [1.0, 1.0], samples=5000, seed=3)
    spec = CVTSpec(centroids)
    leaves, treedef = jax.tree_util.tree_flatten(spec)
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)
    assert jax.tree_util.tree_unflatten(treedef, leaves).lookup.grid_shape == spec.lookup.grid_shape

    @jax.jit
    def cells_and_centers(s: CVTSpec, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        cells = s.index(x)
        return cells, s.centroids[cells]

    x = np.random.default_rng(4).uniform(-0.2, 1.2, (2500, 2)).astype(np.float32)
    cells, centers = cells_and_centers(spec, jnp.asarray(x))
    assert cells.shape == (2500,) and cells.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(cells), brute_force(centroids, x))
    np.testing.assert_array_equal(np.asarray(centers), centroids[np.asarray(cells)])


def test_spec_shapes_and_build_from_jax_array() -> None:
    centroids = np.random.default_rng(5).uniform(0, 1, (37, 4)).astype(np.float64)
    spec = CVTSpec(jnp.asarray(centroids, jnp.float32))
    assert (spec.num_cells, spec.descriptor_dim) == (37, 4)
    assert isinstance(spec.num_cells, int) and isinstance(spec.descriptor_dim, int)
    assert spec.centroids.dtype == jnp.float32 and spec.centroids.shape == (37, 4)
    out = _index(spec, jnp.zeros((5, 4)))
    assert out.shape == (5,) and out.dtype == jnp.int32
    with pytest.raises(ValueError):
        _index(spec, jnp.zeros((5, 3)))
    single = CVTSpec(np.ones((1, 2)))
    np.testing.assert_array_equal(np.asarray(_index(single, jnp.zeros((3, 2)))), 0)
    with pytest.raises(ValueError):
        CVTSpec(np.zeros((0, 2)))
    with pytest.raises(ValueError):
        CVTSpec(np.full((3, 2), np.nan))


def _random_case(cells: int, dim: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Centroids in [-1, 1] and queries a bit beyond, seeded by the shapes.

    The same shapes give the same spec, so the tests below share compiled lookups.
    """
    rng = np.random.default_rng(cells * 10 + dim)
    centroids = rng.uniform(-1, 1, (cells, dim)).astype(np.float32)
    return centroids, rng.uniform(-1.2, 1.2, (queries, dim)).astype(np.float32)


# (cells, dim, queries): a bucket grid (D <= 3, C >= 256) and a matmul scan (D > 3).
# Compiling the lookup dominates these tests; scan leaves have data-independent shapes,
# so the scan case reuses a shape test_index_exact_property already compiled.
_CASES = [(300, 2, 400), (9, 5, 32)]


@pytest.mark.parametrize(("cells", "dim", "queries"), _CASES)
def test_constructor_builds_exact_spec(cells: int, dim: int, queries: int) -> None:
    """``CVTSpec(centroids)`` is the one constructor and precomputes the lookup."""
    assert not hasattr(CVTSpec, "create")
    spec = check_exact(*_random_case(cells, dim, queries))
    assert bool(spec.lookup.grid_shape) == (dim <= 3)
    assert (spec.num_cells, spec.descriptor_dim) == (cells, dim)


@pytest.mark.parametrize(("cells", "dim", "queries"), _CASES)
def test_pytree_round_trips_without_rebuilding(
    cells: int, dim: int, queries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flatten/unflatten, jit (in and out), tree_map and device_put reuse the fields."""
    centroids, x = _random_case(cells, dim, queries)
    spec = CVTSpec(centroids)

    def rebuild(*args: object, **kwargs: object) -> None:
        raise AssertionError("the spec was rebuilt from its centroids")

    monkeypatch.setattr(CentroidIndex, "__init__", rebuild)
    monkeypatch.setattr(centroid_index, "build_grid", rebuild)

    leaves, treedef = jax.tree_util.tree_flatten(spec)
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(back) is CVTSpec and back.lookup.grid_shape == spec.lookup.grid_shape
    for name in centroid_index._ARRAY_FIELDS:
        assert getattr(back.lookup, name) is getattr(spec.lookup, name)
    paths = jax.tree_util.tree_leaves_with_path(spec)
    assert ".lookup.centroids" in {jax.tree_util.keystr(path) for path, _ in paths}
    # New CMA-MAE settings keep the built lookup, and travel as static aux data.
    tuned = dataclasses.replace(spec, learning_rate=0.25, threshold_min=-3.0)
    assert tuned.lookup is spec.lookup
    tuned_leaves, tuned_def = jax.tree_util.tree_flatten(tuned)
    assert len(tuned_leaves) == len(leaves) and tuned_def != treedef
    tuned_back = jax.tree_util.tree_unflatten(tuned_def, tuned_leaves)
    assert (tuned_back.learning_rate, tuned_back.threshold_min) == (0.25, -3.0)

    expected = brute_force(centroids, x)
    for other in (
        jax.jit(lambda s: s)(spec),  # traced as an argument, rebuilt from outputs
        jax.tree_util.tree_map(lambda a: a, spec),
        jax.device_put(spec),
    ):
        assert type(other) is CVTSpec and other.lookup.grid_shape == spec.lookup.grid_shape
        assert jax.tree_util.tree_structure(other) == treedef
        # _index traces the spec too; same shapes as above, so no recompilation.
        np.testing.assert_array_equal(np.asarray(_index(other, jnp.asarray(x))), expected)


@pytest.mark.parametrize("shape", [(5,), (0, 2), (3, 0), (2, 3, 4)])
def test_constructor_rejects_bad_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=re.escape(str(shape))):
        CVTSpec(np.zeros(shape, np.float32))


def test_cvt_centroids_shape_bounds_and_determinism() -> None:
    lower, upper = [-1.0, 2.0, 0.0], [1.0, 3.0, 5.0]
    first = cvt_centroids(300, lower, upper, samples=6000, seed=7)
    assert first.shape == (300, 3) and first.dtype == np.float32
    assert np.all(first >= np.asarray(lower)) and np.all(first <= np.asarray(upper))
    assert len(np.unique(first, axis=0)) == 300
    np.testing.assert_array_equal(first, cvt_centroids(300, lower, upper, 6000, 7))
    assert not np.array_equal(first, cvt_centroids(300, lower, upper, 6000, 8))


def test_cvt_centroids_high_dim() -> None:
    """Above 8-D, samples are assigned with CentroidIndex.index instead of a k-d tree."""
    centroids = cvt_centroids(64, [0.0] * 10, [1.0] * 10, samples=2000, seed=1)
    assert centroids.shape == (64, 10)
    assert np.all((centroids >= 0) & (centroids <= 1))


def test_cvt_centroids_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        cvt_centroids(10, [0.0], [1.0], samples=5)
    with pytest.raises(ValueError):
        cvt_centroids(10, [0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        cvt_centroids(10, [0.0], [1.0, 2.0])


def test_cvt_centroids_10k_is_fast() -> None:
    """pyribs's scikit-learn k-means takes ~70 s here; the budget is 10 s."""
    start = time.perf_counter()
    centroids = cvt_centroids(10_000, [0.0, 0.0], [1.0, 1.0], samples=100_000, seed=0)
    assert time.perf_counter() - start < 10
    assert centroids.shape == (10_000, 2)
