"""The device-resident numeric loop as pure functions: select, vary, evaluate, insert, fused.

For a task with a pure-JAX evaluation (``Task.evaluate_jax``) a whole MAP-Elites
generation is one traceable function of a :class:`DeviceState`, and
:func:`device_loop` returns it as an optax-style pair of pure functions
(``init``, ``run``): ``run`` is jitted and ``lax.scan``s K generations per call,
so the host sees the state once per K generations instead of once per batch.
Nothing in here touches the host: no store, no events, no Python per
candidate. The driver (``qd.device.driver``) checkpoints the state between calls.

Genomes live in the archive pytree, beside the cells, as QDax's repertoire keeps
them (``genomes`` f32[I, C, G]); so do each elite's parents' evaluation numbers,
which give an elites-only store its lineage. A candidate's id is its evaluation
number (``evaluations`` before its generation, plus its place in the batch), so
ids are the same on every replay.

Islands are the leading axis: each generation every island emits ``per_island``
children from its own elites, and (``migrate_every`` > 0) every that many
generations all islands send their best ``migrants`` elites to their topology's
targets, which take them by the ordinary insert rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.archive import NEW_CELL, ArchiveState, insert_batch
from qd.archive.migration import select_migrants
from qd.archive.pareto import ParetoSpec
from qd.archive.state import EMPTY_ID, CellSpec
from qd.contract import ConfigError
from qd.device import fronts

Evaluate = Callable[[jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class DeviceState(NamedTuple):
    """Everything a device run carries from generation to generation.

    Attributes:
        archive: the cells (fitness, descriptor, genome_id = evaluation number, thresholds),
            or a Pareto archive's fronts (``qd.archive.pareto``: K slots per cell, so the
            three arrays below have a slot axis after the cells, [I, C, K, ...]).
        genomes: f32[I, C, G]; each elite's genome (0 where the cell is empty).
        parents: i32[I, C, P]; each elite's parents' evaluation numbers (-1: none or unused).
        migrant: bool[I, C]; the elite came from another island (migrants are never sent on).
        occupied: i32[I, C]; each island's filled cells in the order they were filled
            (the first ``num_occupied`` entries): parents are drawn from it in O(batch).
            A cell is never emptied on the device loop, so the list only grows.
        num_occupied: i32[I]; filled cells per island.
        key: the RNG key of the next generation.
        evaluations: i32[]; candidates evaluated so far (the next candidate's id).
        generations: i32[]; generations run so far (the initial batch is not one).
    """

    archive: ArchiveState
    genomes: jax.Array
    parents: jax.Array
    migrant: jax.Array
    occupied: jax.Array
    num_occupied: jax.Array
    key: jax.Array
    evaluations: jax.Array
    generations: jax.Array


class Candidates(NamedTuple):
    """Every candidate of the generations of one call (``store=all``), generation-major.

    Each field has leading axes [K, B]: ``genome`` f32[K, B, G], ``fitness``
    f32[K, B], ``descriptor`` f32[K, B, D], ``valid`` bool[K, B], ``id`` and
    ``island`` i32[K, B], ``parents`` i32[K, B, P].
    """

    genome: jax.Array
    fitness: jax.Array
    descriptor: jax.Array
    valid: jax.Array
    id: jax.Array
    island: jax.Array
    parents: jax.Array


class CallStats(NamedTuple):
    """What one call did, summed over its generations: ``added`` (new cell or
    improvement, each judged against the archive before its generation) and
    ``valid`` candidates, both i32[]."""

    added: jax.Array
    valid: jax.Array


class DeviceOperator(NamedTuple):
    """A numeric variation as the device loop uses it, in two halves: ``draw(key, B, G)``
    (its noise, a pytree) and ``apply(parents f32[B, P, G], noise, **params) -> f32[B, G]``
    (``operators.NumericOperator``'s ``draw`` and ``apply``)."""

    draw: Callable[..., Any]
    apply: Callable[..., jax.Array]
    num_parents: int
    params: dict[str, Any]
    weight: float


# A call's noise is drawn at once, before its scan, up to this many floats (256 MiB), else
# each generation draws its own: one large draw runs ~1.5x faster per number on XLA:CPU
# than a scan of small ones, and the Gaussian draw is most of a generation there. The
# two draw different numbers (vmapped threefry), but which one a run uses depends only
# on its shapes, so a run and its resume always agree.
PREDRAW_FLOATS = 1 << 26

# On XLA:CPU the fused step compiles with cheaper settings, each measured on sphere 100-D,
# batch 256, quiet 2-core machine (compile of the fused step, paid once per run and machine
# with an empty cache; the same QD score bit for bit; no slower after): LLVM's optimization
# level 1 instead of 2 (0.2-0.4 s less); XLA's older loop emitters instead of its fusion
# emitters (1.36-1.49 s -> 0.83-1.01 s); LLVM's expensive passes off (-> 0.65-0.87 s).
CPU_COMPILER_OPTIONS = {
    "xla_backend_optimization_level": 1,
    "xla_cpu_use_fusion_emitters": False,
    "xla_llvm_disable_expensive_passes": True,
}


class Migration(NamedTuple):
    """Every ``every`` generations each island sends its ``migrants`` best elites along ``topology``."""

    every: int
    topology: str
    migrants: int


class DeviceLoop(NamedTuple):
    """``init(seed) -> DeviceState``: an empty run. ``run(state, count, limit, generations,
    keep) -> (state, CallStats, Candidates | None)``: ``count`` (<= ``generations``) more
    generations, evaluating no candidate past number ``limit``, with ``state`` donated.

    ``run`` is jitted with ``generations`` (the scan's length) and ``keep`` static: a
    call of fewer generations masks the rest instead of compiling another scan, and
    the first generation of a run evaluates the task's initial genomes instead of
    varying elites, so a run compiles one function."""

    init: Callable[[int], DeviceState]
    run: Callable[..., tuple[DeviceState, CallStats, Candidates | None]]


class _Founders(NamedTuple):
    genome: jax.Array  # f32[B, G]: each island's slots, the initial genomes first
    used: jax.Array  # bool[B]: the slot holds an initial genome


def _founder_slots(initial: np.ndarray, islands: int, per_island: int, genome_dim: int) -> _Founders:
    """The first generation's batch: each island's first min(N, per_island) slots hold the initial genomes."""
    initial = np.asarray(initial, np.float32).reshape(-1, genome_dim)[:per_island]
    genome = np.zeros((islands, per_island, genome_dim), np.float32)
    genome[:, : len(initial)] = initial
    used = np.zeros((islands, per_island), bool)
    used[:, : len(initial)] = True
    return _Founders(jnp.asarray(genome.reshape(-1, genome_dim)), jnp.asarray(used.reshape(-1)))


def select_uniform(key: jax.Array, state: DeviceState, count: int) -> tuple[jax.Array, jax.Array]:
    """``count`` cells per island, uniformly among its elites (MAP-Elites's selection).

    A uniform rank into the island's list of filled cells: O(count). (A search
    over the cumulative count of filled cells costs O(C) per generation, and on
    XLA:CPU its cumsum alone took most of a generation.)

    Returns:
        i32[I, count] cell indices and bool[I] (the island has an elite at all).
    """
    total = state.num_occupied
    u = jax.random.uniform(key, (total.shape[0], count))
    rank = jnp.minimum((u * total[:, None]).astype(jnp.int32), jnp.maximum(total[:, None] - 1, 0))
    return jnp.take_along_axis(state.occupied, rank, 1), total > 0


def device_loop(
    spec: CellSpec | ParetoSpec,
    evaluate: Evaluate,
    operators: Sequence[DeviceOperator],
    islands: int,
    per_island: int,
    genome_dim: int,
    initial: np.ndarray,
    migration: Migration | None = None,
) -> DeviceLoop:
    """The ``init`` and jitted ``run`` of a device run (see :class:`DeviceLoop`).

    ``initial``: f32[N, G] the task's starting genomes; every island evaluates
    them (the first ``per_island`` of them) as its first generation.
    The archive's CMA-MAE settings are the spec's. With a :class:`ParetoSpec`,
    ``evaluate`` returns the maximised objectives f32[B, M] where a grid's returns
    fitness f32[B], and a parent is a member of a drawn cell's front
    (``qd.device.fronts``); such a run does not migrate.
    """
    has_fronts = isinstance(spec, ParetoSpec)
    if has_fronts and migration is not None:
        raise ConfigError(
            "islands.migrate_every",
            "the device loop does not migrate between Pareto fronts",
            "use islands.migrate_every=0",
        )
    num_parents = max(op.num_parents for op in operators)
    batch = islands * per_island
    # Host constants (numpy): building them with jnp would compile a small XLA program each.
    island_of = np.repeat(np.arange(islands, dtype=np.int32), per_island)
    log_weights = np.log(np.asarray([op.weight for op in operators], np.float32))

    def place(state: DeviceState, island, genome, fitness, descriptor, valid, ids, parents, migrants=False):
        """Inserts the candidates; winners' genomes and parents go to their cells."""
        if has_fronts:
            placed = fronts.place(
                spec,
                state.archive,
                (state.genomes, state.parents, state.migrant),
                island,
                genome,
                fitness,
                descriptor,
                valid,
                ids,
                parents,
                migrants,
            )
            archive, genomes, lineage, migrant = placed[:4]
            return join(state, archive, genomes, lineage, migrant, island, placed.opened, placed.result)
        archive, result = insert_batch(spec, state.archive, island, descriptor, fitness, ids, valid)
        cells = state.archive.num_cells
        target = jnp.where(result.is_elite, island * cells + result.cell, islands * cells)
        genomes = state.genomes.reshape(islands * cells, genome_dim).at[target].set(genome, mode="drop")
        lineage = state.parents.reshape(islands * cells, num_parents).at[target].set(parents, mode="drop")
        migrant = state.migrant.reshape(-1).at[target].set(migrants, mode="drop")
        new = result.is_elite & (result.status == NEW_CELL)
        return join(
            state,
            archive,
            genomes.reshape(state.genomes.shape),
            lineage.reshape(state.parents.shape),
            migrant.reshape(state.migrant.shape),
            island,
            new,
            result,
        )

    def join(state: DeviceState, archive, genomes, lineage, migrant, island, new, result):
        """The placed state; cells filled now (``new``: once each) join their island's list,
        after the cells it has."""
        cells = state.archive.num_cells
        one_hot = new[:, None] & (island[:, None] == jnp.arange(islands)[None])
        rank = jnp.sum(jnp.cumsum(one_hot, axis=0, dtype=jnp.int32) * one_hot, axis=1) - 1
        slot = jnp.where(new, island * cells + state.num_occupied[island] + rank, islands * cells)
        occupied = state.occupied.reshape(-1).at[slot].set(result.cell, mode="drop")
        return state._replace(
            archive=archive,
            genomes=genomes,
            parents=lineage,
            migrant=migrant,
            occupied=occupied.reshape(state.occupied.shape),
            num_occupied=state.num_occupied + jnp.sum(one_hot, axis=0, dtype=jnp.int32),
        ), result

    def draw(key: jax.Array) -> list[Any]:
        """One generation's noise, for every operator of the mix (each for all B children)."""
        return [
            op.draw(k, batch, genome_dim) for k, op in zip(jax.random.split(key, len(operators)), operators)
        ]

    def vary(key: jax.Array, parents: jax.Array, noise: list[Any]) -> jax.Array:
        """Children of f32[B, P, G] parents, each by an operator drawn by weight."""
        children = [op.apply(parents[:, : op.num_parents], n, **op.params) for op, n in zip(operators, noise)]
        if len(operators) == 1:
            return children[0]
        choice = jax.random.categorical(key, log_weights, shape=(batch,))
        return jnp.take_along_axis(jnp.stack(children), choice[None, :, None], axis=0)[0]

    def migrate(state: DeviceState, key: jax.Array) -> DeviceState:
        m = select_migrants(
            state.archive, key, migration.topology, migration.migrants, eligible=~state.migrant
        )
        genome = state.genomes[m.source_island, m.source_cell]
        parents = state.parents[m.source_island, m.source_cell]
        moved, _ = place(
            state, m.island, genome, m.fitness, m.descriptor, m.valid, m.genome_id, parents, True
        )
        return moved

    founders = _founder_slots(initial, islands, per_island, genome_dim)

    def generation(state: DeviceState, active: jax.Array, limit: jax.Array, noise: list[Any], keep: bool):
        """One generation if ``active``; otherwise the state unchanged and nothing counted.
        Candidates past evaluation number ``limit`` are not counted either (the budget's last
        generation is partial)."""
        key, k_select, k_vary, k_migrate = jax.random.split(state.key, 4)
        cell, has_elites = select_uniform(k_select, state, per_island * num_parents)
        cell = cell.reshape(islands, per_island, num_parents)
        source = jnp.arange(islands)[:, None, None]
        index = (source, cell)
        if has_fronts:  # its own key, so that a grid run draws what it always drew
            slot = fronts.pick_slots(jax.random.fold_in(k_select, 1), state.archive.genome_id, source, cell)
            index = (source, cell, slot)
        parents = state.genomes[index].reshape(batch, num_parents, genome_dim)
        parent_ids = state.archive.genome_id[index].reshape(batch, num_parents)
        first = state.generations == 0  # the founders: the task's initial genomes, as they are
        genome = jnp.where(first, founders.genome, vary(k_vary, parents, noise))
        parent_ids = jnp.where(first, -1, parent_ids)
        counted = active & jnp.where(first, founders.used, jnp.repeat(has_elites, per_island))
        number = state.evaluations + jnp.cumsum(
            counted, dtype=jnp.int32
        )  # 1-based evaluation number if counted
        counted = counted & (number <= limit)  # the budget, exactly: the last generation may be partial
        fitness, descriptor, valid = evaluate(genome)
        valid = valid & counted
        ids = jnp.where(counted, number - 1, -1)
        # An inactive generation places nothing (every candidate is invalid) and counts nothing.
        state, result = place(state, island_of, genome, fitness, descriptor, valid, ids, parent_ids)
        state = state._replace(
            key=jax.random.wrap_key_data(
                jnp.where(active, jax.random.key_data(key), jax.random.key_data(state.key))
            ),
            evaluations=state.evaluations + jnp.sum(counted, dtype=jnp.int32),
            generations=state.generations + active.astype(jnp.int32),
        )
        if migration is not None and migration.every > 0 and islands > 1:
            due = active & (state.generations % migration.every == 0)
            state = jax.lax.cond(due, migrate, lambda s, _: s, state, k_migrate)
        counts = CallStats(jnp.sum(result.status > 0, dtype=jnp.int32), jnp.sum(valid, dtype=jnp.int32))
        out = Candidates(genome, fitness, descriptor, valid, ids, island_of, parent_ids) if keep else None
        return state, (counts, out)

    options = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None

    @functools.partial(jax.jit, static_argnums=(3, 4), donate_argnums=(0,), compiler_options=options)
    def run(state: DeviceState, count: jax.Array, limit: jax.Array, generations: int, keep: bool):
        key, noise_key = jax.random.split(state.key)
        keys = jax.random.split(noise_key, generations)
        predraw = generations * batch * genome_dim <= PREDRAW_FLOATS
        noise = jax.vmap(draw)(keys) if predraw else keys

        def step(s, x):
            i, n = x
            return generation(s, i < count, limit, n if predraw else draw(n), keep)

        state, (counts, candidates) = jax.lax.scan(
            step, state._replace(key=key), (jnp.arange(generations), noise)
        )
        return state, CallStats(*(jnp.sum(c) for c in counts)), candidates

    def init(seed: int) -> DeviceState:
        """An empty run whose key is ``jax.random.key(seed)``, built on the host (nothing to compile)."""
        shape = (islands, spec.num_cells)
        host = DeviceState(
            **(
                fronts.empty_state(spec, islands, genome_dim, num_parents)
                if has_fronts
                else _empty_cells(spec, islands, genome_dim, num_parents)
            ),
            occupied=np.zeros(shape, np.int32),
            num_occupied=np.zeros((islands,), np.int32),
            key=None,
            evaluations=np.int32(0),
            generations=np.int32(0),
        )
        # jax.random.key(seed) is the (default, threefry) key [seed >> 32, seed & 0xffffffff].
        key = jax.random.wrap_key_data(np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32))
        return jax.device_put(host)._replace(key=key)

    return DeviceLoop(init, run)


def _empty_cells(spec: CellSpec, islands: int, genome_dim: int, num_parents: int) -> dict[str, np.ndarray]:
    """A new grid or CVT run's archive and per-cell arrays on the host."""
    shape = (islands, spec.num_cells)
    return {
        "archive": ArchiveState(
            fitness=np.full(shape, -np.inf, np.float32),
            descriptor=np.zeros((*shape, spec.descriptor_dim), np.float32),
            genome_id=np.full(shape, EMPTY_ID, np.int32),
            threshold=np.full(shape, spec.threshold_min, np.float32),
            threshold_min=np.float32(spec.threshold_min),
        ),
        "genomes": np.zeros((*shape, genome_dim), np.float32),
        "parents": np.full((*shape, num_parents), -1, np.int32),
        "migrant": np.zeros(shape, bool),
    }
