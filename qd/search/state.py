"""The run's state as a type: one value of everything that changes as a run goes.

The search's parts (``qd.search.step``) and the engine's stages take a
:class:`RunState` and return a new one; building a fresh one and its checkpoint
(``qd.state``) sit above them. The type lives here, below both, so a part of the
search names the value it updates without importing the engine.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from qd import archive
from qd.search import islands as island_ops
from qd.search import scheduler, select


class Counters(NamedTuple):
    """The run's clocks, all monotone.

    Attributes:
        batches: commits (archive insert batches): the checkpoint schedule's clock.
        last_id: the newest store row reflected in the archive (replayed after it on resume).
        elapsed: run seconds before the current session.
        proposals: proposals started: fixes each one's island and place in the key stream.
        fits: describer fits so far.
        insertions: candidates offered to the archive: CycleQD's phase clock.
        valid: valid candidates stored (a fitted describer's schedule counts them; recounted from
            the store when a run is built).
        phase: the CycleQD phase the archive's grid and fitness belong to.
    """

    batches: int = 0
    last_id: int = -1
    elapsed: float = 0.0
    proposals: int = 0
    fits: int = 0
    insertions: int = 0
    valid: int = 0
    phase: int = 0


class Watch(NamedTuple):
    """What the stop rules (``qd.stop_rules``) read, updated at each commit. The checkpoint keeps
    ``best`` and ``stale``, so a resumed run keeps its patience; the guard's counts start afresh
    (a resumed run may have had its harness fixed).

    Attributes:
        best: the best fitness committed so far (-inf: none yet).
        stale: proposals committed since ``best`` last rose (``runner.patience``).
        harness: candidates failed not for their own reasons (outside their code, or a founder:
            one of the task's initial genomes), all told.
        streak: the latest candidates in a row that failed so with one error.
        streak_error: that error.
    """

    best: float = -math.inf
    stale: int = 0
    harness: int = 0
    streak: int = 0
    streak_error: str = ""


class RunState(NamedTuple):
    """Everything that changes as a run goes, in one value (see the module doc)."""

    archive: archive.ArchiveState
    islands: island_ops.IslandState
    curiosity: select.Curiosity
    bandits: tuple[scheduler.BanditState, ...]
    key: jax.Array
    counters: Counters = Counters()
    meta: dict | None = None  # operators.meta.InstructionPool.state_dict()
    describer: dict[str, np.ndarray] | None = None  # a fitted describer's state_dict()
    founding: tuple[int, ...] = ()  # founder proposals in flight per island (none survive a restart)
    stop: str | None = None  # why the run was asked to stop ("" for a signal); None: it was not
    watch: Watch = Watch()
    done: str | None = None  # the stop rule the run met (a target, its patience): a stop, not an error

    def count(self, **changes: Any) -> RunState:
        """The state with some counters replaced."""
        return self._replace(counters=self.counters._replace(**changes))

    def found(self, island: int, proposals: int) -> RunState:
        """The state with ``proposals`` more founder proposals in flight on ``island`` (negative:
        a committed wave's founders, whose elites are parents now)."""
        founding = list(self.founding)
        founding[island] += proposals
        return self._replace(founding=tuple(founding))

    def split(self) -> tuple[RunState, jax.Array]:
        """A fresh subkey, and the state with the key advanced past it."""
        key, sub = jax.random.split(self.key)
        return self._replace(key=key), sub
