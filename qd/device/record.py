"""What a device run keeps in its run directory: the store's rows and the checkpoint.

The driver (``qd.device.driver``) decides when to write; this part decides what
and how: a checkpoint holds the archive, the key and the state arrays beside
it, and the store gets only rows above its last id (ids are evaluation numbers),
so a call recomputed after a crash never writes a row twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from qd.contract import Candidate
from qd.device.step import Candidates, DeviceState
from qd.errors import CheckpointError
from qd.rundir import checkpoint, layout
from qd.store import Store

LOOP = "device"
STATE_ARRAYS = (
    "genomes",
    "parents",
    "migrant",
    "occupied",
    "num_occupied",
)  # checkpointed beside the archive
_ROW_FIELDS = ("id", "island", "genome", "fitness", "descriptor", "valid", "parents")


class HostState(NamedTuple):
    """A call's result on the host, for the writer: the state (numpy; the key as raw data)
    and the run's seconds when it was taken."""

    state: DeviceState
    elapsed: float


class DeviceRecord:
    """The store and the checkpoints of one device run.

    Args:
        run_dir: the run directory (``store.sqlite`` and ``checkpoints/`` in it).
        store: ``elites`` (the archive's elites at each checkpoint) or ``all`` (every candidate).
        operator: the name stored with each row (None for a mix).
        objectives: a Pareto run's named objectives with directions (``qd.task.objectives_of``):
            each row keeps them in its metrics, in the task's own units (what a replay reads),
            and its first (maximised) objective as its fitness; None for a cell archive.
    """

    def __init__(
        self,
        run_dir: Path,
        store: str,
        operator: str | None,
        objectives: tuple[tuple[str, str], ...] | None = None,
    ):
        self.ckpt_dir = Path(run_dir) / layout.CHECKPOINTS
        self.keep_all, self.operator, self.objectives = store == "all", operator, objectives
        self.store = Store(Path(run_dir) / layout.STORE)
        self.store.meta.set("loop", LOOP)
        self.store.meta.set("store", store)

    def load(self) -> tuple[DeviceState, float] | None:
        """The checkpointed state and the run's seconds at it (None: a new run).

        Raises:
            CheckpointError: the checkpoint is a host-loop run's.
        """
        loaded = checkpoint.load(self.ckpt_dir)
        if loaded is None:
            return None
        archive, key, counters = loaded
        if counters.get("loop") != LOOP:
            raise CheckpointError(
                f"{self.ckpt_dir} holds a host-loop checkpoint; resume it with runner.loop=host"
            )
        arrays = checkpoint.load_arrays(self.ckpt_dir)
        state = DeviceState(
            archive=archive,
            key=key,
            **{k: jax.numpy.asarray(arrays[k]) for k in STATE_ARRAYS},
            evaluations=jax.numpy.int32(counters["evaluations"]),
            generations=jax.numpy.int32(counters["generations"]),
        )
        return state, float(counters.get("elapsed", 0.0))

    def save(self, snap: HostState) -> None:
        """The checkpoint of ``snap`` (its counters marked as this loop's)."""
        s = snap.state
        counters = {
            "loop": LOOP,
            "evaluations": int(s.evaluations),
            "generations": int(s.generations),
            "elapsed": snap.elapsed,
        }
        checkpoint.save(
            self.ckpt_dir,
            s.archive,
            jax.random.wrap_key_data(s.key),
            counters,
            {k: getattr(s, k) for k in STATE_ARRAYS},
        )

    def add_rows(self, snap: DeviceState, candidates: Candidates | None) -> None:
        """Writes what the store keeps and lacks: rows with ids above its last one.

        ``all``: the call's candidates (a resume has none to add: they were stored
        before the checkpoint). ``elites``: the archive's elites; a migrant's copies
        share its id, so it is stored once, with the lowest island holding it.
        """
        last = self.store.last_id()
        if self.keep_all:
            if candidates is None:
                return
            c = {k: v.reshape(-1, *v.shape[2:]) for k, v in candidates._asdict().items()}
            pick = np.nonzero(c["id"] > last)[0]  # masked generations' candidates have id -1
            rows = {k: c[k][pick] for k in _ROW_FIELDS}
        else:
            ids = snap.archive.genome_id  # [I, C] or a Pareto archive's [I, C, K]
            where = np.nonzero(ids > last)
            _, first = np.unique(ids[where], return_index=True)  # ascending ids, each once
            where = tuple(axis[first] for axis in where)
            archive = snap.archive
            rows = {
                "id": ids[where],
                "island": where[0],
                "genome": snap.genomes[where],
                "fitness": (archive.objectives if self.objectives else archive.fitness)[where],
                "descriptor": archive.descriptor[where],
                "valid": np.ones(len(where[0]), bool),
                "parents": snap.parents[where],
            }
        if len(rows["id"]):
            self.store.add(
                [
                    Candidate(
                        kind="vector",
                        genome="vector",
                        island=int(rows["island"][j]),
                        fitness=float(np.ravel(rows["fitness"][j])[0]),
                        metrics=self._metrics(rows["fitness"][j]),
                        descriptor=rows["descriptor"][j],
                        valid=bool(rows["valid"][j]),
                        vector=rows["genome"][j],
                        parent_ids=[int(p) for p in rows["parents"][j] if p >= 0],
                        operator=self.operator,
                    )
                    for j in range(len(rows["id"]))
                ],
                ids=rows["id"].tolist(),
            )

    def _metrics(self, values: np.ndarray) -> dict[str, float] | None:
        """A Pareto row's objectives by name in the task's units (min objectives negated back)."""
        if not self.objectives:
            return None
        return {
            name: float(v if direction == "max" else -v)
            for (name, direction), v in zip(self.objectives, values)
        }

    def close(self) -> None:
        self.store.close()
