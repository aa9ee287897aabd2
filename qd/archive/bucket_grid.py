"""The bucket grid of a low-dimensional nearest-centroid index, built once on the host.

For D <= 3 and enough centroids, :class:`qd.archive.centroid_index.CentroidIndex` finds a
query's candidates in the bucket of a regular grid holding it, instead of scanning all
centroids. This module computes, in float64, which centroids each bucket must list: every
one that can be nearest somewhere in the bucket (grown by :data:`GRID_SLACK`), so the
lookup stays exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ... when no bucket needs more than this many candidates.
_GRID_MAX_WIDTH = 64
# Buckets per centroid.
_GRID_BUCKETS_PER_CELL = 2.0
# At most this many buckets along one axis, so float32 bucket coordinates stay accurate
# to well within GRID_SLACK.
_GRID_MAX_SIDE = 4096
# Bucket boxes are grown by this fraction of a bucket on every side, which absorbs the
# float32 rounding of a query's bucket coordinate.
GRID_SLACK = 1e-3


def build_grid(
    c64: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]] | None:
    """Bucket grid whose buckets list every centroid that can be nearest inside them.

    Lists are computed in float64 on bucket boxes grown by GRID_SLACK and only drop
    centroids that are provably farther than another one everywhere in the box. The grid
    covers the centroids' bounding box plus about one centroid spacing, so descriptors
    between the outer centroids and the archive bounds stay on the grid.

    Args:
        c64: (C, D) centroids (float32 values, as float64).

    Returns:
        ``(grid_lo, grid_inv_width, bucket_index, grid_shape)`` with shapes (D,), (D,),
        (NB, W) (ascending indices, padded with C), or None if W would exceed
        _GRID_MAX_WIDTH.
    """
    num_cells, dim = c64.shape
    lo, hi = c64.min(axis=0), c64.max(axis=0)
    span = float(np.max(hi - lo)) or max(1.0, float(np.max(np.abs(lo))))
    margin = span / num_cells ** (1 / dim)
    width = (hi - lo) + 2 * margin
    side = (np.prod(width) / (_GRID_BUCKETS_PER_CELL * num_cells)) ** (1 / dim)
    shape = np.clip(np.ceil(width / side), 1, _GRID_MAX_SIDE).astype(np.int64)
    grid_lo = (lo - margin).astype(np.float32)
    grid_inv_width = (shape / width).astype(np.float32)

    # Bucket boxes in float64, from the float32 constants the lookup uses.
    axes = [np.arange(g, dtype=np.float64) for g in shape]
    corners = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, dim)
    step = 1.0 / grid_inv_width.astype(np.float64)
    half = (1 + 2 * GRID_SLACK) * step / 2
    from scipy.spatial import cKDTree

    tree = cKDTree(c64)
    rows = []
    for block in np.array_split(corners, -(-len(corners) // 32768)):
        block_rows = _bucket_lists(tree, c64, grid_lo + (block + 0.5) * step, half)
        if block_rows is None or block_rows.shape[1] > _GRID_MAX_WIDTH:
            return None
        rows.append(block_rows)
    width_max = max(r.shape[1] for r in rows)
    bucket_index = np.concatenate(
        [np.pad(r, ((0, 0), (0, width_max - r.shape[1])), constant_values=num_cells) for r in rows]
    ).astype(np.int32)
    return grid_lo, grid_inv_width, bucket_index, tuple(int(g) for g in shape)


def _bucket_lists(tree: Any, c64: np.ndarray, mid: np.ndarray, half: np.ndarray) -> np.ndarray | None:
    """Lists the centroids that may be nearest somewhere in boxes ``mid +- half``.

    Two float64 filters, each keeping a superset of the possible winners:

    * The nearest centroid of any point of box Q is within ``R = maxdist(c_i, Q)`` for
      any i (taken as the best of the 16 centroids nearest to the center), so only
      centroids with ``mindist(c_j, Q) <= R`` are kept. They lie within ``R + |half|``
      of the center: they are found among the 16 nearest centroids, doubling the count
      for boxes whose ball holds more (giving up beyond 1024: a grid would not pay).
    * ``c_i`` beats ``c_j`` everywhere in Q when ``|p - c_j|^2 - |p - c_i|^2``, linear
      in p, is positive at its minimum over Q, which in box-centered coordinates is
      ``|c_j|^2 - |c_i|^2 - 2 sum_d |c_i - c_j|_d half_d``. Candidates beaten by one
      of the 8 centroids nearest to the center, by a 1e-9 relative margin (far above
      float64 rounding), are dropped.

    Args:
        tree: k-d tree of ``c64``.
        c64: (C, D) centroids.
        mid: (n, D) box centers.
        half: (D,) half widths of the boxes.

    Returns:
        (n, W) ascending centroid indices, padded with C; W is the longest list. None
        if some ball holds more than 1024 centroids.
    """
    num_cells = c64.shape[0]
    num = len(mid)
    k = min(num_cells, 16)
    pending = np.arange(num)
    pair_box, pair_cand = [], []
    rivals = None
    while True:
        dist, idx = tree.query(mid[pending], k=k, workers=-1)
        dist, idx = dist.reshape(len(pending), k), idx.reshape(len(pending), k)
        offset = np.abs(c64[idx] - mid[pending, None])
        if rivals is None:  # First pass, over all boxes.
            rivals = idx[:, :8]
            max_sq = np.min(np.sum((offset + half) ** 2, axis=2), axis=1) * (1 + 1e-9)
            reach = (np.sqrt(max_sq) + np.linalg.norm(half)) * (1 + 1e-9)
        more = (dist[:, -1] <= reach[pending]) & (k < num_cells)
        min_sq = np.sum(np.maximum(offset - half, 0) ** 2, axis=2)
        box, slot = np.nonzero((min_sq <= max_sq[pending, None]) & ~more[:, None])
        pair_box.append(pending[box])
        pair_cand.append(idx[box, slot])
        if not more.any():
            break
        if k >= 1024:
            return None
        pending, k = pending[more], min(num_cells, 2 * k)
    box, cand = np.concatenate(pair_box), np.concatenate(pair_cand)

    local = c64[cand] - mid[box]
    rival = c64[rivals[box]] - mid[box, None]
    sq, rival_sq = np.sum(local**2, axis=1), np.sum(rival**2, axis=2)
    margin = sq[:, None] - rival_sq
    for d in range(c64.shape[1]):
        margin -= (2 * half[d]) * np.abs(rival[:, :, d] - local[:, None, d])
    scale = (np.sqrt(np.maximum(sq, rival_sq.max(axis=1))) + np.linalg.norm(half)) ** 2
    alive = ~np.any(margin > 1e-9 * scale[:, None], axis=1)
    box, cand = box[alive], cand[alive]

    order = np.lexsort((cand, box))
    box, cand = box[order], cand[order]
    count = np.bincount(box, minlength=num)
    slot = np.arange(len(box)) - (np.cumsum(count) - count)[box]
    rows = np.full((num, count.max()), num_cells, dtype=np.int64)
    rows[box, slot] = cand
    return rows
