"""CVT centroids by Lloyd's k-means on uniform samples of the descriptor box (host, numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from qd.archive.centroid_index import CentroidIndex


def cvt_centroids(
    n: int,
    lower: Sequence[float],
    upper: Sequence[float],
    samples: int = 100_000,
    seed: int = 0,
) -> np.ndarray:
    """Computes CVT centroids with Lloyd's k-means on uniform samples of a box.

    This is what pyribs users get from ``ribs.archives.k_means_centroids`` (the
    ``centroids`` of a ``CVTArchive``) and QDax users from ``compute_cvt_centroids``:
    ``samples`` points drawn uniformly in ``[lower, upper]`` are clustered into ``n``
    clusters, starting from ``n`` distinct random samples, and the cluster means are the
    centroids. Unlike pyribs (scikit-learn k-means, ~70 s for 10k centroids in 2-D),
    this runs at most 20 Lloyd iterations, assigning samples with a k-d tree (D <= 8)
    or with :meth:`CentroidIndex.index` (k-d trees degrade in higher dimensions): about a
    second for 10k centroids in 2-D. Clusters that lose all their samples keep their
    previous centroid.

    Args:
        n: Number of centroids (cells).
        lower: Lower bound of each descriptor dimension, length D.
        upper: Upper bound of each descriptor dimension, length D.
        samples: Number of uniform samples to cluster; at least ``n``.
        seed: Seed of the numpy Generator; the output is a function of the arguments.

    Returns:
        float32 array of shape (n, D); centroids are means of samples, so they lie in
        ``[lower, upper]``.

    Raises:
        ValueError: Bounds of different lengths or not ``lower < upper``, or
            ``samples < n``, or ``n < 1``.
    """
    lower_arr = np.asarray(lower, dtype=np.float64)
    upper_arr = np.asarray(upper, dtype=np.float64)
    if lower_arr.ndim != 1 or lower_arr.shape != upper_arr.shape:
        raise ValueError("lower and upper must be sequences of the same length")
    if not np.all(lower_arr < upper_arr):
        raise ValueError("need lower < upper in every dimension")
    if not 1 <= n <= samples:
        raise ValueError(f"need 1 <= n <= samples, got n={n}, samples={samples}")

    rng = np.random.default_rng(seed)
    points = rng.uniform(lower_arr, upper_arr, size=(samples, lower_arr.size))
    centroids = points[rng.choice(samples, size=n, replace=False)]
    # Stop once no centroid moves more than this; further iterations change little.
    tol = 1e-4 * float(np.max(upper_arr - lower_arr)) / n ** (1 / lower_arr.size)
    for _ in range(20):
        label = _nearest(centroids, points)
        count = np.bincount(label, minlength=n)
        sums = np.stack([np.bincount(label, weights=col, minlength=n) for col in points.T], axis=1)
        moved = np.where(count[:, None] > 0, sums / np.maximum(count, 1)[:, None], centroids)
        shift = float(np.max(np.abs(moved - centroids)))
        centroids = moved
        if shift <= tol:
            break
    return centroids.astype(np.float32)


def _nearest(centroids: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(n, D) centroids, (S, D) points -> (S,) index of each point's nearest centroid."""
    if centroids.shape[1] <= 8:
        from scipy.spatial import (
            cKDTree,
        )  # here: scipy.spatial costs 0.3 s to import, and grids never need it

        return cKDTree(centroids).query(points, workers=-1)[1]
    return np.asarray(_jit_index(CentroidIndex(centroids), points.astype(np.float32)))


_jit_index = jax.jit(CentroidIndex.index)
