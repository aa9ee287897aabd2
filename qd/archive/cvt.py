"""Centroidal Voronoi tessellation (CVT) geometry for the JAX archive.

Two pieces:

* :func:`cvt_centroids` builds the cell centroids once, in numpy, with Lloyd's k-means.
* :class:`CVTSpec` holds the centroids as a JAX pytree and maps descriptors to cells
  with :meth:`CVTSpec.index`, exactly (same answer as a float64 brute-force search) and
  fast on XLA:CPU, inside ``jax.jit``.

Why exactness takes work: the usual float32 expanded-norm trick,
``|x|^2 + |c|^2 - 2 x.c``, loses most of its digits to cancellation once cells are
small, and picks the wrong centroid for about 1% of queries at 100k centroids. Here that
trick (or, for low dimensions, a precomputed bucket grid) only proposes a short list of
candidates that provably contains the nearest centroid, and the winner is picked from
direct differences ``(x - c)^2``. When two candidates are too close to call in float32,
their distances are recomputed in float-float arithmetic (about 47 bits), so the answer
only differs from float64 brute force when the two nearest distances agree to ~1e-13
relative, which is below float64's own rounding of the sum.

Preconditions of the exactness guarantee: finite descriptors and centroids, with
coordinate differences that are either 0 or larger than ~1e-18 in magnitude (XLA:CPU
flushes float32 subnormals to zero, so squares below ~1e-38 vanish), and at most ~1e18.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from scipy.spatial import cKDTree

__all__ = ["CVTSpec", "cvt_centroids"]

# Unit roundoff of float32.
_U = 2.0**-24
# Matmul scores are reduced in blocks of this many centroids (a block min is a fast,
# vectorized reduction on XLA:CPU; an index-of-min over all centroids is not).
_BLOCK = 128
# Score of padding centroids: never within any candidate window.
_FAR = 1e30
# A bucket grid is used for descriptor_dim <= _GRID_MAX_DIM ...
_GRID_MAX_DIM = 3
# ... when no bucket needs more than this many candidates.
_GRID_MAX_WIDTH = 64
# Buckets per centroid.
_GRID_BUCKETS_PER_CELL = 2.0
# At most this many buckets along one axis, so float32 bucket coordinates stay accurate
# to well within _GRID_SLACK.
_GRID_MAX_SIDE = 4096
# Bucket boxes are grown by this fraction of a bucket on every side, which absorbs the
# float32 rounding of a query's bucket coordinate.
_GRID_SLACK = 1e-3
# Queries per chunk of the grid path (measured fastest on XLA:CPU).
_GRID_CHUNK = 1024
# Score entries (queries x centroids) per chunk of the matmul path: 4 MiB of float32,
# which measured fastest, with at least _MATMUL_MIN_CHUNK queries so the matmul stays
# efficient for large C.
_MATMUL_CHUNK_ENTRIES = 1 << 20
_MATMUL_MIN_CHUNK = 32


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
    centroids. Unlike pyribs (scikit-learn k-means, ~70 s for 10k centroids), this runs
    at most 20 Lloyd iterations with a k-d tree assignment, a few seconds at most.
    Clusters that lose all their samples keep their previous centroid.

    Args:
        n: Number of centroids (cells).
        lower: Lower bound of each descriptor dimension, length D.
        upper: Upper bound of each descriptor dimension, length D.
        samples: Number of uniform samples to cluster; at least ``n``.
        seed: Seed of the numpy Generator; the output is a function of the arguments.

    Returns:
        float32 array of shape (n, D), every centroid inside ``[lower, upper]``.

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
        _, label = cKDTree(centroids).query(points, workers=-1)
        count = np.bincount(label, minlength=n)
        sums = np.stack(
            [np.bincount(label, weights=col, minlength=n) for col in points.T], axis=1
        )
        moved = np.where(
            count[:, None] > 0, sums / np.maximum(count, 1)[:, None], centroids
        )
        shift = float(np.max(np.abs(moved - centroids)))
        centroids = moved
        if shift <= tol:
            break
    return centroids.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class CVTSpec:
    """The cells of a CVT archive and an exact nearest-centroid lookup.

    A JAX pytree: pass it to jitted functions as an ordinary argument. Build it with
    :meth:`create`, which also precomputes the lookup structures.

    Attributes:
        centroids: (C, D) float32 centroids; cell ``i`` is the Voronoi cell of row ``i``.
        center: (D,) float32 center of the centroids' bounding box.
        inv_scale: () float32, 1 / half the largest side of that box. Matmul scores are
            computed on ``(x - center) * inv_scale`` for precision; one scale for all
            axes keeps the distance order.
        radius: () float32 upper bound of ``|(c - center) * inv_scale|`` over centroids.
        score_mat: (D + 1, C') float32, C' = C rounded up to a multiple of 128. Column
            ``j`` is ``[-c'_j, |c'_j|^2 / 2]`` for scaled centroid ``c'_j`` (padding
            columns score 1e30), so ``[x', 1] @ score_mat`` is ``|x' - c'|^2 / 2`` up to
            a per-query constant.
        grid_lo: (D,) float32 lower corner of the bucket grid, or None without a grid.
        grid_inv_width: (D,) float32 buckets per unit length along each axis, or None.
        bucket_table: (NB, W, D + 1) float32 candidates of each bucket, or None.
            NB = prod(grid_shape); W is the longest candidate list. Each candidate is
            its coordinates followed by its index (exact in float32, which keeps the
            lookup in fast float reductions), ascending; index C marks padding.
        grid_shape: Buckets along each axis (static); ``()`` when there is no grid.
    """

    centroids: jax.Array
    center: jax.Array
    inv_scale: jax.Array
    radius: jax.Array
    score_mat: jax.Array
    grid_lo: jax.Array | None
    grid_inv_width: jax.Array | None
    bucket_table: jax.Array | None
    grid_shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})

    @classmethod
    def create(cls, centroids: jax.Array | np.ndarray) -> CVTSpec:
        """Builds the spec and its lookup structures (on the host, in float64).

        Args:
            centroids: (C, D) centroids; converted to float32.

        Returns:
            The spec. For D <= 3 it carries a bucket grid unless the centroids are so
            unevenly spread that some bucket would need more than 64 candidates.
        """
        c32 = np.asarray(centroids, dtype=np.float32)
        if c32.ndim != 2 or not 1 <= c32.shape[0] < 2**24 or c32.shape[1] < 1:
            raise ValueError(
                f"centroids must have shape (C, D) with 1 <= C < 2**24, got {c32.shape}"
            )
        if not np.all(np.isfinite(c32)):
            raise ValueError("centroids must be finite")
        c64 = c32.astype(np.float64)
        num_cells, dim = c32.shape

        lo, hi = c64.min(axis=0), c64.max(axis=0)
        center = ((lo + hi) / 2).astype(np.float32)
        half = float(np.max(hi - lo)) / 2
        inv_scale = np.float32(1.0 / half if half > 0 else 1.0)
        scaled = ((c64 - center) * np.float64(inv_scale)).astype(np.float32)
        scaled64 = scaled.astype(np.float64)
        radius = np.float32(np.sqrt(np.max(np.sum(scaled64**2, axis=1))) * (1 + 1e-6))
        padded = -(-num_cells // _BLOCK) * _BLOCK
        score_mat = np.zeros((dim + 1, padded), dtype=np.float32)
        score_mat[:dim, :num_cells] = -scaled.T
        score_mat[dim, :num_cells] = np.sum(scaled64**2, axis=1) / 2
        score_mat[dim, num_cells:] = _FAR

        grid = _build_grid(c64) if dim <= _GRID_MAX_DIM else None
        if grid is None:
            grid_arrays: tuple[jax.Array | None, ...] = (None,) * 3
            grid_shape: tuple[int, ...] = ()
        else:
            grid_lo, grid_inv_width, bucket_index, grid_shape = grid
            bucket_table = np.concatenate(
                [
                    c32[np.minimum(bucket_index, num_cells - 1)],
                    bucket_index[..., None].astype(np.float32),
                ],
                axis=2,
            )
            grid_arrays = tuple(
                map(jnp.asarray, (grid_lo, grid_inv_width, bucket_table))
            )
        return cls(
            jnp.asarray(c32),
            jnp.asarray(center),
            jnp.asarray(inv_scale),
            jnp.asarray(radius),
            jnp.asarray(score_mat),
            *grid_arrays,
            grid_shape=grid_shape,
        )

    @property
    def num_cells(self) -> int:
        """Number of cells C (static)."""
        return self.centroids.shape[0]

    @property
    def descriptor_dim(self) -> int:
        """Descriptor dimension D (static)."""
        return self.centroids.shape[1]

    def index(self, descriptor: jax.Array) -> jax.Array:
        """Maps descriptors to the index of their nearest centroid.

        Exact: the same cell as a float64 brute-force argmin of the squared Euclidean
        distance, lowest index on ties (see the module docstring for preconditions).
        Traceable and jittable; memory is bounded by processing fixed-size chunks.

        Args:
            descriptor: (B, D) descriptors.

        Returns:
            (B,) int32 cell indices in ``[0, C)``.
        """
        x = jnp.asarray(descriptor, dtype=jnp.float32)
        if x.ndim != 2 or x.shape[1] != self.descriptor_dim:
            raise ValueError(
                f"descriptor must have shape (B, {self.descriptor_dim}), got {x.shape}"
            )
        if self.grid_shape:
            return _map_chunks(self._grid_chunk, x, _GRID_CHUNK)
        chunk = max(_MATMUL_MIN_CHUNK, _MATMUL_CHUNK_ENTRIES // self.score_mat.shape[1])
        return _map_chunks(self._matmul_chunk, x, chunk)

    def _grid_chunk(self, x: jax.Array) -> jax.Array:
        """Grid lookup of (b, D) descriptors -> (b,) cells; matmul path if any is off-grid."""
        shape = jnp.asarray(self.grid_shape, dtype=jnp.float32)
        pos = (x - self.grid_lo) * self.grid_inv_width
        on_grid = jnp.all((pos >= -_GRID_SLACK / 2) & (pos <= shape + _GRID_SLACK / 2))
        cell = jnp.clip(jnp.floor(pos), 0, shape - 1).astype(jnp.int32)
        strides = np.cumprod((1,) + self.grid_shape[:0:-1])[::-1].astype(np.int32)
        bucket = jnp.sum(cell * strides, axis=1)
        return lax.cond(
            on_grid,
            lambda: _exact_pick(x, self.bucket_table[bucket], self.num_cells),
            lambda: self._matmul_chunk(x),
        )

    def _matmul_chunk(self, x: jax.Array) -> jax.Array:
        """Matmul candidates + exact pick for (b, D) descriptors -> (b,) cells.

        Scores ``s_j = |c'_j|^2/2 - x'.c'_j`` are within ``err`` of their exact values
        (rounding of x', c', |c'|^2/2 and the (D+1)-term dot product, doubled for
        slack), so every centroid with ``s_j <= min s + 2 err`` is a candidate and no
        other can be nearest. Usually there are one or two; rows with more fall back to
        an exact scan of all centroids.
        """
        b, dim = x.shape
        num_blocks = self.score_mat.shape[1] // _BLOCK
        xs = (x - self.center) * self.inv_scale
        ones = jnp.ones((b, 1), dtype=jnp.float32)
        scores = (jnp.concatenate([xs, ones], axis=1) @ self.score_mat).reshape(
            b, num_blocks, _BLOCK
        )
        block_min = jnp.min(scores, axis=2)
        norm = jnp.sqrt(jnp.sum(xs * xs, axis=1))
        err = (2 * _U) * (
            (dim + 5) * norm * self.radius + (dim + 4) / 2 * self.radius**2
        )
        limit = (jnp.min(block_min, axis=1) + 2 * err)[:, None]

        hit = block_min <= limit
        block_iota = lax.broadcasted_iota(jnp.int32, hit.shape, 1)
        first_block = jnp.min(jnp.where(hit, block_iota, num_blocks), axis=1)
        last_block = jnp.max(jnp.where(hit, block_iota, -1), axis=1)
        first_vals = jnp.take_along_axis(scores, first_block[:, None, None], axis=1)[:, 0]
        last_vals = jnp.take_along_axis(scores, last_block[:, None, None], axis=1)[:, 0]
        first_hit, last_hit = first_vals <= limit, last_vals <= limit
        lane = lax.broadcasted_iota(jnp.int32, first_hit.shape, 1)
        first = first_block * _BLOCK + jnp.min(jnp.where(first_hit, lane, _BLOCK), axis=1)
        last = last_block * _BLOCK + jnp.max(jnp.where(last_hit, lane, -1), axis=1)
        two_blocks = last_block > first_block
        crowded = (jnp.sum(hit, axis=1) > 2) | (
            jnp.sum(first_hit, axis=1) + jnp.where(two_blocks, jnp.sum(last_hit, axis=1), 0)
            > 2
        )

        pair = jnp.stack([first, last], axis=1)
        # A lone candidate appears twice; the second copy becomes padding.
        pair_index = jnp.stack([first, jnp.where(last > first, last, self.num_cells)], 1)
        cand = jnp.concatenate(
            [self.centroids[pair], pair_index[..., None].astype(jnp.float32)], axis=2
        )
        picked = _exact_pick(x, cand, self.num_cells)
        return lax.cond(
            jnp.any(crowded), lambda: self._rescan(x, crowded, picked), lambda: picked
        )

    def _rescan(self, x: jax.Array, crowded: jax.Array, picked: jax.Array) -> jax.Array:
        """Exact scan of all centroids for the crowded rows of (b, D) ``x``; (b,) cells."""
        every = jnp.concatenate(
            [self.centroids, jnp.arange(self.num_cells, dtype=jnp.float32)[:, None]],
            axis=1,
        )[None]

        def row(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            xr, crowded_r, picked_r = args
            return lax.cond(
                crowded_r,
                lambda: _exact_pick(xr[None], every, self.num_cells)[0],
                lambda: picked_r,
            )

        return lax.map(row, (x, crowded, picked))


jax.tree_util.register_dataclass(CVTSpec)


def _map_chunks(
    fn: Callable[[jax.Array], jax.Array], x: jax.Array, chunk: int
) -> jax.Array:
    """Applies ``fn`` ((b, D) -> (b,)) to (B, D) ``x`` in chunks of at most ``chunk`` rows."""
    total = x.shape[0]
    if total <= chunk:
        return fn(x)
    num = -(-total // chunk)
    padded = jnp.pad(x, ((0, num * chunk - total), (0, 0)), mode="edge")
    out = lax.map(fn, padded.reshape(num, chunk, x.shape[1]))
    return out.reshape(-1)[:total]


def _exact_pick(x: jax.Array, cand: jax.Array, num_cells: int) -> jax.Array:
    """Nearest of each query's candidates, exactly, lowest index on ties.

    Args:
        x: (b, D) queries.
        cand: (b, K, D + 1) candidates (coordinates, then index as float32), or
            (1, K, D + 1) shared by all queries; index ``num_cells`` marks padding.
        num_cells: Number of centroids C.

    Returns:
        (b,) int32 index of the nearest candidate. Float32 distances decide when the
        best one is alone within their relative error bound ((D + 2) u, quadrupled);
        otherwise the whole batch is redone in float-float.
    """
    index = cand[..., -1]
    diff = x[:, None, :] - cand[..., :-1]
    dist = jnp.where(index < num_cells, jnp.sum(diff * diff, axis=2), jnp.inf)
    best = jnp.min(dist, axis=1, keepdims=True)
    winner = jnp.min(jnp.where(dist == best, index, num_cells), axis=1)
    tol = 4 * (x.shape[1] + 2) * _U
    close = jnp.sum(dist <= best * (1 + tol) + 2.0**-100, axis=1)
    return lax.cond(
        jnp.all(close == 1),
        lambda: winner.astype(jnp.int32),
        lambda: _float_float_pick(x, cand, num_cells),
    )


def _float_float_pick(x: jax.Array, cand: jax.Array, num_cells: int) -> jax.Array:
    """Like :func:`_exact_pick` but comparing float-float distances (~47 bits).

    ``x - c`` is split exactly into ``s + e`` (TwoSum); ``s^2`` is summed exactly from
    12-bit halves of ``s``; ``2 s e`` adds ~2^-24 relative and its rounding ~2^-47;
    ``e^2`` (< 2^-48 relative) is dropped. All terms are summed in float-float.
    """
    index = cand[..., -1]
    neg = -jnp.broadcast_to(cand[..., :-1], (x.shape[0],) + cand.shape[1:2] + x.shape[1:])
    xb = jnp.broadcast_to(x[:, None, :], neg.shape)
    s = xb + neg
    back = s - xb
    e = (xb - (s - back)) + (neg - back)
    s_hi = lax.bitcast_convert_type(
        lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32
    )
    s_lo = s - s_hi
    terms = jnp.concatenate(
        [s_hi * s_hi, 2 * s_hi * s_lo, s_lo * s_lo, 2 * s * e], axis=2
    )
    hi, lo = terms, jnp.zeros_like(terms)
    while hi.shape[2] > 1:
        if hi.shape[2] % 2:
            hi = jnp.pad(hi, ((0, 0), (0, 0), (0, 1)))
            lo = jnp.pad(lo, ((0, 0), (0, 0), (0, 1)))
        half = hi.shape[2] // 2
        hi, lo = _ff_add(hi[..., :half], lo[..., :half], hi[..., half:], lo[..., half:])
    valid = index < num_cells
    hi = jnp.where(valid, hi[..., 0], jnp.inf)
    lo = jnp.where(valid, lo[..., 0], jnp.inf)

    best_hi = jnp.min(hi, axis=1, keepdims=True)
    on_hi = hi == best_hi
    best_lo = jnp.min(jnp.where(on_hi, lo, jnp.inf), axis=1, keepdims=True)
    tie = on_hi & (lo == best_lo)
    return jnp.min(jnp.where(tie, index, num_cells), axis=1).astype(jnp.int32)


def _ff_add(
    a_hi: jax.Array, a_lo: jax.Array, b_hi: jax.Array, b_lo: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Float-float sum of same-shape (hi, lo) pairs, renormalized so hi = fl(hi + lo)."""
    s = a_hi + b_hi
    back = s - a_hi
    e = (a_hi - (s - back)) + (b_hi - back) + (a_lo + b_lo)
    hi = s + e
    return hi, e - (hi - s)


def _build_grid(
    c64: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]] | None:
    """Bucket grid whose buckets list every centroid that can be nearest inside them.

    Lists are computed in float64 on bucket boxes grown by _GRID_SLACK and only drop
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
    half = (1 + 2 * _GRID_SLACK) * step / 2
    tree = cKDTree(c64)
    rows = [
        _bucket_lists(tree, c64, grid_lo + (block + 0.5) * step, half)
        for block in np.array_split(corners, -(-len(corners) // 32768))
    ]
    width_max = max(r.shape[1] for r in rows)
    if width_max > _GRID_MAX_WIDTH:
        return None
    bucket_index = np.concatenate(
        [
            np.pad(r, ((0, 0), (0, width_max - r.shape[1])), constant_values=num_cells)
            for r in rows
        ]
    ).astype(np.int32)
    return grid_lo, grid_inv_width, bucket_index, tuple(int(g) for g in shape)


def _bucket_lists(
    tree: cKDTree, c64: np.ndarray, mid: np.ndarray, half: np.ndarray
) -> np.ndarray:
    """Lists the centroids that may be nearest somewhere in boxes ``mid +- half``.

    Two float64 filters, each keeping a superset of the possible winners:

    * The nearest centroid of any point of box Q is within ``R = maxdist(c_i, Q)`` for
      any i (taken as the best of the 16 centroids nearest to the center), so only
      centroids with ``mindist(c_j, Q) <= R`` are kept. They lie within ``R + |half|``
      of the center: they are found among the 16 nearest centroids, doubling the count
      for boxes whose ball holds more.
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
        (n, W) ascending centroid indices, padded with C; W is the longest list.
    """
    num_cells = c64.shape[0]
    num = len(mid)
    k = min(num_cells, 16)
    pending = np.arange(num)
    pair_box, pair_cand = [], []
    while True:
        dist, idx = tree.query(mid[pending], k=k, workers=-1)
        dist, idx = dist.reshape(len(pending), k), idx.reshape(len(pending), k)
        offset = np.abs(c64[idx] - mid[pending, None])
        if len(pending) == num:
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
