"""The device loop's Pareto archive (``archive=pareto``): a front per cell, as QDax's MOME keeps.

``qd.device.step`` keeps a grid's genomes and parents per cell; a Pareto archive has K
slots per cell, and its members move between slots on every insert (a front is kept
in id order), so their genomes, parents and migrant flags travel with them through
:func:`qd.archive.pareto.insert_carrying`. A front never empties (a member leaves only
for a newcomer), so the step's list of filled cells serves unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive import NEW_CELL, pareto
from qd.archive.cells import InsertResult
from qd.archive.pareto import ParetoSpec, ParetoState, Payload
from qd.archive.state import EMPTY_ID

# Slot draws per parent (see :func:`pick_slots`).
TRIES = 4


class Placed(NamedTuple):
    """An insert's new archive, the members' carried arrays ([I, C, K, ...]) and which
    candidates filled an empty cell (bool[B], one per cell)."""

    archive: ParetoState
    genomes: jax.Array
    parents: jax.Array
    migrant: jax.Array
    opened: jax.Array
    result: InsertResult


def pick_slots(key: jax.Array, genome_id: jax.Array, source: jax.Array, cell: jax.Array) -> jax.Array:
    """i32 like ``cell``: a member of each drawn (filled) cell's front.

    Each draw tries :data:`TRIES` slots uniformly and keeps the first filled one, else
    slot 0 (a front fills its first slots): with the cells drawn uniformly, a member is
    drawn uniformly over the union of the fronts (QDax's MOME selection) but for the
    fallback, which needs TRIES empty slots in a row."""
    k = genome_id.shape[-1]
    tries = jax.random.randint(key, (*cell.shape, TRIES), 0, k)
    filled = genome_id[source[..., None], cell[..., None], tries] >= 0
    first = jnp.argmax(filled, axis=-1)
    slot = jnp.take_along_axis(tries, first[..., None], axis=-1)[..., 0]
    return jnp.where(jnp.any(filled, axis=-1), slot, 0)


def place(
    spec: ParetoSpec,
    archive: ParetoState,
    carried: tuple[jax.Array, jax.Array, jax.Array],
    island: jax.Array,
    genome: jax.Array,
    objectives: jax.Array,
    descriptor: jax.Array,
    valid: jax.Array,
    ids: jax.Array,
    parents: jax.Array,
    migrants: bool = False,
) -> Placed:
    """Inserts the candidates; ``carried`` (genomes, parents, migrant, [I, C, K, ...])
    move with the members. Several candidates may open one empty cell together: the
    first of them is its opener."""
    genomes, lineage, migrant = carried
    size = ids.shape[0]
    new_archive, (genomes, lineage, migrant), result = pareto.insert_carrying(
        spec,
        archive,
        island,
        descriptor,
        objectives,
        ids,
        valid,
        (
            Payload(genomes, genome, 0.0),
            Payload(lineage, parents, EMPTY_ID),
            Payload(migrant, jnp.full(size, migrants), False),
        ),
    )
    opening = result.status == NEW_CELL
    out = archive.genome_id.shape[0] * archive.genome_id.shape[1]
    flat = jnp.where(opening, island * archive.genome_id.shape[1] + result.cell, out)
    first = jnp.full(out, size, jnp.int32).at[flat].min(jnp.arange(size, dtype=jnp.int32), mode="drop")
    opened = opening & (first[jnp.minimum(flat, out - 1)] == jnp.arange(size))
    return Placed(new_archive, genomes, lineage, migrant, opened, result)


def fronts_on_device(cfg: Any, task: Any) -> bool:
    """Whether a Pareto run (``archive=pareto``) can use the device loop: its task gives the
    maximised objectives in JAX (``objectives_jax``), and its islands do not migrate (the
    device loop sends no member between fronts)."""
    migrates = cfg.islands.count > 1 and cfg.islands.migrate_every > 0
    return callable(getattr(task, "objectives_jax", None)) and not migrates


def empty_state(spec: ParetoSpec, islands: int, genome_dim: int, num_parents: int) -> dict[str, np.ndarray]:
    """A new run's archive and carried arrays on the host (numpy: nothing to compile)."""
    shape = (islands, spec.num_cells, spec.front_size)
    return {
        "archive": ParetoState(
            objectives=np.full((*shape, spec.num_objectives), -np.inf, np.float32),
            descriptor=np.zeros((*shape, spec.descriptor_dim), np.float32),
            genome_id=np.full(shape, EMPTY_ID, np.int32),
        ),
        "genomes": np.zeros((*shape, genome_dim), np.float32),
        "parents": np.full((*shape, num_parents), EMPTY_ID, np.int32),
        "migrant": np.zeros(shape, bool),
    }
