"""The descriptor interface: a batch of evaluated candidates -> ``f32[B, D]`` plus a mask.

A descriptor decides where a candidate lands in the archive. Every kind (the
task's own numbers, code metrics, embeddings, AI feedback, learned projections)
implements :class:`Descriptor`; :class:`Combined` concatenates several into one
D-vector. The engine calls ``describe`` after evaluation and before the store
write, so the stored descriptor is the one the archive saw.

Fitted descriptors (a PCA of embeddings, a QDHF projection) start unfitted:
their values are NaN with ``valid`` True, so the candidate is stored as valid but
not placed. When ``needs_fit`` says so, the engine calls ``fit`` on every stored
valid candidate, re-describes them all, rebuilds the archive in one batched
insert and checkpoints the fitted state (``state_dict``) beside the archive.
Re-describing must be cheap: fitted descriptors cache their expensive inputs
(embeddings, judge answers) in the store's cache table (the ``qd.contract.Ports``
given to ``attach``). ``Descriptor``, the base every kind subclasses, is defined
in ``qd.contract`` (the engine reads its members) and re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from qd.contract import ChatClient, ConfigError, Described, Descriptor, Item, Ports


class Fitted(Protocol):
    """What a descriptor adds when it is fitted to data (and refit on a schedule)."""

    def needs_fit(self, num_valid: int) -> bool:
        """True when a (re)fit is due, given the number of valid stored candidates."""
        ...

    async def fit(self, items: Sequence[Item], rng: np.random.Generator) -> None:
        """Fits (or refits) on every valid stored candidate; the engine then re-inserts them all."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (saved in the checkpoint)."""
        ...

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restores what ``state_dict`` returned (on resume)."""
        ...


def is_fitted_kind(descriptor: Any) -> bool:
    """True if ``descriptor`` implements :class:`Fitted` (a :class:`Combined`: if any part does)."""
    if isinstance(descriptor, Combined):
        return any(is_fitted_kind(p) for p in descriptor.parts)
    return all(
        callable(getattr(descriptor, m, None)) for m in ("needs_fit", "fit", "state_dict", "load_state_dict")
    )


def invalid(n: int, dim: int, reason: str) -> Described:
    """A batch where every candidate is invalid for the same reason."""
    return Described(np.full((n, dim), np.nan, np.float32), np.zeros(n, bool), [reason] * n)


def pending(n: int, dim: int) -> Described:
    """A batch that is valid but not placeable yet (an unfitted descriptor)."""
    return Described(np.full((n, dim), np.nan, np.float32), np.ones(n, bool), [None] * n)


class Combined(Descriptor):
    """Several descriptors side by side: their axes concatenated into one D-vector.

    A candidate is invalid if any part says so (the reasons are joined); it is
    unplaced while any fitted part is unfitted. Fitting, scheduling and state
    are delegated to the fitted parts (state keys are prefixed by part index).
    """

    def __init__(self, parts: Sequence[Descriptor]):
        if not parts:
            raise ConfigError("parts", "is empty", "name at least one descriptor")
        self.parts = list(parts)
        self.name = "+".join(p.name for p in self.parts)
        self.dim = sum(p.dim for p in self.parts)
        self.calls_per_item = sum(p.calls_per_item for p in self.parts)
        self.lower = tuple(x for p in self.parts for x in p.lower)
        self.upper = tuple(x for p in self.parts for x in p.upper)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(n for p in self.parts for n in p.axis_names)

    def attach(self, ports: Ports | None, llm: ChatClient | None = None) -> None:
        for p in self.parts:
            p.attach(ports, llm)

    async def describe(self, items: Sequence[Item]) -> Described:
        import asyncio

        outs = await asyncio.gather(*(p.describe(items) for p in self.parts))
        values = np.concatenate(
            [np.asarray(o.values, np.float32).reshape(len(items), p.dim) for o, p in zip(outs, self.parts)],
            axis=1,
        )
        valid = np.logical_and.reduce([np.asarray(o.valid, bool) for o in outs])
        error = ["; ".join(e for e in (o.error[j] for o in outs) if e) or None for j in range(len(items))]
        values[~valid] = np.nan
        return Described(values, valid, [e if not ok else None for e, ok in zip(error, valid)])

    def _fitted(self) -> list[tuple[int, Any]]:
        return [(i, p) for i, p in enumerate(self.parts) if is_fitted_kind(p)]

    def needs_fit(self, num_valid: int) -> bool:
        return any(p.needs_fit(num_valid) for _, p in self._fitted())

    async def fit(self, items: Sequence[Item], rng: np.random.Generator) -> None:
        for _, p in self._fitted():
            if p.needs_fit(len(items)):
                await p.fit(items, rng)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"{i}.{k}": v for i, p in self._fitted() for k, v in p.state_dict().items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for i, p in self._fitted():
            prefix = f"{i}."
            p.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})

    def cell_spec(self) -> Any:
        """The one part's own tessellation (e.g. CVT centroids fitted in embedding space), if any."""
        return self.parts[0].cell_spec() if len(self.parts) == 1 else None
