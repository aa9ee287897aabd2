"""Exact nearest-centroid lookup for CVT archives: :class:`CentroidIndex`.

A :class:`CentroidIndex` holds (C, D) centroids and lookup tables as a JAX pytree and maps
descriptors to the index of their nearest centroid with :meth:`CentroidIndex.index`,
exactly (same answer as a float64 brute-force search) and fast on XLA:CPU, inside
``jax.jit``. :class:`qd.archive.cvt.CVTSpec` (the archive spec) holds one.

Why exactness takes work: the usual float32 expanded-norm trick,
``|x|^2 + |c|^2 - 2 x.c``, loses most of its digits to cancellation once cells are
small and picks the wrong centroid for ~1% of queries at 100k centroids in [0, 1]^2
(measured: 188 of 20k). Here candidates come from a precomputed bucket grid (D <= 3)
or a scan of all centroids (direct ``(x - c)^2`` for D <= 3, that matmul trick for
D > 3), keeping every centroid within a rigorous error bound of the best score, and the
winner is picked from direct differences ``(x - c)^2``. The rare queries where that is
not conclusive (two candidates within float32 error, a crowded window, a query off the
grid) are resolved among all centroids, in float-float arithmetic (about 47 bits) when
float32 cannot separate the nearest two. So the answer only differs from float64 brute
force when the two nearest distances agree to ~1e-13 relative, near float64's own
rounding of the sum.

Preconditions of the exactness guarantee: finite descriptors and centroids of magnitude
below ~1e18, and no query within ~1e-12 of two distinct centroids at once (XLA:CPU
flushes float32 subnormals to zero, which limits precision for tiny distances).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qd.archive.bucket_grid import GRID_SLACK, build_grid

# Unit roundoff of float32.
_U = 2.0**-24
# Scan scores are reduced in blocks of this many centroids.
_BLOCK = 128
# Padding: a matmul score or a coordinate that puts a centroid out of every window.
_FAR = 1e30
# Up to this dimension, scans sum (x - c)^2 directly (cheap, and precise enough to
# leave ~1 candidate per query), and a bucket grid is built when there are at least
# _GRID_MIN_CELLS centroids (below, a scan is within ~0.2 ms per 1024 queries of the
# grid, and its jit signature depends only on C and D, not on the data) ...
_DIRECT_MAX_DIM = 3
_GRID_MIN_CELLS = 256
# Queries per chunk of the grid path (measured fastest on XLA:CPU).
_GRID_CHUNK = 1024
# Score entries (queries x centroids) per chunk of a scan: 4 MiB of float32, which
# measured fastest, with at least _SCAN_MIN_CHUNK queries so the matmul stays efficient
# for large C.
_SCAN_CHUNK_ENTRIES = 1 << 20
_SCAN_MIN_CHUNK = 32


@dataclasses.dataclass(frozen=True, init=False)
class CentroidIndex:
    """Centroids and an exact nearest-centroid lookup over them (the cells of a CVT archive).

    Build it with ``CentroidIndex(centroids)``, which validates the centroids and precomputes
    the lookup structures (on the host, once). It is a JAX pytree: pass it to jitted
    functions as an ordinary argument (its arrays are traced, ``grid_shape`` is static),
    or through ``tree_map`` and ``device_put``. Rebuilding it from its leaves does not
    rerun that precomputation (see :func:`_unflatten`).

    Lookup paths, both ending in a float32 pick among a few candidates:

    * Bucket grid (D <= 3, C >= 256): a query's bucket lists every centroid that can be
      nearest in it.
    * Scan of all centroids otherwise: scores are ``(x - c)^2`` summed directly for
      D <= 3 and the matmul ``|c'|^2 / 2 - x'.c'`` for D > 3 (on coordinates centered
      and scaled by the centroids' bounding box, for precision). Candidates are the
      centroids whose score is within the score's rigorous error bound of the best.

    Queries whose pick is not conclusive (a near-tie, more than two scan candidates,
    or off the grid) are resolved one by one among all centroids.

    Attributes:
        centroids: (C, D) float32 centroids; cell ``i`` is the Voronoi cell of row ``i``.
        center: (D,) float32 center of the centroids' bounding box; None for D <= 3.
        inv_scale: () float32, 1 / half the largest side of that box (one scale for all
            axes keeps the distance order); None for D <= 3.
        radius: () float32 upper bound of ``|c'|`` over scaled centroids
            ``c' = (c - center) * inv_scale``; None for D <= 3.
        score_mat: (D + 1, C') float32, C' = C rounded up to a multiple of 128; column
            ``j`` is ``[-c'_j, |c'_j|^2 / 2]`` (padding columns score 1e30), so
            ``[x', 1] @ score_mat`` is ``|x' - c'|^2 / 2`` up to a per-query constant;
            None for D <= 3.
        columns: (D, C') float32 transposed centroids for direct scans (D <= 3), padded
            with 1e30 (whose scores overflow to inf); None for D > 3.
        grid_lo: (D,) float32 lower corner of the bucket grid, or None without a grid.
        grid_inv_width: (D,) float32 buckets per unit length along each axis, or None.
        bucket_table: (NB, W, D + 1) float32 candidates of each bucket, or None.
            NB = prod(grid_shape); W is the longest candidate list. Each candidate is
            its coordinates followed by its index (exact in float32, which keeps the
            lookup in fast float reductions), ascending; index C marks padding.
        grid_shape: Buckets along each axis (static); ``()`` when there is no grid.
    """

    centroids: jax.Array
    center: jax.Array | None
    inv_scale: jax.Array | None
    radius: jax.Array | None
    score_mat: jax.Array | None
    columns: jax.Array | None
    grid_lo: jax.Array | None
    grid_inv_width: jax.Array | None
    bucket_table: jax.Array | None
    grid_shape: tuple[int, ...]

    def __init__(self, centroids: jax.Array | np.ndarray) -> None:
        """Builds the index and its lookup structures (on the host, in float64).

        For D <= 3 and C >= 256 the index carries a bucket grid unless the centroids are
        so unevenly spread that some bucket would need more than 64 candidates.

        Args:
            centroids: (C, D) centroids; converted to float32.

        Raises:
            ValueError: ``centroids`` is not (C, D) with 1 <= C < 2**24 and D >= 1
                (the message names the shape), or has a non-finite entry.
        """
        c32 = np.asarray(centroids, dtype=np.float32)
        if c32.ndim != 2 or not 1 <= c32.shape[0] < 2**24 or c32.shape[1] < 1:
            raise ValueError(f"centroids must have shape (C, D) with 1 <= C < 2**24, got {c32.shape}")
        if not np.all(np.isfinite(c32)):
            raise ValueError("centroids must be finite")
        fields: dict[str, jax.Array | None] = dict.fromkeys(_ARRAY_FIELDS)
        fields["centroids"] = jnp.asarray(c32)
        if c32.shape[1] <= _DIRECT_MAX_DIM:
            fields.update(_direct_tables(c32))
        else:
            fields.update(_matmul_tables(c32))
        grid = _grid_tables(c32)
        # Frozen dataclass: fields are set past its __setattr__, as dataclasses do.
        for name, value in {**fields, **grid}.items():
            object.__setattr__(self, name, value)

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
            raise ValueError(f"descriptor must have shape (B, {self.descriptor_dim}), got {x.shape}")
        if self.grid_shape:
            return _map_chunks(self._grid_chunk, x, _GRID_CHUNK)
        return self._scan(x)

    def _scan(self, x: jax.Array) -> jax.Array:
        """Scan path for (b, D) descriptors -> (b,) cells, in chunks of bounded size."""
        chunk = max(_SCAN_MIN_CHUNK, _SCAN_CHUNK_ENTRIES // _padded(self.num_cells))
        return _map_chunks(self._scan_chunk, x, chunk)

    def _grid_chunk(self, x: jax.Array) -> jax.Array:
        """Grid lookup of (b, D) descriptors -> (b,) cells.

        Off-grid queries (clamped to an edge bucket, whose list does not cover them)
        are resolved like near-ties, by an exact pick among all centroids.
        """
        shape = jnp.asarray(self.grid_shape, dtype=jnp.float32)
        pos = (x - self.grid_lo) * self.grid_inv_width
        on_grid = jnp.all((pos >= -GRID_SLACK / 2) & (pos <= shape + GRID_SLACK / 2), 1)
        cell = jnp.clip(jnp.floor(pos), 0, shape - 1).astype(jnp.int32)
        strides = np.cumprod((1, *self.grid_shape[:0:-1]))[::-1].astype(np.int32)
        bucket = jnp.sum(cell * strides, axis=1)
        winner, clear = _pick(x, self.bucket_table[bucket], self.num_cells)
        return self._resolve(x, winner, clear & on_grid)

    def _scores(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Scores of all centroids for (b, D) ``x`` and the candidate threshold.

        Returns:
            (b, C') scores (padding scores are inf or ~1e30) and (b, 1) limits: every
            centroid scoring above its row's limit is provably farther than another.
            Direct scores have relative error <= (D + 2) u; matmul scores are within
            ``err`` of their exact value (rounding of x', c', |c'|^2 / 2 and the
            (D + 1)-term dot product, doubled for slack).
        """
        b, dim = x.shape
        if dim <= _DIRECT_MAX_DIM:
            # One (b, C') array per axis keeps the work vectorized along centroids.
            scores = sum((x[:, d, None] - self.columns[d]) ** 2 for d in range(dim))
            best = jnp.min(scores, axis=1, keepdims=True)
            return scores, best * (1 + _pick_tol(dim)) + 2.0**-100
        xs = (x - self.center) * self.inv_scale
        ones = jnp.ones((b, 1), dtype=jnp.float32)
        scores = jnp.concatenate([xs, ones], axis=1) @ self.score_mat
        norm = jnp.sqrt(jnp.sum(xs * xs, axis=1, keepdims=True))
        err = (2 * _U) * ((dim + 5) * norm * self.radius + (dim + 4) / 2 * self.radius**2)
        return scores, jnp.min(scores, axis=1, keepdims=True) + 2 * err

    def _scan_chunk(self, x: jax.Array) -> jax.Array:
        """Scan of all centroids + exact pick for (b, D) descriptors -> (b,) cells.

        Usually one or two centroids score within the limit; they are found from
        128-wide block minima (a fast reduction on XLA:CPU, unlike an index-of-min over
        all centroids). Rows with more candidates fall back to an exact pick among all
        centroids.
        """
        b = x.shape[0]
        scores, limit = self._scores(x)
        num_blocks = scores.shape[1] // _BLOCK
        scores = scores.reshape(b, num_blocks, _BLOCK)
        hit = jnp.min(scores, axis=2) <= limit
        block_iota = lax.broadcasted_iota(jnp.int32, hit.shape, 1)
        first_block = jnp.min(jnp.where(hit, block_iota, num_blocks), axis=1)
        last_block = jnp.max(jnp.where(hit, block_iota, -1), axis=1)
        rows = jnp.arange(b)
        first_vals, last_vals = scores[rows, first_block], scores[rows, last_block]
        first_hit, last_hit = first_vals <= limit, last_vals <= limit
        lane = lax.broadcasted_iota(jnp.int32, first_hit.shape, 1)
        first = first_block * _BLOCK + jnp.min(jnp.where(first_hit, lane, _BLOCK), axis=1)
        last = last_block * _BLOCK + jnp.max(jnp.where(last_hit, lane, -1), axis=1)
        two_blocks = last_block > first_block
        crowded = (jnp.sum(hit, axis=1) > 2) | (
            jnp.sum(first_hit, axis=1) + jnp.where(two_blocks, jnp.sum(last_hit, axis=1), 0) > 2
        )

        pair = jnp.stack([first, last], axis=1)
        # A lone candidate appears twice; the second copy becomes padding.
        pair_index = jnp.stack([first, jnp.where(last > first, last, self.num_cells)], 1)
        cand = jnp.concatenate([self.centroids[pair], pair_index[..., None].astype(jnp.float32)], axis=2)
        winner, clear = _pick(x, cand, self.num_cells)
        return self._resolve(x, winner, clear & ~crowded)

    def _resolve(self, x: jax.Array, winner: jax.Array, clear: jax.Array) -> jax.Array:
        """(b,) cells: ``winner`` where ``clear``, else an exact pick among all centroids.

        The rare exhaustive path is compiled once and kept small: XLA:CPU pays per
        operation of a conditional's branches on every call, taken or not.
        """

        def row(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            xr, winner_r, clear_r = args
            return lax.cond(clear_r, lambda: winner_r, lambda: self._exhaustive(xr))

        return lax.cond(
            jnp.all(clear),
            lambda: winner,
            lambda: lax.map(row, (x, winner, clear)),
        )

    def _exhaustive(self, xr: jax.Array) -> jax.Array:
        """Exact nearest centroid of one (D,) query among all centroids; () int32."""
        if self.columns is None:
            dist = jnp.sum((xr - self.centroids) ** 2, axis=1)
        else:
            # One (C',) array per axis keeps the work vectorized along centroids.
            dist = sum((xr[d] - self.columns[d]) ** 2 for d in range(xr.shape[0]))
        best = jnp.min(dist)
        iota = lax.iota(jnp.int32, dist.shape[0])
        winner = jnp.min(jnp.where(dist == best, iota, self.num_cells))
        close = jnp.sum(dist <= best * (1 + _pick_tol(xr.shape[0])) + 2.0**-100)

        return lax.cond(close == 1, lambda: winner, lambda: _float_float_nearest(xr, self.centroids))


# The traced fields, in pytree leaf order; grid_shape is the static aux data.
_ARRAY_FIELDS = tuple(f.name for f in dataclasses.fields(CentroidIndex) if f.name != "grid_shape")


def _flatten_with_keys(
    index: CentroidIndex,
) -> tuple[list[tuple[jax.tree_util.GetAttrKey, jax.Array | None]], tuple[int, ...]]:
    """Leaves keyed by attribute name (as register_dataclass did), aux ``grid_shape``."""
    return [
        (jax.tree_util.GetAttrKey(name), getattr(index, name)) for name in _ARRAY_FIELDS
    ], index.grid_shape


def _flatten(index: CentroidIndex) -> tuple[list[jax.Array | None], tuple[int, ...]]:
    """The array fields (None ones are empty subtrees) and the static ``grid_shape``."""
    return [getattr(index, name) for name in _ARRAY_FIELDS], index.grid_shape


def _unflatten(grid_shape: tuple[int, ...], children: Sequence[object]) -> CentroidIndex:
    """Rebuilds an index from its fields without calling ``__init__``.

    ``__init__`` takes only centroids and recomputes everything from them on the host,
    which would be slow, and impossible on tracers; JAX unflattens on every jit call
    and tree_map, with leaves that may be tracers or other placeholders, so the fields
    are set as they come.
    """
    index = object.__new__(CentroidIndex)
    for name, value in zip(_ARRAY_FIELDS, children, strict=True):
        object.__setattr__(index, name, value)
    object.__setattr__(index, "grid_shape", grid_shape)
    return index


jax.tree_util.register_pytree_with_keys(CentroidIndex, _flatten_with_keys, _unflatten, _flatten)


def _padded(num_cells: int) -> int:
    """C rounded up to a multiple of _BLOCK."""
    return -(-num_cells // _BLOCK) * _BLOCK


def _map_chunks(fn: Callable[[jax.Array], jax.Array], x: jax.Array, chunk: int) -> jax.Array:
    """Applies ``fn`` ((b, D) -> (b,)) to (B, D) ``x`` in chunks of at most ``chunk`` rows."""
    total = x.shape[0]
    if total <= chunk:
        return fn(x)
    num = -(-total // chunk)
    padded = jnp.pad(x, ((0, num * chunk - total), (0, 0)), mode="edge")
    out = lax.map(fn, padded.reshape(num, chunk, x.shape[1]))
    return out.reshape(-1)[:total]


def _pick_tol(dim: int) -> float:
    """Relative error bound of float32 ``sum((x - c)^2)``, (D + 2) u, quadrupled."""
    return 4 * (dim + 2) * _U


def _pick(x: jax.Array, cand: jax.Array, num_cells: int) -> tuple[jax.Array, jax.Array]:
    """Nearest of each query's candidates by float32 distance, and whether it is sure.

    Args:
        x: (b, D) queries.
        cand: (b, K, D + 1) candidates (coordinates, then index as float32); index
            ``num_cells`` marks padding.
        num_cells: Number of centroids C.

    Returns:
        (b,) int32 index of the nearest candidate (lowest on ties) and (b,) bool,
        True when no other candidate is within the distances' error bound, so the
        index is exact.
    """
    index = cand[..., -1]
    diff = x[:, None, :] - cand[..., :-1]
    dist = jnp.where(index < num_cells, jnp.sum(diff * diff, axis=2), jnp.inf)
    best = jnp.min(dist, axis=1, keepdims=True)
    winner = jnp.min(jnp.where(dist == best, index, num_cells), axis=1)
    close = jnp.sum(dist <= best * (1 + _pick_tol(x.shape[1])) + 2.0**-100, axis=1)
    return winner.astype(jnp.int32), close == 1


def _float_float_nearest(xr: jax.Array, centroids: jax.Array) -> jax.Array:
    """Nearest of (C, D) centroids to a (D,) query by float-float distance; () int32.

    Per coordinate, ``x - c`` is split exactly into ``s + e`` (TwoSum); ``s^2`` is the
    exact sum of products of 12-bit halves of ``s``; ``2 s e`` adds ~2^-24 relative
    (its rounding ~2^-47); ``e^2`` (< 2^-48 relative) is dropped. All terms are
    accumulated in float-float (TwoSum again), so distances carry ~47 bits and are
    compared as (hi, lo) pairs, lowest index on ties.
    """

    def axis(carry: tuple[jax.Array, jax.Array], xc: tuple[jax.Array, jax.Array]):
        hi, lo = carry
        s, e = _two_sum(xc[0], -xc[1])
        s_hi = lax.bitcast_convert_type(
            lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFFFFF000),
            jnp.float32,
        )
        s_lo = s - s_hi
        for term in (s_hi * s_hi, 2 * s_hi * s_lo, s_lo * s_lo, 2 * s * e):
            hi, err = _two_sum(hi, term)
            lo = lo + err
        return (hi, lo), None

    # A scan over the axes, not a Python loop: unrolled, a 384-D lookup takes minutes to compile.
    zeros = jnp.zeros(centroids.shape[0], dtype=jnp.float32)
    (hi, lo), _ = lax.scan(axis, (zeros, zeros), (xr, centroids.T))
    hi, lo = _two_sum(hi, lo)
    on_hi = hi == jnp.min(hi)
    best_lo = jnp.min(jnp.where(on_hi, lo, jnp.inf))
    iota = lax.iota(jnp.int32, centroids.shape[0])
    return jnp.min(jnp.where(on_hi & (lo == best_lo), iota, centroids.shape[0]))


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Knuth's TwoSum: ``s = fl(a + b)`` and the exact rounding error, ``a + b = s + e``."""
    s = a + b
    back = s - a
    return s, (a - (s - back)) + (b - back)


def _direct_tables(c32: np.ndarray) -> dict[str, jax.Array]:
    """``columns`` of a direct scan (D <= 3): the transposed centroids, padded with _FAR."""
    num_cells, dim = c32.shape
    columns = np.full((dim, _padded(num_cells)), _FAR, dtype=np.float32)
    columns[:, :num_cells] = c32.T
    return {"columns": jnp.asarray(columns)}


def _matmul_tables(c32: np.ndarray) -> dict[str, jax.Array]:
    """``center``, ``inv_scale``, ``radius`` and ``score_mat`` of a matmul scan (D > 3),
    computed in float64 from the float32 centroids."""
    num_cells, dim = c32.shape
    c64 = c32.astype(np.float64)
    lo, hi = c64.min(axis=0), c64.max(axis=0)
    center = ((lo + hi) / 2).astype(np.float32)
    half = float(np.max(hi - lo)) / 2
    inv_scale = np.float32(1.0 / half if half > 0 else 1.0)
    scaled = ((c64 - center) * np.float64(inv_scale)).astype(np.float32)
    scaled_sq = np.sum(scaled.astype(np.float64) ** 2, axis=1)
    score_mat = np.zeros((dim + 1, _padded(num_cells)), dtype=np.float32)
    score_mat[:dim, :num_cells] = -scaled.T
    score_mat[dim, :num_cells] = scaled_sq / 2
    score_mat[dim, num_cells:] = _FAR
    return {
        "center": jnp.asarray(center),
        "inv_scale": jnp.asarray(inv_scale),
        "radius": jnp.float32(np.sqrt(np.max(scaled_sq)) * (1 + 1e-6)),
        "score_mat": jnp.asarray(score_mat),
    }


def _grid_tables(c32: np.ndarray) -> dict[str, object]:
    """``grid_lo``, ``grid_inv_width``, ``bucket_table`` and ``grid_shape`` of the bucket
    grid (D <= 3, C >= _GRID_MIN_CELLS, evenly enough spread), else only ``grid_shape = ()``."""
    num_cells, dim = c32.shape
    grid = None
    if dim <= _DIRECT_MAX_DIM and num_cells >= _GRID_MIN_CELLS:
        grid = build_grid(c32.astype(np.float64))
    if grid is None:
        return {"grid_shape": ()}
    grid_lo, grid_inv_width, bucket_index, grid_shape = grid
    bucket_table = np.concatenate(
        [c32[np.minimum(bucket_index, num_cells - 1)], bucket_index[..., None].astype(np.float32)],
        axis=2,
    )
    return {
        "grid_lo": jnp.asarray(grid_lo),
        "grid_inv_width": jnp.asarray(grid_inv_width),
        "bucket_table": jnp.asarray(bucket_table),
        "grid_shape": grid_shape,
    }
