"""k-NN novelty at scale and the novelty archive kind (NoveltySpec).

The k-NN search is checked against a float64 NumPy brute force, including block and
chunk boundaries; the archive against a loop-based NumPy reference of the rules on
:class:`qd.archive.NoveltySpec`, and against pyribs's ProximityArchive where the
capacity does not bind. Shapes are kept few so the jitted functions compile rarely.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_knn = jax.jit(qa.knn, static_argnums=(4, 5, 6))


def _brute_force_knn(query, query_group, stored, stored_group, k):
    """f64[B, kk] sorted distances to the k nearest entries of the same group."""
    dist = np.linalg.norm(query[:, None].astype(np.float64) - stored[None].astype(np.float64), axis=-1)
    dist = np.where(query_group[:, None] == stored_group[None], dist, np.inf)
    return np.sort(dist, axis=1)[:, : min(k, len(stored))]


def _assert_same_knn(dist, ref, rtol=1e-6, atol=1e-6):
    dist = np.sort(np.asarray(dist), axis=1)
    np.testing.assert_array_equal(np.isinf(dist), np.isinf(ref))
    np.testing.assert_allclose(
        np.where(np.isinf(dist), 0, dist), np.where(np.isinf(ref), 0, ref), rtol=rtol, atol=atol
    )


# ---------------------------------------------------------------------- k-NN core

QUARTERS = st.integers(-40, 40).map(lambda v: v / 4)  # exact squares: exact ties


@PROPERTY
@given(
    stored=st.lists(st.tuples(QUARTERS, QUARTERS, QUARTERS), min_size=45, max_size=45),
    stored_group=st.lists(st.integers(-1, 1), min_size=45, max_size=45),
    query=st.lists(st.tuples(QUARTERS, QUARTERS, QUARTERS), min_size=12, max_size=12),
    query_group=st.lists(st.integers(-2, 1), min_size=12, max_size=12),
    k=st.sampled_from([1, 4, 15]),
    blocks=st.sampled_from([(1024, 8192), (5, 16), (12, 40)]),
)
def test_knn_matches_brute_force(stored, stored_group, query, query_group, k, blocks):
    # Blocks of 5 queries and chunks of 16 or 40 entries (with a tail) exercise the
    # query blocking, the chunk scan, the tail chunk and the two-stage top-k.
    stored, query = np.asarray(stored, np.float32), np.asarray(query, np.float32)
    sg, qg = np.asarray(stored_group, np.int32), np.asarray(query_group, np.int32)
    dist, index = _knn(query, qg, stored, sg, k, *blocks)
    ref = _brute_force_knn(query, qg, stored, sg, k)
    _assert_same_knn(dist, ref)
    # The indices point at entries of the query's group at the reported distance.
    dist, index = np.asarray(dist), np.asarray(index)
    found = np.isfinite(dist)
    rows = np.nonzero(found)[0]
    assert np.all(sg[index[found]] == qg[rows])
    direct = np.linalg.norm(stored[index[found]] - query[rows], axis=1)
    np.testing.assert_allclose(dist[found], direct, rtol=1e-6, atol=1e-6)


def test_knn_high_dimension_several_chunks():
    rng = np.random.default_rng(0)
    stored = rng.normal(size=(3000, 64)).astype(np.float32) + 50.0  # far from the origin
    query = stored[rng.integers(0, 3000, 300)] + 0.05 * rng.normal(size=(300, 64)).astype(np.float32)
    qg, sg = np.zeros(300, np.int32), np.zeros(3000, np.int32)
    dist, _ = _knn(query, qg, stored, sg, 15, 128, 512)
    _assert_same_knn(dist, _brute_force_knn(query, qg, stored, sg, 15), rtol=1e-5, atol=1e-5)


def test_knn_memory_is_bounded_at_scale():
    # 1,024 queries x 100,000 stored x 384-D: a [B, N, D] difference would be 157 GB
    # and a [B, N] distance matrix 410 MB.
    lowered = _knn.lower(
        jax.ShapeDtypeStruct((1024, 384), np.float32),
        jax.ShapeDtypeStruct((1024,), np.int32),
        jax.ShapeDtypeStruct((100_000, 384), np.float32),
        jax.ShapeDtypeStruct((100_000,), np.int32),
        15,
        1024,
        8192,
    )
    memory = lowered.compile().memory_analysis()
    assert memory.temp_size_in_bytes < 300 * 2**20, memory


def test_novelty_of_a_ring_buffer_matches_brute_force():
    rng = np.random.default_rng(1)
    state = qa.novelty_init(64, 5)
    entries = rng.normal(size=(40, 5)).astype(np.float32)
    state, _, _ = qa.novelty_add(
        state, entries, np.zeros(40, np.float32), np.arange(40, dtype=np.int32), -np.inf, 3
    )
    query = rng.normal(size=(7, 5)).astype(np.float32)
    ref = _brute_force_knn(query, np.zeros(7), entries, np.zeros(40), 3).mean(axis=1)
    np.testing.assert_allclose(np.asarray(qa.novelty(state, query, 3)), ref, rtol=1e-5)


# ------------------------------------------------------------ reference archive


def _reference_insert(spec, arrays, island, descriptor, fitness, genome_id, valid):
    """Loop-based NumPy version of the NoveltySpec rules, for one batch.

    ``arrays`` is (fitness f32[I, C], descriptor f32[I, C, D], genome_id i32[I, C]);
    returns the new arrays and (status, is_elite, cell, novelty) per candidate.
    """
    fit0, desc0, id0 = arrays
    fit, desc, ids = fit0.copy(), desc0.copy(), id0.copy()
    num_islands, capacity = fit0.shape
    size = len(fitness)
    status = np.zeros(size, int)
    is_elite = np.zeros(size, bool)
    cell = np.zeros(size, int)
    score = np.full(size, np.nan)
    nearest = np.full(size, -1)
    ok = [
        bool(valid[b])
        and genome_id[b] >= 0
        and np.isfinite(fitness[b])
        and np.all(np.isfinite(descriptor[b]))
        and 0 <= island[b] < num_islands
        for b in range(size)
    ]
    for b in range(size):
        if not ok[b]:
            continue
        filled = np.flatnonzero(id0[island[b]] >= 0)
        if len(filled) == 0:
            score[b] = np.inf
            continue
        d = np.linalg.norm(desc0[island[b], filled].astype(np.float64) - descriptor[b], axis=1)
        score[b] = np.sort(d)[: spec.k].mean()
        nearest[b] = filled[np.flatnonzero(d == d.min())[0]]
        cell[b] = nearest[b]
    novel = np.asarray([ok[b] and score[b] > spec.threshold for b in range(size)])
    replaced = np.zeros((num_islands, capacity), bool)
    if spec.local_competition:
        for b in range(size):
            if ok[b] and not novel[b] and nearest[b] >= 0 and fitness[b] > fit0[island[b], nearest[b]]:
                status[b] = 1
        for i in range(num_islands):
            for slot in range(capacity):
                rivals = [b for b in range(size) if status[b] == 1 and island[b] == i and nearest[b] == slot]
                if rivals:
                    best = max(rivals, key=lambda b: (fitness[b], -b))
                    is_elite[best] = True
                    replaced[i, slot] = True
                    fit[i, slot], desc[i, slot], ids[i, slot] = (
                        fitness[best],
                        descriptor[best],
                        genome_id[best],
                    )
    for i in range(num_islands):
        free = sorted((s for s in range(capacity) if not replaced[i, s]), key=lambda s: (id0[i, s], s))
        mine = [b for b in range(size) if novel[b] and island[b] == i]
        for b in mine:
            status[b] = 2
        kept = mine[max(len(mine) - len(free), 0) :]
        for slot, b in zip(free, kept):
            is_elite[b] = True
            cell[b] = slot
            fit[i, slot], desc[i, slot], ids[i, slot] = fitness[b], descriptor[b], genome_id[b]
    return (fit, desc, ids), (status, is_elite, cell, score)


def _arrays(state):
    return tuple(np.asarray(x) for x in (state.fitness, state.descriptor, state.genome_id))


def _candidates(draw_batch, next_id):
    island, desc, fit, valid = (np.asarray(x) for x in zip(*draw_batch))
    return (
        island.astype(np.int32),
        np.asarray(desc.tolist(), np.float32),
        fit.astype(np.float32),
        np.arange(next_id, next_id + len(fit), dtype=np.int32),
        valid.astype(bool),
    )


CANDIDATE = st.tuples(
    st.integers(-1, 2),  # island (2 islands; -1 and 2 are out of range)
    st.tuples(QUARTERS, QUARTERS),
    st.one_of(st.integers(0, 8).map(float), st.just(float("nan"))),
    st.booleans() | st.just(True),
)


@PROPERTY
@given(
    batches=st.lists(st.lists(CANDIDATE, min_size=1, max_size=12), min_size=1, max_size=4),
    threshold=st.sampled_from([0.0, 0.5, 2.0]),
    local_competition=st.booleans(),
)
def test_insert_matches_the_reference(batches, threshold, local_competition):
    spec = qa.NoveltySpec(
        capacity=5, descriptor_dim=2, k=2, threshold=threshold, local_competition=local_competition
    )
    state = qa.init(spec, 2)
    arrays = _arrays(state)
    next_id = 0
    for batch in batches:
        cand = _candidates(batch, next_id)
        next_id += len(batch)
        arrays, (status, is_elite, cell, score) = _reference_insert(spec, arrays, *cand)
        state, result, novelty = qa.novelty_insert(spec, state, *cand)
        np.testing.assert_array_equal(result.status, status)
        np.testing.assert_array_equal(result.is_elite, is_elite)
        np.testing.assert_array_equal(result.cell[is_elite], cell[is_elite])
        np.testing.assert_allclose(novelty, score, rtol=1e-6)
        for ours, ref in zip(_arrays(state), arrays):
            np.testing.assert_array_equal(ours, ref)


# ------------------------------------------------------------------ behaviours

SPEC_1D = qa.NoveltySpec(capacity=4, descriptor_dim=1, k=1, threshold=1.0)


def _insert(spec, state, descriptor, fitness, ids, island=0, valid=None):
    return qa.insert(
        spec,
        state,
        island,
        np.asarray(descriptor, np.float32).reshape(len(ids), -1),
        np.asarray(fitness, np.float32),
        np.asarray(ids, np.int32),
        valid,
    )


def test_pure_novelty_adds_only_novel_candidates():
    state = qa.init(SPEC_1D, 1)
    state, r = _insert(SPEC_1D, state, [0.0, 10.0], [1, 1], [0, 1])
    assert r.status.tolist() == [2, 2]  # empty archive: everything is novel
    state, r = _insert(SPEC_1D, state, [0.5, 5.0, 5.0], [9, 1, 1], [2, 3, 4])
    # 0.5 is within the threshold of 0 (and no local competition: not added even if
    # fitter); two identical novel candidates are both judged against the archive
    # before the batch, so both enter.
    assert r.status.tolist() == [0, 2, 2] and r.is_elite.tolist() == [False, True, True]
    assert sorted(np.asarray(state.genome_id)[0].tolist()) == [0, 1, 3, 4]
    np.testing.assert_allclose(r.improvement, [8.0, 1.0, 1.0])  # fitness minus the nearest's


def test_local_competition_replaces_the_nearest_only_when_better():
    spec = qa.NoveltySpec(capacity=4, descriptor_dim=1, k=1, threshold=1.0, local_competition=True)
    state = qa.init(spec, 1)
    state, _ = _insert(spec, state, [0.0, 10.0], [5, 5], [0, 1])
    state, r = _insert(spec, state, [0.5, 9.5, 9.6, 9.7], [4, 6, 7, 7], [2, 3, 4, 5])
    # 0.5 is worse than its neighbour 0; the three near 10 all beat it, the best wins,
    # the tie between 4 and 5 goes to the lower batch position.
    assert r.status.tolist() == [0, 1, 1, 1]
    assert r.is_elite.tolist() == [False, False, True, False]
    ids = np.asarray(state.genome_id)[0]
    slot_of_10 = int(np.flatnonzero(ids == 4)[0])
    assert r.cell[2] == slot_of_10 and r.displaced_id.tolist() == [-1, -1, 1, -1]
    assert sorted(ids.tolist()) == [-1, -1, 0, 4]
    assert np.asarray(state.descriptor)[0, slot_of_10, 0] == np.float32(9.6)
    np.testing.assert_allclose(r.improvement, [-1.0, 1.0, 2.0, 2.0])


def test_a_full_archive_replaces_its_oldest_entries():
    state = qa.init(SPEC_1D, 1)
    state, _ = _insert(SPEC_1D, state, [0.0, 10.0, 20.0, 30.0], [1] * 4, [7, 3, 5, 9])
    state, r = _insert(SPEC_1D, state, [100.0, 200.0], [1, 1], [10, 11])
    assert r.is_elite.all() and r.displaced_id.tolist() == [3, 5]  # the two lowest ids
    assert sorted(np.asarray(state.genome_id)[0].tolist()) == [7, 9, 10, 11]
    # More novel candidates than slots: the last ones in the batch are kept.
    state, r = _insert(SPEC_1D, state, [1e3, 2e3, 3e3, 4e3, 5e3, 6e3], [1] * 6, range(12, 18))
    assert r.status.tolist() == [2] * 6 and r.is_elite.tolist() == [False] * 2 + [True] * 4
    assert sorted(np.asarray(state.genome_id)[0].tolist()) == [14, 15, 16, 17]


def test_local_competition_winners_are_not_evicted_in_the_same_batch():
    spec = qa.NoveltySpec(capacity=2, descriptor_dim=1, k=1, threshold=1.0, local_competition=True)
    state = qa.init(spec, 1)
    state, _ = _insert(spec, state, [0.0, 10.0], [1, 1], [0, 1])
    # Id 0 is the oldest, but it is improved in this batch: the novel one evicts id 1.
    state, r = _insert(spec, state, [0.1, 50.0], [2, 1], [2, 3])
    assert r.status.tolist() == [1, 2] and r.displaced_id.tolist() == [0, 1]
    assert sorted(np.asarray(state.genome_id)[0].tolist()) == [2, 3]


def test_islands_are_independent():
    spec = qa.NoveltySpec(capacity=4, descriptor_dim=1, k=1, threshold=1.0)
    state = qa.init(spec, 3)
    state, _ = _insert(spec, state, [0.0], [1], [0], island=0)
    # The same point is not novel on island 0 but novel on the empty islands 1 and 2.
    state, r = _insert(spec, state, [0.0, 0.0, 0.0], [1, 1, 1], [1, 2, 3], island=[0, 1, 2])
    assert r.status.tolist() == [0, 2, 2]
    np.testing.assert_array_equal((np.asarray(state.genome_id) >= 0).sum(axis=1), [1, 1, 1])
    score = np.asarray(qa.archive_novelty(spec, state, [0, 1, 2, 5], np.full((4, 1), 3.0, np.float32)))
    np.testing.assert_allclose(score[:3], [3.0, 3.0, 3.0])
    assert np.isnan(score[3])  # island out of range


def test_invalid_candidates_never_enter():
    state = qa.init(SPEC_1D, 2)
    state, r = _insert(
        SPEC_1D,
        state,
        [0.0, np.nan, 20.0, 30.0, 40.0, 50.0],
        [np.nan, 1, 1, 1, np.inf, 1],
        [0, 1, 2, -1, 4, 5],
        island=[0, 0, 0, 0, 0, 7],
        valid=[True, True, False, True, True, True],
    )
    assert r.status.tolist() == [0] * 6 and not r.is_elite.any()
    assert (np.asarray(state.genome_id) == -1).all()


def test_sample_and_stats_work_on_a_novelty_archive():
    spec = qa.NoveltySpec(capacity=8, descriptor_dim=2, k=3, threshold=0.0)
    state = qa.init(spec, 2)
    rng = np.random.default_rng(0)
    state, _ = qa.insert(spec, state, [0, 0, 0, 1], rng.random((4, 2)), [1.0, 2.0, 3.0, 4.0], np.arange(4))
    stats = qa.stats(state)
    np.testing.assert_allclose(stats.coverage, [3 / 8, 1 / 8, 4 / 16])
    np.testing.assert_allclose(stats.qd_score, [6.0, 4.0, 10.0])
    ids, _ = qa.sample(state, jax.random.key(0), 0, 50)
    assert set(np.asarray(ids).tolist()) == {0, 1, 2}


def test_rebuild_replays_in_id_order():
    spec = qa.NoveltySpec(capacity=6, descriptor_dim=2, k=2, threshold=0.3, local_competition=True)
    rng = np.random.default_rng(3)
    n = 40
    island, desc = rng.integers(0, 2, n), rng.random((n, 2)).astype(np.float32)
    fit, ids = rng.random(n).astype(np.float32), np.arange(n, dtype=np.int32)
    state = qa.init(spec, 2)
    for s in range(0, n, 8):
        state, _ = qa.insert(spec, state, island[s : s + 8], desc[s : s + 8], fit[s : s + 8], ids[s : s + 8])
    perm = rng.permutation(n)  # the store's order does not matter, only the ids
    rebuilt = qa.novelty_rebuild(spec, 2, island[perm], desc[perm], fit[perm], ids[perm], batch_size=8)
    for ours, ref in zip(_arrays(rebuilt), _arrays(state)):
        np.testing.assert_array_equal(ours, ref)


def test_spec_is_static_and_validated():
    spec = qa.NoveltySpec(100, 3, 5, 0.1, True)
    assert (
        spec.num_cells == 100
        and spec.descriptor_dim == 3
        and hash(spec) == hash(qa.NoveltySpec(100, 3, 5, 0.1, True))
    )
    with pytest.raises(ValueError, match="k must be >= 1"):
        qa.NoveltySpec(10, 2, 0)


# ------------------------------------------------------------ pyribs parity


@pytest.mark.parametrize("local_competition", [False, True])
def test_matches_pyribs_proximity_archive_while_capacity_does_not_bind(local_competition):
    from ribs.archives import ProximityArchive

    rng = np.random.default_rng(7 + local_competition)
    spec = qa.NoveltySpec(
        capacity=256, descriptor_dim=2, k=3, threshold=0.08, local_competition=local_competition
    )
    ribs = ProximityArchive(
        solution_dim=1,
        measure_dim=2,
        k_neighbors=3,
        novelty_threshold=0.08,
        local_competition=local_competition,
        dtype=np.float64,
    )
    state = qa.init(spec, 1)
    next_id = 0
    for batch in range(6):
        desc = rng.random((32, 2)).astype(np.float32)
        fit = rng.random(32).astype(np.float32)
        ids = np.arange(next_id, next_id + 32, dtype=np.int32)
        next_id += 32
        before = len(ribs)
        info = ribs.add(ids[:, None].astype(np.float64), fit.astype(np.float64), desc.astype(np.float64))
        state, r, novelty = qa.novelty_insert(spec, state, 0, desc, fit, ids)
        np.testing.assert_array_equal(r.status, info["status"])
        if before:  # pyribs reports the threshold for an empty archive, qd +inf
            np.testing.assert_allclose(novelty, info["novelty"], rtol=1e-5)
        if local_competition:
            np.testing.assert_allclose(r.improvement, info["value"], rtol=1e-5, atol=1e-6)
    assert len(ribs) < spec.capacity
    ours = np.asarray(state.genome_id)[0]
    ours = {int(i): float(f) for i, f in zip(ours, np.asarray(state.fitness)[0]) if i >= 0}
    data = ribs.data()
    theirs = {int(s[0]): float(f) for s, f in zip(data["solution"], data["objective"])}
    assert ours.keys() == theirs.keys()
    np.testing.assert_allclose([ours[i] for i in ours], [theirs[i] for i in ours], rtol=1e-6)
