"""Where a candidate lands in the archive, and rebuilding the archive when that changes.

Three sources place a candidate: the task's own descriptors (its evaluator
reports them), a describer (``descriptors/``: embeddings, AI feedback, learned
similarity), or CycleQD, which takes fitness and descriptors from the metrics of
the current phase. When placement changes for every candidate at once (a
fitted describer is refit; a CycleQD phase ends), the archive is rebuilt from
the store: every placement in its history (candidates, migrations, resets) is
re-placed and inserted into a fresh archive in one batched call, so no stored
candidate is lost.
"""

from __future__ import annotations

import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from descriptors.base import is_fitted_kind
from qd import archive
from qd.contract import Candidate, Item
from qd.search import islands as island_ops
from qd.search import select
from qd.state import RunState
from qd.task import objective_matrix


class Offers:
    """One insert's arrays: island i32[B], descriptor f32[B, D], fitness f32[B], valid bool[B],
    and ``values``, what the archive ranks: the fitness, or with ``objectives`` (a Pareto
    archive's) the maximised objectives f32[B, M] (``qd.task.objective_matrix``)."""

    def __init__(self, candidates: list[Candidate], dim: int, objectives: tuple = ()):
        self.island = np.asarray([c.island for c in candidates], np.int32)
        self.fitness = np.asarray([c.fitness for c in candidates], np.float32)
        # One elite per cell: the fitness array itself, so a tie judge's raise reaches the insert.
        self.values = values_of(candidates, objectives) if objectives else self.fitness
        self.valid = np.asarray([c.valid for c in candidates])
        self.descriptor = np.stack(
            [
                c.descriptor if c.descriptor is not None else np.full(dim, np.nan, np.float32)
                for c in candidates
            ]
        )

    def columns(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """What ``qd.archive.insert`` takes after the spec and the state, for store ids ``ids``."""
        return self.island, self.descriptor, self.values, ids, self.valid


def values_of(candidates: list[Candidate], objectives: tuple) -> np.ndarray:
    """What the archive ranks candidates by: fitness f32[B], or their maximised ``objectives``."""
    if objectives:
        return objective_matrix(objectives, [c.metrics for c in candidates])
    return np.asarray([c.fitness for c in candidates], np.float32)


class Placement:
    """The run's placement rule, as functions of the run state: the tessellation a state's archive
    is built on (:meth:`spec`), and state -> state steps that place, refit and rotate.

    The numbers that change (the CycleQD phase the archive was built in, the describer's fit
    count, the valid candidates stored) live in ``RunState.counters``; this object holds only
    the rule (describer, CycleQD objective) and a memo of the last tessellation it derived.

    Args:
        spec: the configured tessellation (a CycleQD run starts from its phase 0 grid).
        describer: a ``descriptors.base.Descriptor`` or None (the task's descriptors).
        cycle: a ``qd.search.cycle.CyclicObjective`` or None.
        kind: the task's candidate kind (``vector``/``text``): what a rebuild re-places.
        objectives: the task's (``qd.task.objectives_of``); kept only when ``spec``'s
            archive takes them (Pareto fronts), else ().
    """

    def __init__(
        self,
        spec: Any,
        describer: Any,
        cycle: Any,
        kind: str,
        islands: int,
        seed: int,
        objectives: tuple = (),
    ):
        self.describer, self.cycle, self.kind = describer, cycle, kind
        self.objectives = objectives if archive.kinds.takes_objectives(spec) else ()
        self.islands, self.seed = islands, seed
        self.fitted = describer is not None and is_fitted_kind(describer)
        self.calls_per_child = describer.calls_per_item if describer is not None else 0
        self._base = spec  # its CMA-MAE settings hold for every phase's grid and fitted cells
        self._memo: tuple[tuple[int, int], Any] | None = None  # (phase, fits) -> tessellation

    def spec(self, state: RunState | None = None) -> Any:
        """The tessellation of ``state``'s archive (None: a new run's): the CycleQD phase's grid,
        a fitted describer's own cells, or the configured spec."""
        at = (state.counters.phase, state.counters.fits) if state is not None else (0, 0)
        if self._memo is None or self._memo[0] != at:
            self._memo = at, self._derive(*at)
        return self._memo[1]

    def _derive(self, phase: int, fits: int) -> Any:
        if self.cycle is not None:
            return archive.with_thresholds(self.cycle.spec(phase), self._base)
        own = self.describer.cell_spec() if self.fitted and fits else None
        return self._base if own is None else archive.with_thresholds(own, self._base)

    def resume(self, state: RunState) -> RunState:
        """A loaded checkpoint's state, with the describer's fit taken back and the CycleQD
        phase its archive was built in (a checkpoint is written after any due rotation)."""
        if self.fitted and state.counters.fits:
            self.describer.load_state_dict(state.describer)
        return state.count(phase=self.phase(state)) if self.cycle is not None else state

    def phase(self, state: RunState) -> int:
        return self.cycle.phase(state.counters.insertions)

    def rotation_due(self, state: RunState) -> bool:
        """CycleQD: the phase changed since the archive was built."""
        return self.cycle is not None and self.phase(state) != state.counters.phase

    def refit_due(self, state: RunState) -> bool:
        return self.fitted and self.describer.needs_fit(state.counters.valid)

    async def describe(self, candidates: list[Candidate]) -> None:
        """Places each evaluated, valid text candidate with the describer (in place).

        A describer failure makes the candidate invalid with its reason; an
        unfitted describer leaves NaN descriptors (stored, placed after the fit).
        """
        todo = [c for c in candidates if c.valid and c.text is not None]
        if self.describer is None or not todo:
            return
        out = await self.describer.describe([Item(c.text, c.fitness, c.metrics, c.id) for c in todo])
        for c, values, ok, error in zip(todo, np.asarray(out.values, np.float32), out.valid, out.error):
            c.descriptor = values
            if not ok:
                c.valid, c.error = False, f"descriptor: {error}"

    def offers(self, candidates: list[Candidate], state: RunState) -> tuple[RunState, Offers]:
        """The insert's arrays, and the state counting the valid ones; under CycleQD, fitness and
        descriptors from the phase's metrics first."""
        if self.cycle is not None:
            fitness, descriptor, valid, errors = self.cycle.score(
                self.phase(state), [c.metrics for c in candidates], [c.valid for c in candidates]
            )
            for c, f, d, ok, error in zip(candidates, fitness, descriptor, valid, errors):
                c.fitness, c.descriptor = float(f), d
                if error is not None:
                    c.valid, c.error = False, error
        state = state.count(valid=state.counters.valid + sum(c.valid for c in candidates))
        return state, Offers(candidates, self.spec(state).descriptor_dim, self.objectives)

    async def refit(self, store: Any, state: RunState) -> tuple[RunState, dict[str, Any]]:
        """Fits the describer on every valid stored candidate, then rebuilds the archive."""
        started = time.monotonic()
        stored = [c for c in store.iter() if c.valid and c.kind == "text"]
        items = [Item(c.text, c.fitness, c.metrics, c.id) for c in stored]
        fits = state.counters.fits + 1
        await self.describer.fit(items, np.random.default_rng([self.seed, fits - 1]))
        out = await self.describer.describe(items)
        fitness = values_of(stored, self.objectives)
        state = state.count(fits=fits)  # the fitted state is checkpointed with it (the driver's upkeep)
        state, placed = self.rebuild(store, state, [c.id for c in stored], fitness, out.values, out.valid)
        return state, {
            "event": "refit",
            "fits": fits,
            "candidates": len(items),
            "placed": placed,
            "seconds": round(time.monotonic() - started, 3),
        }

    def rotate(self, store: Any, state: RunState) -> tuple[RunState, dict[str, Any]]:
        """CycleQD: the next metric becomes the quality; every stored candidate is re-scored."""
        started = time.monotonic()
        phase = self.phase(state)
        stored = [c for c in store.iter() if c.kind == self.kind]
        fitness, descriptor, valid, _ = self.cycle.score(
            phase, [c.metrics for c in stored], [c.valid for c in stored]
        )
        state = state.count(phase=phase)
        state, placed = self.rebuild(store, state, [c.id for c in stored], fitness, descriptor, valid)
        return state, {
            "event": "rotate",
            "phase": phase,
            "quality": self.cycle.quality(phase),
            "candidates": len(stored),
            "placed": placed,
            "seconds": round(time.monotonic() - started, 3),
        }

    def rebuild(
        self, store: Any, state: RunState, ids: list[int], fitness: Any, descriptor: Any, valid: Any
    ) -> tuple[RunState, int]:
        """A fresh archive from every placement in the store's history (candidates,
        migrations, resets) with these per-candidate values, in one batched insert.
        Returns the state and how many placements were valid."""
        spec = self.spec(state)
        row = {int(i): j for j, i in enumerate(ids)}
        offers = store.placements(-1, spec.descriptor_dim, self.objectives)
        dim, n = spec.descriptor_dim, len(ids)
        # Row n is a placeholder for offers of candidates not among ``ids``: never placed.
        take = np.asarray([row.get(int(i), n) for i in offers["id"]], np.int64)
        offered = np.vstack([np.asarray(descriptor, np.float32).reshape(n, dim), np.full((1, dim), np.nan)])[
            take
        ]
        values = np.asarray(fitness, np.float32)  # f32[n], or f32[n, M] of a Pareto archive
        score = np.concatenate([values, np.full((1, *values.shape[1:]), np.nan, np.float32)])[take]
        ok = offers["valid"] & np.append(np.asarray(valid, bool).reshape(-1), False)[take]
        rebuilt = archive.rebuild(
            spec,
            self.islands,
            offers["island"],
            offered,
            score,
            offers["id"],
            ok,
        )
        shape = (self.islands, spec.num_cells)
        migrant = _migrant_cells(rebuilt, offers, spec.num_cells)
        state = state._replace(
            archive=rebuilt,
            islands=island_ops.init(*shape)._replace(migrant=jnp.asarray(migrant)),
            curiosity=select.curiosity_init(*shape),  # cells mean something else now
        )
        return state, int(np.sum(np.isfinite(offered).all(1) & ok))


def _migrant_cells(state: Any, offers: dict[str, np.ndarray], num_cells: int) -> np.ndarray:
    """bool[I, C]: cells holding an elite that reached its island only as a copy
    (migration, reseed), read off the placement history ``Store.placements`` returned."""
    own = ~offers["migrated"]
    native = set(zip(offers["island"][own].tolist(), offers["id"][own].tolist()))
    view = archive.slots_of(state)
    ids, cells = np.asarray(view.elites.genome_id), np.asarray(view.cell)
    island, slot = np.nonzero(ids >= 0)
    out = np.zeros((ids.shape[0], num_cells), bool)
    copied = [(i, g) not in native for i, g in zip(island.tolist(), ids[island, slot].tolist())]
    np.logical_or.at(out, (island, cells[slot]), np.asarray(copied, bool))
    return out
