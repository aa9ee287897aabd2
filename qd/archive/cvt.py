"""The spec of a centroidal Voronoi tessellation (CVT) archive: :class:`CVTSpec`.

The spec is a small value: the cells (a :class:`~qd.archive.centroid_index.CentroidIndex`
over the centroids, which does the exact nearest-centroid lookup) and the CMA-MAE
settings every spec carries. Centroids come from :func:`qd.archive.centroids.cvt_centroids`
or from the caller.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import numpy as np

from qd.archive.centroid_index import CentroidIndex
from qd.archive.state import check_thresholds

__all__ = ["CVTSpec"]


@dataclasses.dataclass(frozen=True)
class CVTSpec:
    """The cells of a CVT archive: cell ``i`` is the Voronoi cell of centroid ``i``.

    ``CVTSpec(centroids)`` validates the centroids and precomputes the lookup (once, on
    the host); ``dataclasses.replace(spec, learning_rate=...)`` keeps the built lookup.
    It is a JAX pytree: the lookup's arrays are traced, the CMA-MAE settings are static
    (jitted inserts specialize on them, as on a grid's bins).

    Attributes:
        lookup: the centroids and their exact nearest-centroid index (a
            :class:`CentroidIndex`, built from a (C, D) array when one is given).
        learning_rate, threshold_min: the CMA-MAE settings every spec carries
            (:func:`qd.archive.state.check_thresholds`); defaults: plain MAP-Elites.
    """

    kind: ClassVar[str] = "cvt"  # the run directory's name for it (``archive.json``)

    lookup: CentroidIndex
    learning_rate: float = 1.0
    threshold_min: float = -math.inf

    def __post_init__(self) -> None:
        if not isinstance(self.lookup, CentroidIndex):
            object.__setattr__(self, "lookup", CentroidIndex(self.lookup))
        thresholds = check_thresholds(self.learning_rate, self.threshold_min)
        object.__setattr__(self, "learning_rate", thresholds[0])
        object.__setattr__(self, "threshold_min", thresholds[1])

    @property
    def centroids(self) -> jax.Array:
        """(C, D) float32 centroids."""
        return self.lookup.centroids

    @property
    def num_cells(self) -> int:
        """Number of cells C (static)."""
        return self.lookup.num_cells

    @property
    def descriptor_dim(self) -> int:
        """Descriptor dimension D (static)."""
        return self.lookup.descriptor_dim

    def index(self, descriptor: jax.Array | np.ndarray) -> jax.Array:
        """(B, D) descriptors -> (B,) int32 cell of each: its exact nearest centroid
        (:meth:`CentroidIndex.index`)."""
        return self.lookup.index(descriptor)


def _unflatten(thresholds: tuple[float, float], children: tuple[CentroidIndex]) -> CVTSpec:
    """Rebuilds a spec from its lookup without validating again: JAX unflattens on every
    jit call and tree_map, with leaves that may be tracers."""
    spec = object.__new__(CVTSpec)
    object.__setattr__(spec, "lookup", children[0])
    object.__setattr__(spec, "learning_rate", thresholds[0])
    object.__setattr__(spec, "threshold_min", thresholds[1])
    return spec


jax.tree_util.register_pytree_with_keys(
    CVTSpec,
    lambda s: ([(jax.tree_util.GetAttrKey("lookup"), s.lookup)], (s.learning_rate, s.threshold_min)),
    _unflatten,
    lambda s: ([s.lookup], (s.learning_rate, s.threshold_min)),
)
