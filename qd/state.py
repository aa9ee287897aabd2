"""The run's state as one value: what a checkpoint holds, and nothing else.

``RunState`` (``qd.search.state``) is a NamedTuple of the archive, the island bookkeeping, the
curiosity scores, the scheduler's bandit states, the RNG key and typed
counters, plus the JSON state of the instruction pool and the arrays of a
fitted describer. The parts of the run take it and return a new one; the driver
keeps the latest. :func:`save` and :func:`load` *are* the checkpoint (one atomic
``.npz``, ``qd.rundir.checkpoint``); everything else a run knows is in the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from qd.archive import kinds
from qd.errors import CheckpointError
from qd.rundir import checkpoint
from qd.search import islands as island_ops
from qd.search import scheduler, select
from qd.search.state import Counters, RunState, Watch

# The store's ``meta`` key of ``Counters.proposals`` as of the newest rows, written in their
# transaction: rows stored after the checkpoint (``kill -9`` before it was written) carry the
# clock their resume continues from.
PROPOSALS_STARTED = "proposals_started"


def init(spec: Any, num_islands: int, bandits: tuple[Any, ...], num_arms: int, seed: int) -> RunState:
    """A new run's state: empty archive (at the spec's ``threshold_min``), fresh bookkeeping,
    the key of ``seed``."""
    shape = (num_islands, spec.num_cells)
    return RunState(
        archive=kinds.init(spec, num_islands),
        islands=island_ops.init(*shape),
        curiosity=select.curiosity_init(*shape),
        bandits=tuple(b.init(num_arms) for b in bandits),
        key=jax.random.key(seed),
        founding=(0,) * num_islands,
    )


def save(directory: Path, state: RunState) -> None:
    """Writes ``state`` as the run's checkpoint (atomically)."""
    arrays = {f"describer.{k}": v for k, v in (state.describer or {}).items()}
    for j, b in enumerate(state.bandits):
        arrays.update({f"bandit.{j}.{k}": v for k, v in scheduler.state_dict(b).items()})
    arrays.update({f"islands.{k}": np.asarray(v) for k, v in state.islands._asdict().items()})
    arrays["curiosity.score"] = np.asarray(state.curiosity.score)
    # The stop rules' watch: its best and patience; the guard's counts start afresh on resume
    # (the harness it stopped may have been fixed since).
    counters = dict(state.counters._asdict(), watch={"best": state.watch.best, "stale": state.watch.stale})
    counters.update({"meta": state.meta} if state.meta else {})
    checkpoint.save(directory, state.archive, state.key, counters, arrays)


def load(directory: Path, fresh: RunState) -> RunState | None:
    """The checkpointed state in ``directory`` (None if there is none).

    Parts a checkpoint lacks or holds in another shape (a checkpoint from before
    they existed, or scheduler arms that changed) come from ``fresh``.
    """
    loaded = checkpoint.load(directory)
    if loaded is None:
        return None
    state, key, saved_counters = loaded
    if saved_counters.get("loop") == "device":
        raise CheckpointError(
            f"{directory} holds a device-loop checkpoint; resume it with runner.loop=device"
        )
    saved = checkpoint.load_arrays(directory)
    counters = Counters(**{k: saved_counters[k] for k in Counters._fields if k in saved_counters})
    shape = state.genome_id.shape[:2]  # (islands, cells) of every archive kind
    isl, cur = checkpoint.part(saved, "islands."), checkpoint.part(saved, "curiosity.")
    num_arms = fresh.bandits[0].num_arms
    return RunState(
        archive=state,
        islands=island_ops.IslandState(**isl)
        if isl and isl["migrant"].shape == shape
        else island_ops.init(*shape),
        curiosity=select.Curiosity(**cur)
        if cur and cur["score"].shape == shape
        else select.curiosity_init(*shape),
        bandits=tuple(
            scheduler.load_state_dict(part, num_arms)
            if (part := checkpoint.part(saved, f"bandit.{j}."))
            else b
            for j, b in enumerate(fresh.bandits)
        ),
        key=key,
        counters=counters,
        meta=saved_counters.get("meta") or None,
        watch=Watch(**saved_counters.get("watch", {})),
        describer=checkpoint.part(saved, "describer.") or None,
        founding=fresh.founding,  # (and no stop: a resumed run was not asked to stop)
    )
