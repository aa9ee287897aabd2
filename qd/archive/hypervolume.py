"""Hypervolume: how much of objective space a front covers, exact up to three objectives.

A front of non-dominated elites has no single best to report, so a run is read by the
volume its members dominate above a reference point (Zitzler and Thiele 1998): the
measure of the union of the boxes ``[reference, point]``. It grows when a member improves
on any objective or a new trade-off appears, which is what a Pareto run is for. Summed
over cells it is MOME's "MOQD score" (Pierrot et al. 2022).

Everything here is maximised, as in the archive (:mod:`qd.archive.pareto`): ``points``
f[N, M] and ``reference`` f[M] are in the space :func:`qd.task.objective_matrix` makes,
where a "min" objective is negated. A point that does not dominate the reference on every
objective covers nothing there and adds nothing; non-finite values (an empty slot's
-inf, a missing objective's NaN) count as absent.

Exact algorithms: one objective is a maximum; two are a sweep over the points sorted on
the first objective (O(N log N)); three are slices along the third objective, each a
two-objective sweep (O(N^2 log N)). More than three is refused: exact algorithms grow
exponentially with M and an estimate would make curves of different runs incomparable.
"""

from __future__ import annotations

import numpy as np

from qd.contract import ConfigError

MAX_OBJECTIVES = 3
_CHUNK = 1 << 22  # values per temporary of contributions (32 MB of f64)
REFERENCE_MARGIN = 0.1  # a derived reference sits this fraction of the range below the worst value


def hypervolume(points: np.ndarray, reference: np.ndarray) -> float:
    """The volume ``points`` f[N, M] dominate above ``reference`` f[M] (maximised)."""
    return float(_volumes(_boxes(points, reference)[None])[0])


def contributions(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """f64[N]: each point's exclusive contribution, the volume lost without it.

    The volume lost is the point's own box less the part the others cover, and the
    others cover of it exactly the union of their boxes clipped to it (``min(q, p)``):
    one hypervolume per point, computed in row chunks that keep the temporary near 32 MB.
    A dominated point and each copy of a repeated point contribute 0 (another member
    still covers their box), which makes the contribution a fair weight for choosing
    parents: only a member that holds a trade-off no other holds gets one.
    """
    boxes = _boxes(points, reference)
    n, m = boxes.shape
    others = ~np.eye(n, dtype=bool)
    out = np.zeros(n)
    step = max(1, _CHUNK // max(n * m, 1))
    for start in range(0, n, step):
        own = boxes[start : start + step]
        clipped = np.where(others[start : start + step, :, None], np.minimum(boxes, own[:, None]), 0.0)
        out[start : start + step] = np.prod(own, axis=-1) - _volumes(clipped)
    return np.maximum(out, 0.0)


def front_hypervolumes(state, reference: np.ndarray) -> np.ndarray:
    """f64[I, C]: the hypervolume of each island's front in each cell of a ``ParetoState``.

    All fronts are swept together (the cells are a batch axis), so reading a run of
    thousands of cells costs a few vectorised numpy passes, not a Python loop per cell.
    """
    objectives = np.asarray(state.objectives, np.float64)
    members = np.asarray(state.genome_id) >= 0
    objectives = np.where(members[..., None], objectives, np.nan)
    islands, cells, slots, m = objectives.shape
    boxes = _boxes(objectives.reshape(-1, slots, m), reference)
    return _volumes(boxes).reshape(islands, cells)


def derived_reference(points: np.ndarray) -> np.ndarray:
    """f64[M]: a reference for a run that declares none, from the maximised values it saw.

    Per objective, the worst value of the finite vectors minus :data:`REFERENCE_MARGIN` of the range
    (of 1, or of the value's magnitude if larger, when every value is equal), so even the
    worst member covers a box of non-zero volume. A reader derives it once from the
    whole run and keeps it, so every point of a curve is measured against the same
    reference.
    """
    values = np.asarray(points, np.float64)
    values = values.reshape(-1, values.shape[-1])
    _check_objectives(values.shape[-1])
    values = values[np.isfinite(values).all(axis=1)]  # a vector with a missing value is no candidate
    if len(values) == 0:
        raise ValueError("no finite objective vector to derive a hypervolume reference from")
    worst, best = values.min(axis=0), values.max(axis=0)
    span = best - worst
    span = np.where(span > 0, span, np.maximum(np.abs(worst), 1.0))
    return worst - REFERENCE_MARGIN * span


def _check_objectives(m: int) -> None:
    if not 1 <= m <= MAX_OBJECTIVES:
        raise ConfigError(
            "objectives",
            f"hypervolume is exact for 1 to {MAX_OBJECTIVES} objectives, got {m}",
            f"declare at most {MAX_OBJECTIVES} objectives for a Pareto run",
        )


def _boxes(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """f64[..., N, M] >= 0: each point's box sides above the reference; 0 where it covers nothing.

    Clipping a side at 0 empties the box of a point that does not dominate the reference,
    and every algorithm below gives a box with a zero side no volume.
    """
    points = np.asarray(points, np.float64)
    reference = np.asarray(reference, np.float64)
    if points.ndim < 2 or reference.shape != points.shape[-1:]:
        raise ValueError(f"points f[N, M] and reference f[M] disagree: {points.shape}, {reference.shape}")
    _check_objectives(points.shape[-1])
    if not np.isfinite(reference).all():
        raise ValueError(f"the hypervolume reference must be finite, got {reference}")
    sides = points - reference
    absent = ~np.isfinite(sides).all(axis=-1, keepdims=True)
    return np.where(absent, 0.0, np.maximum(np.nan_to_num(sides, nan=0.0), 0.0))


def _volumes(boxes: np.ndarray) -> np.ndarray:
    """f64[B]: the union volume of each batch's boxes f64[B, N, M] anchored at the origin."""
    m = boxes.shape[-1]
    if boxes.shape[-2] == 0:
        return np.zeros(boxes.shape[0])
    if m == 1:
        return boxes[..., 0].max(axis=-1)
    if m == 2:
        return _areas(boxes)
    return _slices(boxes)


def _areas(boxes: np.ndarray) -> np.ndarray:
    """Two objectives: sorted on the first (descending), each step between consecutive
    first values is covered up to the largest second value seen so far."""
    order = np.argsort(-boxes[..., 0], axis=-1, kind="stable")
    x = np.take_along_axis(boxes[..., 0], order, axis=-1)
    y = np.maximum.accumulate(np.take_along_axis(boxes[..., 1], order, axis=-1), axis=-1)
    next_x = np.concatenate([x[..., 1:], np.zeros_like(x[..., :1])], axis=-1)
    return np.sum((x - next_x) * y, axis=-1)


def _slices(boxes: np.ndarray) -> np.ndarray:
    """Three objectives: sorted on the third (descending), the slab between consecutive
    third values has the area of the boxes at least that high."""
    n = boxes.shape[-2]
    order = np.argsort(-boxes[..., 2], axis=-1, kind="stable")
    z = np.take_along_axis(boxes[..., 2], order, axis=-1)
    base = np.take_along_axis(boxes[..., :2], order[..., None], axis=-2)
    next_z = np.concatenate([z[..., 1:], np.zeros_like(z[..., :1])], axis=-1)
    total = np.zeros(boxes.shape[0])
    for i in range(n):
        high = np.where((np.arange(n) <= i)[:, None], base, 0.0)
        total += _areas(high) * (z[..., i] - next_z[..., i])
    return total
