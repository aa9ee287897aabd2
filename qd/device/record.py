"""What a device run keeps in its run directory: the store's rows and the checkpoint.

The driver (``qd.device.driver``) decides when to write; this part decides what
and how: a checkpoint holds the archive, the key and the state arrays beside
it, and the store gets only rows above its last id (ids are evaluation numbers),
so a call recomputed after a crash never writes a row twice.

The elites' genomes (f32[I, C, G], most of the state: 4 MB for sphere 100-D's 10,000 cells)
are not in the checkpoint: each call's store rows, committed before its checkpoint, hold
every genome the archive gained, and a load reads them back by the archive's ids. So a
checkpoint writes only the small arrays, and the genomes are written once, when they arrive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from qd.device.step import Candidates, DeviceState
from qd.errors import CheckpointError
from qd.rundir import checkpoint, layout
from qd.store import Store

LOOP = "device"
STATE_ARRAYS = (
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
        genomes = arrays["genomes"] if "genomes" in arrays else self._genomes(archive, counters)
        state = DeviceState(
            archive=archive,
            key=key,
            genomes=jax.numpy.asarray(genomes),
            **{k: jax.numpy.asarray(arrays[k]) for k in STATE_ARRAYS},
            evaluations=jax.numpy.int32(counters["evaluations"]),
            generations=jax.numpy.int32(counters["generations"]),
        )
        return state, float(counters.get("elapsed", 0.0))

    def _genomes(self, archive: Any, counters: dict[str, Any]) -> np.ndarray:
        """f32[I, C, G]: each elite's genome from its store row, 0 where a cell is empty (a
        checkpoint written before this one kept ``genomes`` itself)."""
        ids = np.asarray(archive.genome_id)
        genomes = np.zeros((*ids.shape, counters["genome_dim"]), np.float32)
        held = ids >= 0
        unique, where = np.unique(ids[held], return_inverse=True)
        rows = self.store.get(unique.tolist())
        if rows:
            genomes[held] = np.stack([c.vector for c in rows])[where]
        return genomes

    def save(self, snap: HostState) -> None:
        """The checkpoint of ``snap`` (its counters marked as this loop's), without the genomes:
        the store has them (the module doc says why)."""
        s = snap.state
        counters = {
            "loop": LOOP,
            "genome_dim": int(s.genomes.shape[-1]),
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
        if self.objectives:  # a front member: its first objective as the fitness, all in metrics
            rows["metrics"] = [self._metrics(values) for values in rows["fitness"]]
            rows["fitness"] = np.asarray(rows["fitness"])[:, 0]
        self.store.add_vectors(rows, self.operator)

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
