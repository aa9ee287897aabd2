"""Parent and inspiration selection (qd.search.select): validity properties over random fill
patterns, and the bias of each rule checked against NumPy references with fixed keys.

Shapes are kept few (I = 2, C = 16, D = 2; n in {32, 8192}) so the jitted functions
compile rarely.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa
from qd.search import criteria, select

I, C, D = 2, 16, 2
# The rules that read the archive alone; those reading the elites' scores: test_criteria.py.
PARENT_RULES = tuple(r for r in select.PARENT_RULES if r not in criteria.PARENT_RULES)
INSPIRATION_RULES = tuple(r for r in select.INSPIRATION_RULES if r not in criteria.INSPIRATION_RULES)
MANY = 8192  # draws for the statistical checks: frequency std <= 0.006

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _state(fitness: np.ndarray, descriptor: np.ndarray | None = None) -> qa.ArchiveState:
    """An archive from fitness f[I, C] (NaN = empty) and descriptors f[I, C, D]."""
    fitness = np.asarray(fitness, np.float32)
    filled = ~np.isnan(fitness)
    if descriptor is None:
        descriptor = np.zeros((*fitness.shape, D), np.float32)
    genome_id = np.where(filled, np.arange(fitness.size).reshape(fitness.shape), -1)
    fitness = np.where(filled, fitness, -np.inf).astype(np.float32)
    return qa.ArchiveState(
        fitness=jnp.asarray(fitness),
        descriptor=jnp.asarray(np.where(filled[..., None], descriptor, 0.0), jnp.float32),
        genome_id=jnp.asarray(genome_id, jnp.int32),
        threshold=jnp.asarray(fitness),
        threshold_min=jnp.float32(-np.inf),
    )


def _frequency(cells: jax.Array, num: int = C) -> np.ndarray:
    cells = np.asarray(cells).reshape(-1)
    return np.bincount(cells[cells >= 0], minlength=num) / cells.size


def _random_state(mask: list[bool], seed: int) -> qa.ArchiveState:
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-3, 6)
    fitness = np.where(np.asarray(mask).reshape(I, C), rng.normal(size=(I, C)) * scale, np.nan)
    return _state(fitness, rng.uniform(-1, 1, (I, C, D)))


def _curiosity(seed: int) -> select.Curiosity:
    return select.Curiosity(jnp.asarray(np.random.default_rng(seed).normal(size=(I, C)) * 3, jnp.float32))


# -------------------------------------------------------------------- properties


@PROPERTY
@given(
    mask=st.lists(st.booleans(), min_size=I * C, max_size=I * C),
    seed=st.integers(0, 2**16),
    island=st.integers(0, I - 1),
)
def test_parents_are_filled_cells_of_the_island(mask, seed, island):
    state = _random_state(mask, seed)
    ids = np.asarray(state.genome_id)
    for rule in PARENT_RULES:
        genome_id, cell = map(
            np.asarray,
            select.parents(
                state, jax.random.key(seed), island, 32, rule, _curiosity(seed), temperature=0.5, k=3
            ),
        )
        if (ids[island] < 0).all():
            assert (genome_id == -1).all() and (cell == -1).all(), rule
        else:
            assert (ids[island, cell] >= 0).all(), rule
            np.testing.assert_array_equal(genome_id, ids[island, cell])


@PROPERTY
@given(
    mask=st.lists(st.booleans(), min_size=I * C, max_size=I * C),
    seed=st.integers(0, 2**16),
    island=st.integers(0, I - 1),
    parent=st.lists(st.integers(-1, C - 1), min_size=32, max_size=32),
)
def test_inspirations_are_distinct_filled_elites_other_than_the_parent(mask, seed, island, parent):
    state = _random_state(mask, seed)
    ids = np.asarray(state.genome_id)
    parent = np.asarray(parent, np.int32)
    m = 3
    for rule in INSPIRATION_RULES:
        isl, cell = map(np.asarray, select.inspirations(state, jax.random.key(seed), island, parent, m, rule))
        assert isl.shape == cell.shape == (32, m)
        found = cell >= 0
        assert ((isl >= 0) == found).all(), rule
        assert (ids[isl[found], cell[found]] >= 0).all(), rule
        for row in range(32):
            got = [(a, c) for a, c in zip(isl[row], cell[row]) if c >= 0]
            assert len(set(got)) == len(got), rule
            assert (island, parent[row]) not in got, rule
            assert found[row].tolist() == sorted(found[row].tolist(), reverse=True), rule  # filled first
            if rule == "islands":
                assert all(a != island for a, _ in got)
                available = int((ids[1 - island] >= 0).sum())
            else:
                assert all(a == island for a, _ in got)
                parent_filled = parent[row] >= 0 and ids[island, parent[row]] >= 0
                if rule == "distant" and not parent_filled:
                    available = 0
                else:
                    available = int((ids[island] >= 0).sum()) - parent_filled
            assert len(got) == min(m, available), rule


@pytest.mark.parametrize("rule", PARENT_RULES)
def test_parents_are_deterministic_for_a_key(rule):
    state = _random_state([True, False, True, True] * 8, 3)
    picks = [
        np.asarray(select.parents(state, jax.random.key(k), 0, 32, rule, _curiosity(0))[1]) for k in (7, 7, 8)
    ]
    np.testing.assert_array_equal(picks[0], picks[1])
    assert not np.array_equal(picks[0], picks[2])


@pytest.mark.parametrize("rule", INSPIRATION_RULES)
def test_inspirations_are_deterministic_for_a_key(rule):
    state = _random_state([True, False, True, True] * 8, 3)
    parent = np.zeros(32, np.int32)
    picks = [
        np.asarray(select.inspirations(state, jax.random.key(k), 0, parent, 3, rule)[1]) for k in (7, 7, 8)
    ]
    np.testing.assert_array_equal(picks[0], picks[1])
    if rule != "top":
        assert not np.array_equal(picks[0], picks[2])


def test_empty_island_gives_no_parents_and_no_inspirations():
    fitness = np.full((I, C), np.nan)
    fitness[1, 3] = 1.0
    state = _state(fitness)
    for rule in PARENT_RULES:
        genome_id, cell = select.parents(state, jax.random.key(0), 0, 32, rule, _curiosity(0))
        assert (np.asarray(genome_id) == -1).all() and (np.asarray(cell) == -1).all()
    for rule in ("uniform", "top", "distant"):
        isl, cell = select.inspirations(state, jax.random.key(0), 0, np.full(32, -1, np.int32), 3, rule)
        assert (np.asarray(cell) == -1).all() and (np.asarray(isl) == -1).all()


def test_bad_arguments_are_refused():
    state = _random_state([True] * (I * C), 0)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="parent rule"):
        select.parents(state, key, 0, 4, "best")
    with pytest.raises(ValueError, match="Curiosity"):
        select.parents(state, key, 0, 4, "curiosity")
    with pytest.raises(ValueError, match="temperature"):
        select.parents(state, key, 0, 4, "fitness", temperature=0.0)
    with pytest.raises(ValueError, match="out of range"):
        select.parents(state, key, I, 4, "uniform")
    with pytest.raises(ValueError, match="inspiration rule"):
        select.inspirations(state, key, 0, np.zeros(4, np.int32), 2, "best")


# ----------------------------------------------------------------------- parents


def test_uniform_parents_are_uniform_over_filled_cells():
    fitness = np.full((I, C), np.nan)
    fitness[0, [1, 4, 9, 15]] = [5.0, -1.0, 2.0, 0.0]
    _, cell = select.parents(_state(fitness), jax.random.key(0), 0, MANY, "uniform")
    expected = np.zeros(C)
    expected[[1, 4, 9, 15]] = 0.25
    np.testing.assert_allclose(_frequency(cell), expected, atol=0.02)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_fitness_parents_follow_ranks_whatever_the_scale(temperature):
    # Negative, huge and tied fitness: probabilities depend on ranks only (ties share one).
    fitness = np.full((I, C), np.nan)
    cells = [0, 2, 3, 7, 8, 12]
    fitness[0, cells] = [-1e9, 3e8, -2.0, 3e8, 1e10, -2.0]
    rank = np.asarray([1, 4, 2, 4, 6, 2], float)
    _, cell = select.parents(_state(fitness), jax.random.key(1), 0, MANY, "fitness", temperature=temperature)
    expected = np.zeros(C)
    expected[cells] = rank ** (1 / temperature) / np.sum(rank ** (1 / temperature))
    freq = _frequency(cell)
    np.testing.assert_allclose(freq, expected, atol=0.02)
    assert freq[8] > 5 * freq[0]  # the best far more often than the worst


def test_curiosity_update_adds_credit_per_parent_and_ignores_invalid():
    cur = select.curiosity_init(I, C)
    island = np.asarray([0, 0, 0, 1, 1, 0], np.int32)
    cell = np.asarray([3, 3, 5, 3, 20, 3], np.int32)  # cell 20 is out of range
    added = np.asarray([True, False, True, True, True, True])
    valid = np.asarray([True, True, True, True, True, False])
    score = np.asarray(select.curiosity_update(cur, island, cell, added, valid).score)
    expected = np.zeros((I, C))
    expected[0, 3], expected[0, 5], expected[1, 3] = 1.0 - 0.5, 1.0, 1.0
    np.testing.assert_array_equal(score, expected)


def test_curiosity_reset_restarts_the_entered_cells():
    cur = select.Curiosity(jnp.ones((I, C), jnp.float32))
    cur = select.curiosity_reset(
        cur, np.asarray([0, 1, 1], np.int32), np.asarray([2, 4, 5], np.int32), np.asarray([True, True, False])
    )
    expected = np.ones((I, C))
    expected[0, 2] = expected[1, 4] = 0.0
    np.testing.assert_array_equal(np.asarray(cur.score), expected)


def test_curiosity_shifts_parents_toward_credited_cells():
    fitness = np.full((I, C), np.nan)
    fitness[0, :8] = 0.0
    state = _state(fitness)
    cur = select.curiosity_init(I, C)
    before = _frequency(select.parents(state, jax.random.key(2), 0, MANY, "curiosity", cur)[1])
    np.testing.assert_allclose(before[:8], 1 / 8, atol=0.02)
    # Cell 2's children keep entering the archive; cell 5's never do.
    for _ in range(3):
        cur = select.curiosity_update(
            cur,
            np.zeros(4, np.int32),
            np.asarray([2, 2, 5, 5], np.int32),
            np.asarray([True, True, False, False]),
            np.ones(4, bool),
        )
    after = _frequency(select.parents(state, jax.random.key(2), 0, MANY, "curiosity", cur)[1])
    weight = np.exp(np.asarray(cur.score)[0, :8])
    np.testing.assert_allclose(after[:8], weight / weight.sum(), atol=0.02)
    assert after[2] > 0.9 and after[5] < before[5]


def test_novelty_parents_prefer_an_isolated_elite():
    # Elites 0-5 huddle near the origin, elite 6 sits far away: weights are the mean
    # distance to the 3 nearest other elites.
    fitness = np.full((I, C), np.nan)
    fitness[0, :7] = 0.0
    descriptor = np.zeros((I, C, D))
    descriptor[0, :7] = [[0, 0], [0.1, 0], [0, 0.1], [0.1, 0.1], [0.2, 0], [0, 0.2], [3, 3]]
    _, cell = select.parents(_state(fitness, descriptor), jax.random.key(3), 0, MANY, "novelty", k=3)
    points = descriptor[0, :7]
    dist = np.linalg.norm(points[:, None] - points[None], axis=2) + np.diag(np.full(7, np.inf))
    weight = np.sort(dist, axis=1)[:, :3].mean(axis=1)
    expected = np.zeros(C)
    expected[:7] = weight / weight.sum()
    freq = _frequency(cell)
    np.testing.assert_allclose(freq, expected, atol=0.02)
    assert freq[6] > 5 * freq[:6].max()


def test_novelty_parents_prefer_an_isolated_elite_beyond_the_pool():
    # More elites than the pool: picks come from pools drawn uniformly, and the isolated
    # elite, when drawn, takes most of them.
    cells = 2 * select.NOVELTY_POOL
    rng = np.random.default_rng(4)
    fitness = np.zeros((1, cells))
    descriptor = rng.uniform(0, 1, (1, cells, D))
    descriptor[0, 17] = [30.0, 30.0]
    state = _state(fitness, descriptor)
    picks = np.concatenate(
        [np.asarray(select.parents(state, jax.random.key(s), 0, 64, "novelty", k=3)[1]) for s in range(16)]
    )
    count = np.bincount(picks, minlength=cells)
    assert count[17] > 0.2 * picks.size
    assert count[17] > 20 * np.delete(count, 17).max()


# ------------------------------------------------------------------ inspirations


def test_top_inspirations_are_the_best_elites_but_the_parent():
    fitness = np.full((I, C), np.nan)
    fitness[0, [1, 3, 6, 8, 11]] = [4.0, 9.0, 1.0, 7.0, 8.0]
    parent = np.asarray([3, 6, -1], np.int32)
    isl, cell = select.inspirations(_state(fitness), jax.random.key(0), 0, parent, 4, "top")
    np.testing.assert_array_equal(np.asarray(cell), [[11, 8, 1, 6], [3, 11, 8, 1], [3, 11, 8, 1]])
    assert (np.asarray(isl) == 0).all()
    _, cell = select.inspirations(_state(fitness), jax.random.key(0), 0, parent, 6, "top")
    np.testing.assert_array_equal(np.asarray(cell)[0], [11, 8, 1, 6, -1, -1])


def test_uniform_inspirations_are_uniform_ordered_pairs():
    fitness = np.full((I, C), np.nan)
    fitness[0, [0, 2, 5, 9, 13]] = 0.0
    parent = np.full(MANY, 5, np.int32)
    _, cell = map(
        np.asarray, select.inspirations(_state(fitness), jax.random.key(5), 0, parent, 2, "uniform")
    )
    others = [0, 2, 9, 13]
    pairs = cell[:, 0] * C + cell[:, 1]
    expected = {a * C + b for a in others for b in others if a != b}
    assert set(pairs.tolist()) == expected
    freq = np.bincount(pairs, minlength=C * C)[sorted(expected)] / MANY
    np.testing.assert_allclose(freq, 1 / 12, atol=0.01)


def test_distant_inspirations_are_drawn_in_proportion_to_distance():
    fitness = np.full((I, C), np.nan)
    fitness[0, :5] = 0.0
    descriptor = np.zeros((I, C, D))
    descriptor[0, :5] = [[0, 0], [1, 0], [0, 2], [3, 4], [0, -1]]  # distances 1, 2, 5, 1 from cell 0
    parent = np.zeros(MANY, np.int32)
    _, cell = select.inspirations(_state(fitness, descriptor), jax.random.key(6), 0, parent, 1, "distant")
    expected = np.zeros(C)
    expected[1:5] = np.asarray([1.0, 2.0, 5.0, 1.0]) / 9.0
    np.testing.assert_allclose(_frequency(cell), expected, atol=0.02)


def test_island_inspirations_come_from_other_islands():
    fitness = np.full((3, C), np.nan)
    fitness[0, [1, 2]] = fitness[1, [4]] = fitness[2, [4, 7]] = 0.0
    isl, cell = map(
        np.asarray,
        select.inspirations(_state(fitness), jax.random.key(7), 1, np.full(32, 4, np.int32), 5, "islands"),
    )
    found = cell >= 0
    assert (found.sum(axis=1) == 4).all()  # 4 elites elsewhere, 5 asked
    got = {(a, c) for a, c in zip(isl[found], cell[found])}
    assert got == {(0, 1), (0, 2), (2, 4), (2, 7)}


def test_island_inspirations_with_one_island_stay_home():
    fitness = np.full((1, C), np.nan)
    fitness[0, [1, 2, 3]] = 0.0
    isl, cell = map(
        np.asarray,
        select.inspirations(_state(fitness), jax.random.key(8), 0, np.full(32, 2, np.int32), 3, "islands"),
    )
    np.testing.assert_array_equal(np.sort(cell, axis=1), np.tile([-1, 1, 3], (32, 1)))
    np.testing.assert_array_equal(isl == 0, cell >= 0)


def test_selection_at_scale_is_jittable_without_large_temporaries():
    # C = 10,000 cells, 4 islands, 64-D descriptors, n = 64: no [n, C, D] temporary (164 MB).
    shape = jax.ShapeDtypeStruct
    state = qa.ArchiveState(
        fitness=shape((4, 10_000), jnp.float32),
        descriptor=shape((4, 10_000, 64), jnp.float32),
        genome_id=shape((4, 10_000), jnp.int32),
        threshold=shape((4, 10_000), jnp.float32),
        threshold_min=shape((), jnp.float32),
    )
    key = jax.random.key(0)
    # The two rules that measure descriptor distances; the others only touch [C] rows.
    lowered = select._parents.lower(state, key, 0, 64, "novelty", None, jnp.float32(1.0), 15)
    assert lowered.compile().memory_analysis().temp_size_in_bytes < 40 * 2**20
    lowered = select._inspirations.lower(state, key, 0, shape((64,), jnp.int32), 4, "distant")
    assert lowered.compile().memory_analysis().temp_size_in_bytes < 40 * 2**20


# ------------------------------------------------------------------------- waves


@pytest.mark.parametrize("rule", PARENT_RULES)
def test_a_wave_row_is_what_the_unbatched_draws_give_its_keys(rule):
    """One dispatch for a wave: each row is exactly its own ``parents`` and ``inspirations``,
    an operator with fewer parents than the wave's widest taking a prefix."""
    state, children, widest, m = _random_state([True, True, False, True] * (I * C // 4), 7), 3, 2, 3
    parent_keys, inspire_keys = jax.random.split(jax.random.key(1), 4), jax.random.split(jax.random.key(2), 4)
    island, num_parents = np.asarray([0, 1, 1, 0]), np.asarray([1, 2, 2, 1])
    for inspiration_rule in INSPIRATION_RULES:
        wave = jax.device_get(
            select.wave(
                state,
                parent_keys,
                inspire_keys,
                island,
                num_parents,
                children,
                widest,
                rule,
                _curiosity(3),
                0.7,
                3,
                m,
                inspiration_rule,
            )
        )
        for r in range(4):
            ids, cells = map(
                np.asarray,
                select.parents(
                    state, parent_keys[r], int(island[r]), children * widest, rule, _curiosity(3), 0.7, 3
                ),
            )
            np.testing.assert_array_equal(wave.genome_id[r], ids)
            np.testing.assert_array_equal(wave.cell[r], cells)
            first = cells[np.arange(children) * num_parents[r]]
            source, spot = map(
                np.asarray,
                select.inspirations(state, inspire_keys[r], int(island[r]), first, m, inspiration_rule),
            )
            np.testing.assert_array_equal(wave.source[r], source)
            np.testing.assert_array_equal(wave.spot[r], spot)


@PROPERTY
@given(
    mask=st.lists(st.booleans(), min_size=I * C, max_size=I * C),
    seed=st.integers(0, 2**16),
    island=st.lists(st.integers(0, I - 1), min_size=1, max_size=5),
)
def test_host_uniform_waves_draw_filled_parents_and_distinct_other_inspirations(mask, seed, island):
    ids = np.asarray(_random_state(mask, seed).genome_id)
    island, m = np.asarray(island), 3
    num_parents = np.random.default_rng(seed).integers(1, 3, len(island))
    picks = select.wave_uniform(ids, np.random.default_rng(seed), island, num_parents, 4, 2, m)
    again = select.wave_uniform(ids, np.random.default_rng(seed), island, num_parents, 4, 2, m)
    for a, b in zip(picks, again):
        np.testing.assert_array_equal(a, b)  # a pure function of the generator
    for r, i in enumerate(island):
        filled = int((ids[i] >= 0).sum())
        if not filled:
            assert (
                (picks.cell[r] == -1).all()
                and (picks.genome_id[r] == -1).all()
                and (picks.spot[r] == -1).all()
            )
            continue
        np.testing.assert_array_equal(picks.genome_id[r], ids[i, picks.cell[r]])
        assert (picks.genome_id[r] >= 0).all()
        for j in range(4):
            got = picks.spot[r, j][picks.spot[r, j] >= 0].tolist()
            assert len(got) == len(set(got)) == min(m, filled - 1)
            assert (picks.source[r, j][: len(got)] == i).all() and (picks.spot[r, j][len(got) :] == -1).all()
            assert picks.cell[r, j * num_parents[r]] not in got and (ids[i, got] >= 0).all()


def test_host_uniform_waves_are_uniform():
    fitness = np.full((I, C), np.nan)
    fitness[0, [0, 2, 5, 9, 13]] = 0.0
    ids = np.asarray(_state(fitness).genome_id)
    picks = select.wave_uniform(
        ids, np.random.default_rng(0), np.zeros(MANY // 8, np.int64), np.ones(MANY // 8, np.int64), 8, 1, 2
    )
    expected = np.zeros(C)
    expected[[0, 2, 5, 9, 13]] = 0.2
    np.testing.assert_allclose(_frequency(picks.cell), expected, atol=0.02)
    spot = picks.spot[picks.cell == 5]  # the inspirations of the children of cell 5
    pairs = spot[:, 0] * C + spot[:, 1]
    expected_pairs = sorted(a * C + b for a in (0, 2, 9, 13) for b in (0, 2, 9, 13) if a != b)
    assert sorted(set(pairs.tolist())) == expected_pairs
    np.testing.assert_allclose(
        np.bincount(pairs, minlength=C * C)[expected_pairs] / len(pairs), 1 / 12, atol=0.03
    )
