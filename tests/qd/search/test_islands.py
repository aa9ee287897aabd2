"""Island dynamics: one-hop migration, resets of stagnant islands, bookkeeping, and
their history in the store (rebuilds and resumes replay resets).

Shapes are kept to one archive (4 islands x 20 cells) and one padded batch size so
the jitted functions compile only a few times.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa
from qd.search import islands
from qd.store import Candidate, Store

SPEC = qa.GridSpec.create((5, 4), (-1.0, 0.0), (1.0, 2.0))  # 20 cells
ISLANDS, CELLS = 4, 20
PAD = 16  # every test batch is padded to this size (one compile of ``record``)
KEY = jax.random.key(0)
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _centre(cell: int) -> np.ndarray:
    coords = np.unravel_index(cell, SPEC.bins)
    lower, upper = np.asarray(SPEC.lower), np.asarray(SPEC.upper)
    width = (upper - lower) / np.asarray(SPEC.bins)
    return (lower + (np.asarray(coords) + 0.5) * width).astype(np.float32)


CENTRES = np.stack([_centre(c) for c in range(CELLS)])


def _pad(x: np.ndarray) -> np.ndarray:
    return np.pad(np.asarray(x), [(0, PAD - len(x))] + [(0, 0)] * (np.ndim(x) - 1))


def _offer(state, istate, island, cells, fitness, ids, valid=None):
    """Inserts candidates and records them, the batch padded to PAD rows."""
    island = np.broadcast_to(np.asarray(island, np.int32), (len(ids),))
    state, result = qa.insert(
        SPEC, state, island, CENTRES[cells], np.asarray(fitness, np.float32), np.asarray(ids), valid
    )
    istate = islands.record(
        istate, state, _pad(island), jax.tree_util.tree_map(_pad, result), _pad(np.ones(len(ids), bool))
    )
    return state, istate, result


def _host(tree):
    return jax.tree_util.tree_map(np.array, jax.device_get(tree))


def _device(tree):
    return jax.tree_util.tree_map(jnp.asarray, tree)


def _holdings(state) -> list[set[int]]:
    ids = np.asarray(state.genome_id)
    return [set(row[row >= 0].tolist()) for row in ids]


def _assert_trees_equal(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _world(fitness_by_island, cells_per_island=3):
    """Island i holds ids 100*i + j in cells 5*i + j with the given fitness (each
    island's candidates offered once: since_migration = cells_per_island)."""
    state, istate = qa.init(SPEC, ISLANDS), islands.init(ISLANDS, CELLS)
    for i, fitness in enumerate(fitness_by_island):
        j = np.arange(cells_per_island)
        state, istate, _ = _offer(state, istate, i, 5 * i + j, fitness, 100 * i + j)
    return state, istate


# ---------------------------------------------------------------------- migration


def test_ring_migrants_travel_one_hop_and_are_never_sent_again():
    # Island 0's and 3's elites are the strongest anywhere, so once received they
    # are the receivers' top elites: only the migrant rule keeps them from moving on.
    state, istate = _world([[10, 9, 8], [3, 2, 1], [3, 2, 1], [20, 19, 18]])
    state, istate, m, result = islands.migrate(SPEC, state, istate, KEY, "ring", 2, 3)
    sent = np.asarray(m.genome_id)[np.asarray(m.valid)]
    np.testing.assert_array_equal(sent, [0, 1, 100, 101, 200, 201, 300, 301])
    np.testing.assert_array_equal(np.asarray(m.island)[np.asarray(m.valid)], [1, 1, 2, 2, 3, 3, 0, 0])
    assert np.asarray(result.is_elite).sum() == 8
    assert _holdings(state) == [
        {0, 1, 2, 300, 301},
        {100, 101, 102, 0, 1},
        {200, 201, 202, 100, 101},
        {300, 301, 302, 200, 201},
    ]
    np.testing.assert_array_equal(istate.since_migration, 0)
    # Exactly the received cells are migrants: ids whose home island is elsewhere.
    ids = np.asarray(state.genome_id)
    home = np.where(ids >= 0, ids // 100, -1)
    np.testing.assert_array_equal(istate.migrant, (ids >= 0) & (home != np.arange(4)[:, None]))

    # Round 2 after three more (weak) candidates per island.
    for i in range(ISLANDS):
        state, istate, _ = _offer(
            state, istate, i, [5 * i + 3] * 3, [0.5, 0.4, 0.3], [1000 + 10 * i + j for j in range(3)]
        )
    state, istate, m, _ = islands.migrate(SPEC, state, istate, KEY, "ring", 2, 3)
    valid = np.asarray(m.valid)
    sent, source = np.asarray(m.genome_id)[valid], np.asarray(m.source_island)[valid]
    np.testing.assert_array_equal(sent // 100, source)  # only home-grown elites travel
    np.testing.assert_array_equal(sent, [0, 1, 100, 101, 200, 201, 300, 301])
    held = _holdings(state)
    assert not held[2] & {0, 1} and not held[1] & {300, 301}  # no second hop
    assert not held[0] & {100, 101}  # nothing comes back


def test_only_islands_due_send():
    state, istate = _world([[3, 2, 1]] * ISLANDS)
    # Islands 0 and 2 have 3 + 2 offers since they last sent, 1 and 3 only 3.
    for i in (0, 2):
        state, istate, _ = _offer(state, istate, i, [5 * i + 4] * 2, [0.0, 0.0], [50 + i, 60 + i])
    before = _host(state)
    state, istate, m, _ = islands.migrate(SPEC, state, istate, KEY, "ring", 2, 5)
    valid = np.asarray(m.valid)
    assert set(np.asarray(m.source_island)[valid].tolist()) == {0, 2}
    np.testing.assert_array_equal(istate.since_migration, [0, 3, 0, 3])
    assert _holdings(state) == [
        _holdings(before)[0],
        _holdings(before)[1] | {0, 1},
        _holdings(before)[2],
        _holdings(before)[3] | {200, 201},
    ]


def test_migration_with_one_island_sends_nothing():
    state, istate = qa.init(SPEC, 1), islands.init(1, CELLS)
    state, istate, _ = _offer(state, istate, 0, [1, 2], [1.0, 2.0], [1, 2])
    before = _host(state)
    state, istate, m, _ = islands.migrate(SPEC, state, istate, KEY, "ring", 2, 0)
    assert not np.asarray(m.valid).any()
    _assert_trees_equal(state, before)


@st.composite
def _archive(draw):
    """A random archive (each elite in its descriptor's cell) with random marks."""
    filled = np.asarray(
        draw(st.lists(st.booleans(), min_size=ISLANDS * CELLS, max_size=ISLANDS * CELLS))
    ).reshape(ISLANDS, CELLS)
    values = draw(st.lists(st.integers(-3, 3), min_size=ISLANDS * CELLS, max_size=ISLANDS * CELLS))
    fitness = np.where(filled, np.asarray(values, np.float32).reshape(ISLANDS, CELLS), -np.inf)
    fitness = fitness.astype(np.float32)
    state = qa.ArchiveState(
        fitness=fitness,
        descriptor=np.where(filled[..., None], CENTRES[None], 0.0).astype(np.float32),
        genome_id=np.where(filled, np.arange(ISLANDS * CELLS).reshape(ISLANDS, CELLS), -1).astype(np.int32),
        threshold=fitness,
        threshold_min=np.float32(-np.inf),
    )
    marks = np.asarray(
        draw(st.lists(st.booleans(), min_size=ISLANDS * CELLS, max_size=ISLANDS * CELLS))
    ).reshape(ISLANDS, CELLS)
    since = np.asarray(draw(st.lists(st.integers(0, 4), min_size=ISLANDS, max_size=ISLANDS)), np.int32)
    istate = islands.IslandState(marks & filled, fitness.max(1), np.int32(0), since)
    return state, istate


@PROPERTY
@given(case=_archive(), topology=st.sampled_from(qa.TOPOLOGIES), seed=st.integers(0, 3))
def test_migration_never_lowers_a_cell_and_sends_only_due_home_grown_elites(case, topology, seed):
    before, ibefore = case
    state, istate, m, result = islands.migrate(
        SPEC, _device(before), _device(ibefore), jax.random.key(seed), topology, 2, 2
    )
    assert np.all(np.asarray(state.fitness) >= before.fitness)
    valid = np.asarray(m.valid)
    source, cell = np.asarray(m.source_island)[valid], np.asarray(m.source_cell)[valid]
    assert not ibefore.migrant[source, cell].any()
    assert np.all(ibefore.since_migration[source] >= 2)
    assert np.all(np.asarray(m.island)[valid] != source)
    due = ibefore.since_migration >= 2
    np.testing.assert_array_equal(istate.since_migration, np.where(due, 0, ibefore.since_migration))
    # A cell changed only by a migrant, which is then marked; other marks stay.
    changed = np.asarray(state.genome_id) != before.genome_id
    np.testing.assert_array_equal(np.asarray(istate.migrant), ibefore.migrant | changed)


# -------------------------------------------------------------------------- reset


def _stagnant_world():
    """Island bests 5, 1, 7, 3 (islands 1 and 3 are the weaker half); stale = 6."""
    state, istate = _world([[5, 4.5], [1, 0.5], [7, 6.5], [3, 2.5]], cells_per_island=2)
    assert int(istate.stale) == 2  # islands 0 and 2 raised the global best, 3 did not
    return _offer(state, istate, 1, [7, 7, 8, 8], [0.0, 0.1, 0.2, 0.3], [40, 41, 42, 43])[:2]


def test_reset_empties_the_weakest_half_and_reseeds_from_survivors():
    state, istate = _stagnant_world()
    assert int(istate.stale) == 6
    before, ibefore = _host(state), _host(istate)
    # Not yet stagnant for patience 10: nothing changes.
    state, istate, reset, m, _ = islands.reset_stagnant(SPEC, state, istate, KEY, 10)
    assert not np.asarray(reset).any() and not np.asarray(m.valid).any()
    _assert_trees_equal(state, before)
    _assert_trees_equal(istate, ibefore)

    state, istate, _ = _offer(state, istate, 3, [18, 19, 18, 19], [0.0] * 4, [50, 51, 52, 53])
    assert int(istate.stale) == 10
    before, ibefore = _host(state), _host(istate)
    state, istate, reset, m, result = islands.reset_stagnant(SPEC, state, istate, KEY, 10)
    np.testing.assert_array_equal(reset, [False, True, False, True])
    after, iafter = _host(state), _host(istate)
    for i in (0, 2):  # survivors: bit for bit
        for field in qa.ArchiveState._fields[:4]:
            np.testing.assert_array_equal(getattr(after, field)[i], getattr(before, field)[i])
        for field in ("migrant", "best", "since_migration"):
            np.testing.assert_array_equal(getattr(iafter, field)[i], getattr(ibefore, field)[i])
    best_elite = {0: (0, 0, 5.0), 2: (200, 10, 7.0)}  # survivor -> (id, cell, fitness)
    for i in (1, 3):
        (cell,) = np.flatnonzero(after.genome_id[i] >= 0)
        source = int(np.asarray(m.source_island)[i])
        assert source in best_elite
        assert (after.genome_id[i, cell], cell, after.fitness[i, cell]) == best_elite[source]
        np.testing.assert_array_equal(after.descriptor[i, cell], before.descriptor[source, cell])
        np.testing.assert_array_equal(iafter.migrant[i], np.arange(CELLS) == cell)
        assert iafter.best[i] == best_elite[source][2]
    np.testing.assert_array_equal(np.asarray(m.valid), reset)
    np.testing.assert_array_equal(np.asarray(result.is_elite), reset)
    assert int(istate.stale) == 0 and iafter.since_migration.tolist() == ibefore.since_migration.tolist()
    # Right after a reset, nothing is stale.
    _, _, again, _, _ = islands.reset_stagnant(SPEC, state, istate, KEY, 10)
    assert not np.asarray(again).any()


def test_reseed_sources_are_uniform_over_survivors_and_ties_reset_lower_islands():
    state, istate = _stagnant_world()
    host, ihost = _host(state), _host(istate)
    sources = set()
    for seed in range(12):
        _, _, reset, m, _ = islands.reset_stagnant(
            SPEC, _device(host), _device(ihost), jax.random.key(seed), 4
        )
        np.testing.assert_array_equal(reset, [False, True, False, True])
        sources |= set(np.asarray(m.source_island)[np.asarray(reset)].tolist())
    assert sources == {0, 2}
    tied = ihost._replace(best=np.full(ISLANDS, 2.0, np.float32))
    _, _, reset, _, _ = islands.reset_stagnant(SPEC, _device(host), _device(tied), KEY, 4)
    np.testing.assert_array_equal(reset, [True, True, False, False])


def test_reset_with_one_island_does_nothing():
    state, istate = qa.init(SPEC, 1), islands.init(1, CELLS)
    state, istate, _ = _offer(state, istate, 0, [1, 2], [1.0, 2.0], [1, 2])
    istate = istate._replace(stale=jnp.int32(100))
    before = _host(state)
    state, istate, reset, m, _ = islands.reset_stagnant(SPEC, state, istate, KEY, 1)
    assert not np.asarray(reset).any() and not np.asarray(m.valid).any()
    _assert_trees_equal(state, before)
    assert int(istate.stale) == 100


@PROPERTY
@given(case=_archive(), seed=st.integers(0, 3))
def test_reset_never_touches_survivors(case, seed):
    before, ibefore = case
    ibefore = ibefore._replace(stale=np.int32(5))
    state, istate, reset, _, _ = islands.reset_stagnant(
        SPEC, _device(before), _device(ibefore), jax.random.key(seed), 5
    )
    reset = np.asarray(reset)
    assert reset.sum() == ISLANDS // 2
    weakest = np.argsort(ibefore.best, kind="stable")[: ISLANDS // 2]
    assert set(np.flatnonzero(reset).tolist()) == set(weakest.tolist())
    for got, want in zip(state[:4], before[:4]):
        np.testing.assert_array_equal(np.asarray(got)[~reset], want[~reset])
    np.testing.assert_array_equal(np.asarray(istate.migrant)[~reset], ibefore.migrant[~reset])
    assert np.all((np.asarray(state.genome_id)[reset] >= 0).sum(1) <= 1)


def test_migration_and_reset_work_on_a_novelty_archive():
    spec = qa.NoveltySpec(capacity=8, descriptor_dim=2, k=2, threshold=0.1)
    state, istate = qa.init(spec, ISLANDS), islands.init(ISLANDS, 8)
    island = np.arange(ISLANDS)
    state, result = qa.insert(
        spec, state, island, np.arange(8, dtype=np.float32).reshape(4, 2), [1.0, 2.0, 3.0, 4.0], island
    )
    istate = islands.record(istate, state, island, result, np.ones(ISLANDS, bool))
    state, istate, m, result = islands.migrate(spec, state, istate, KEY, "ring", 1, 1)
    assert _holdings(state) == [{0, 3}, {1, 0}, {2, 1}, {3, 2}]
    assert np.asarray(istate.migrant).sum() == 4  # one received elite per island
    state, istate, reset, m, _ = islands.reset_stagnant(
        spec, state, istate._replace(stale=jnp.int32(9)), KEY, 9
    )
    # Bests 4, 2, 3, 4: islands 1 and 2 go; both survivors' best elite is id 3.
    np.testing.assert_array_equal(reset, [False, True, True, False])
    assert _holdings(state) == [{0, 3}, {3}, {3}, {3, 2}]


def test_migration_reset_and_replay_work_on_pareto_fronts():
    """Front members migrate and reseed through the same functions (the one with the largest
    first objective goes), a migrant marks its cell, and a replay of that history rebuilds it."""
    spec = qa.ParetoSpec(SPEC, front_size=2, num_objectives=2)
    values = np.asarray([[4.0, 0.0], [1.0, 2.0], [2.0, 0.0], [3.0, 0.0], [1.0, 0.0]], np.float32)
    island, cells = np.asarray([0, 0, 1, 2, 3], np.int32), [3, 3, 5, 7, 9]
    state, result = qa.insert(
        spec, qa.kinds.init(spec, ISLANDS), island, CENTRES[cells], values, np.arange(5)
    )
    pad = jax.tree_util.tree_map(_pad, result)
    istate = islands.record(islands.init(ISLANDS, CELLS), state, _pad(island), pad, _pad(np.ones(5, bool)))
    np.testing.assert_array_equal(istate.best, [4.0, 2.0, 3.0, 1.0])  # each island's best first objective
    istate = istate._replace(since_migration=jnp.asarray([1, 0, 0, 0], jnp.int32))
    state, istate, m, _ = islands.migrate(spec, state, istate, KEY, "ring", 1, 1)
    sent = np.asarray(m.valid)
    assert np.asarray(m.genome_id)[sent].tolist() == [0] and np.asarray(m.source_cell)[sent].tolist() == [3]
    target = int(np.asarray(m.island)[sent][0])
    assert np.asarray(state.genome_id)[target, 3].tolist() == [0, -1]
    assert np.argwhere(np.asarray(istate.migrant)).tolist() == [[target, 3]]
    state, istate, reset, m, _ = islands.reset_stagnant(
        spec, state, istate._replace(stale=jnp.int32(9)), KEY, 9
    )
    weak = np.flatnonzero(np.asarray(reset)).tolist()
    assert len(weak) == 2 and target not in weak and 0 not in weak
    for i in weak:  # each reseeded with the survivors' best member: id 0, scalar 4
        assert set(np.asarray(state.genome_id)[i].ravel().tolist()) == {-1, 0}
    copies = [target, *weak]
    offers = {
        "island": np.asarray([0, 0, 1, 2, 3, *copies], np.int32),
        "descriptor": CENTRES[[3, 3, 5, 7, 9, 3, 3, 3]],
        "fitness": values[[0, 1, 2, 3, 4, 0, 0, 0]],
        "id": np.asarray([0, 1, 2, 3, 4, 0, 0, 0]),
        "valid": np.ones(8, bool),
        "migrated": np.asarray([False] * 5 + [True] * 3),
        "reset": np.zeros(0, np.int64),
    }
    keep = ~np.isin(offers["island"], weak) | offers["migrated"]  # offers to a reset island are dropped
    offers = {k: v if k == "reset" else v[keep] for k, v in offers.items()}
    replayed, ireplayed, _ = islands.replay(
        spec, qa.kinds.init(spec, ISLANDS), islands.init(ISLANDS, CELLS), offers
    )
    _assert_trees_equal(replayed, state)
    np.testing.assert_array_equal(ireplayed.migrant, istate.migrant)


def test_migration_and_replay_insert_with_the_spec_cma_mae_settings():
    """Migrants and replayed offers go in under the spec's learning rate and threshold_min
    (soft thresholds), as live inserts do: no setting travels beside the spec."""
    spec = dataclasses.replace(SPEC, learning_rate=0.5, threshold_min=0.0)
    state, _ = qa.insert(spec, qa.init(spec, ISLANDS), 0, CENTRES[[3]], [4.0], [7])
    istate = islands.init(ISLANDS, CELLS)._replace(since_migration=jnp.asarray([1, 0, 0, 0], jnp.int32))
    state, istate, m, result = islands.migrate(spec, state, istate, KEY, "ring", 1, 1)
    assert np.asarray(result.is_elite).sum() == 1
    # (1 - 0.5) * 0 + 0.5 * 4 on both islands; a hard threshold would be 4.
    np.testing.assert_array_equal(np.asarray(state.threshold)[:2, 3], [2.0, 2.0])
    offers = {
        "island": np.zeros(2, np.int32),
        "descriptor": CENTRES[[3, 3]],
        "fitness": np.asarray([4.0, 6.0], np.float32),
        "id": np.asarray([1, 2]),
        "valid": np.ones(2, bool),
        "migrated": np.zeros(2, bool),
        "reset": np.zeros(0, np.int64),
    }
    replayed, _, _ = islands.replay(spec, qa.init(spec, ISLANDS), islands.init(ISLANDS, CELLS), offers)
    # Two accepted in one batch: (1 - 0.5)^2 * 0 + (1 - 0.25) * mean(4, 6).
    assert float(np.asarray(replayed.threshold)[0, 3]) == 3.75
    rebuilt = qa.rebuild(
        spec, ISLANDS, offers["island"], offers["descriptor"], offers["fitness"], offers["id"]
    )
    _assert_trees_equal(rebuilt, replayed)


# ------------------------------------------------------------------------- record


def test_record_clears_the_mark_when_a_fresh_candidate_takes_a_migrant_cell():
    state, istate = _world([[5, 4, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
    state, istate, _, _ = islands.migrate(SPEC, state, istate, KEY, "ring", 1, 3)
    assert istate.migrant[1, 0]  # id 0 (fitness 5) arrived in island 1, cell 0
    state, istate, _ = _offer(state, istate, 1, [0], [4.0], [70])  # worse: the migrant stays
    assert istate.migrant[1, 0] and int(state.genome_id[1, 0]) == 0
    state, istate, _ = _offer(state, istate, 1, [0], [6.0], [71])
    assert not istate.migrant[1, 0] and int(state.genome_id[1, 0]) == 71
    assert np.asarray(istate.migrant).sum() == 3  # the other received elites keep theirs


def test_record_counts_failed_candidates_but_not_padding():
    state, istate = qa.init(SPEC, ISLANDS), islands.init(ISLANDS, CELLS)
    state, istate, _ = _offer(
        state, istate, [0, 0, 2], [1, 2, 3], [1.0, np.nan, 2.0], [0, 1, 2], valid=[True, False, True]
    )
    np.testing.assert_array_equal(istate.since_migration, [2, 0, 1, 0])  # 13 padding rows on island 0
    np.testing.assert_array_equal(istate.best, [1.0, -np.inf, 2.0, -np.inf])
    assert int(istate.stale) == 0
    state, istate, _ = _offer(state, istate, 1, [4], [0.5], [3])
    assert int(istate.stale) == 1  # the global best did not move


# -------------------------------------------------------------------------- store


def _candidates(island, fitness, cells):
    return [
        Candidate(
            kind="vector",
            island=int(i),
            fitness=float(f),
            descriptor=CENTRES[c],
            valid=bool(np.isfinite(f)),
            vector=np.zeros(1, np.float32),
        )
        for i, f, c in zip(island, fitness, cells)
    ]


def test_placements_drop_offers_to_an_island_before_its_reset(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.add(_candidates([0, 1, 2], [1, 2, 3], [0, 1, 2]))  # ids 0-2
        store.add_migrations(after_id=2, genome_id=[0, 2], island=[1, 0])
        store.add_reset(after_id=2, islands=[1])
        store.add_migrations(after_id=2, genome_id=[2], island=[1])  # the reseed
        store.add(_candidates([1, 0], [4, 5], [3, 4]))  # ids 3, 4
        offers = store.placements()
        # Gone: candidate 1 and migrant 0, offered to island 1 before its reset.
        assert offers["id"].tolist() == [0, 2, 2, 2, 3, 4]
        assert offers["island"].tolist() == [0, 2, 0, 1, 1, 0]
        assert offers["migrated"].tolist() == [False, False, True, True, False, False]
        assert offers["reset"].tolist() == [1]
        later = store.placements(after_id=2)  # a resume from a checkpoint at id 2
        assert later["id"].tolist() == [3, 4] and later["reset"].tolist() == []
        earlier = store.placements(after_id=1)
        assert earlier["id"].tolist() == [2, 2, 2, 3, 4] and earlier["reset"].tolist() == [1]
        # Without resets, nothing changes.
        assert store.placements(after_id=3)["reset"].size == 0


@pytest.mark.parametrize("checkpoint_at", [0, 1, 2])
def test_rebuild_and_resume_from_the_store_equal_the_live_archive(tmp_path, checkpoint_at):
    """A live run (inserts, migrations, a reset and its reseeds) is rebuilt from the
    store alone, and resumed from a checkpoint taken after step ``checkpoint_at``."""
    rng = np.random.default_rng(checkpoint_at)
    store = Store(tmp_path / "s.sqlite")
    state, istate = qa.init(SPEC, ISLANDS), islands.init(ISLANDS, CELLS)
    key, checkpoint = KEY, None
    for step in range(3):
        for _ in range(2):
            n = 12
            island = rng.integers(0, ISLANDS, n)
            # Island 1 and 3 weaker; some failed evaluations.
            fitness = rng.normal(size=n) + np.where(island % 2, -3.0, 0.0)
            fitness[rng.random(n) < 0.1] = np.nan
            cells = rng.integers(0, CELLS, n)
            ids = store.add(_candidates(island, fitness, cells))
            state, istate, _ = _offer(
                state, istate, island, cells, np.nan_to_num(fitness, nan=0.0), ids, valid=np.isfinite(fitness)
            )
        after = store.last_id()
        key, k1, k2 = jax.random.split(key, 3)
        state, istate, m, _ = islands.migrate(SPEC, state, istate, k1, "ring", 2, 5)
        valid = np.asarray(m.valid)
        store.add_migrations(after, np.asarray(m.genome_id)[valid], np.asarray(m.island)[valid])
        if step == 1:
            state, istate, reset, m, _ = islands.reset_stagnant(SPEC, state, istate, k2, 0)
            assert np.asarray(reset).sum() == 2
            store.add_reset(after, np.flatnonzero(np.asarray(reset)))
            valid = np.asarray(m.valid)
            store.add_migrations(after, np.asarray(m.genome_id)[valid], np.asarray(m.island)[valid])
        if step == checkpoint_at:
            checkpoint = (_host(state), _host(istate), after)

    offers = store.placements()
    assert offers["reset"].size == 2
    rebuilt = qa.rebuild(
        SPEC,
        ISLANDS,
        offers["island"],
        offers["descriptor"],
        offers["fitness"],
        offers["id"],
        offers["valid"],
    )
    _assert_trees_equal(rebuilt, state)
    replayed, ireplayed, _ = islands.replay(
        SPEC, qa.init(SPEC, ISLANDS), islands.init(ISLANDS, CELLS), offers
    )
    _assert_trees_equal(replayed, state)
    np.testing.assert_array_equal(ireplayed.migrant, istate.migrant)
    np.testing.assert_array_equal(ireplayed.best, istate.best)

    saved, isaved, after = checkpoint
    resumed, iresumed, _ = islands.replay(SPEC, _device(saved), _device(isaved), store.placements(after))
    _assert_trees_equal(resumed, state)
    np.testing.assert_array_equal(iresumed.migrant, istate.migrant)
    store.close()
