"""Selection by many criteria (qd.search.criteria through qd.search.select): over 1,000 draws
with a fixed key, ``instance`` draws only elites best on some validation row and ``pareto``
only front members; ``hypervolume`` draws in proportion to the contributions; ``complement``
picks the expected partners. Every example has the same shapes (I = 2 islands, C = 8 cells
of K = 2 slots, M = 2 objectives, R = 6 rows), so each rule compiles once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qd.archive as qa
from qd.archive.pareto import ParetoState
from qd.archive.slots import slots_of
from qd.contract import Candidate
from qd.search import criteria, select
from qd.search.criteria import Scores

I, C, K, M, R = 2, 8, 2, 2, 6
S = C * K
DRAWS = 1000
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _state(filled: np.ndarray) -> qa.ArchiveState:
    """The slot view of an archive: genome_id i32[I, S], the flat slot index as the id."""
    genome_id = np.where(filled, np.arange(filled.size).reshape(filled.shape), -1)
    fitness = np.where(filled, 0.0, -np.inf).astype(np.float32)
    return qa.ArchiveState(
        fitness=jnp.asarray(fitness),
        descriptor=jnp.zeros((*filled.shape, 2), jnp.float32),
        genome_id=jnp.asarray(genome_id, jnp.int32),
        threshold=jnp.asarray(fitness),
        threshold_min=jnp.float32(-np.inf),
    )


def _scores(objectives: np.ndarray, rows: np.ndarray, contribution: np.ndarray | None = None) -> Scores:
    """Scores from objectives f[I, S, M] and rows f[I, S, R]."""
    contribution = np.zeros((I, S)) if contribution is None else contribution
    return Scores(
        jnp.asarray(objectives.reshape(I, C, K, M), jnp.float32),
        jnp.asarray(contribution.reshape(I, C, K), jnp.float32),
        jnp.asarray(rows.reshape(I, C, K, -1), jnp.float32),
    )


def _front_members(objectives: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """bool[S]: the brute-force reference of one island: filled slots no other filled slot of
    their cell dominates."""
    out = np.zeros(S, bool)
    for s in np.flatnonzero(filled):
        mates = [t for t in range(s // K * K, s // K * K + K) if filled[t] and t != s]
        out[s] = not any(
            (objectives[t] >= objectives[s]).all() and (objectives[t] > objectives[s]).any() for t in mates
        )
    return out


def _row_winners(rows: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """i[S]: on how many rows each filled slot is best among the filled, ties included
    (brute force; NaN = not scored)."""
    wins = np.zeros(S, int)
    for r in range(rows.shape[1]):
        scored = [s for s in np.flatnonzero(filled) if np.isfinite(rows[s, r])]
        best = max((rows[s, r] for s in scored), default=None)
        for s in scored:
            wins[s] += rows[s, r] == best
    return wins


def _draw(state: qa.ArchiveState, scores: Scores, island: int, rule: str, n: int = DRAWS) -> np.ndarray:
    genome_id, slot = map(
        np.asarray, select.parents(state, jax.random.key(7), island, n, rule, scores=scores)
    )
    np.testing.assert_array_equal(genome_id, np.asarray(state.genome_id)[island, slot])
    return slot


@pytest.mark.slow
@PROPERTY
@given(seed=st.integers(0, 2**16), island=st.integers(0, I - 1), density=st.sampled_from([0.3, 0.7, 1.0]))
def test_pareto_draws_only_front_members_and_instance_only_elites_best_on_some_row(seed, island, density):
    rng = np.random.default_rng(seed)
    filled = rng.random((I, S)) < density
    objectives = rng.integers(0, 3, (I, S, M)).astype(np.float32)  # few values: ties and dominance
    rows = np.where(rng.random((I, S, R)) < 0.2, np.nan, rng.integers(0, 2, (I, S, R)))  # 0/1 with gaps
    state, scores = _state(filled), _scores(objectives, rows)
    mine = filled[island]
    for rule, eligible in (
        ("pareto", _front_members(objectives[island], mine)),
        ("instance", _row_winners(rows[island], mine) > 0),
    ):
        slot = _draw(state, scores, island, rule)
        if not mine.any():
            assert (slot == -1).all(), rule
            continue
        expected = eligible if eligible.any() else mine  # none eligible: uniform over the elites
        assert expected[slot].all(), rule
        assert set(slot.tolist()) == set(np.flatnonzero(expected).tolist()), rule  # and all of them


def test_instance_draws_in_proportion_to_the_rows_won():
    filled = np.ones((I, S), bool)
    rows = np.full((I, S, R), 0.0)
    rows[0, 3] = 1.0  # best on all six rows
    rows[0, 5, :2] = 1.0  # ties with slot 3 on two rows
    rows[0, 9, :3] = np.nan  # unscored rows count for nobody
    slot = _draw(_state(filled), _scores(np.zeros((I, S, M)), rows), 0, "instance")
    frequency = np.bincount(slot, minlength=S) / slot.size
    np.testing.assert_allclose(frequency[[3, 5]], [6 / 8, 2 / 8], atol=0.05)
    assert frequency.sum() == pytest.approx(frequency[[3, 5]].sum())


def test_hypervolume_draws_in_proportion_to_the_contributions():
    filled = np.zeros((I, S), bool)
    filled[0, [0, 1, 4, 6, 7]] = True
    contribution = np.zeros((I, S))
    contribution[0, [0, 1, 4, 6, 7]] = [1.0, 2.0, 4.0, 8.0, 0.0]  # slot 7 adds nothing
    scores = _scores(np.zeros((I, S, M)), np.full((I, S, R), np.nan), contribution)
    slot = _draw(_state(filled), scores, 0, "hypervolume")
    frequency = np.bincount(slot, minlength=S)[[0, 1, 4, 6, 7]] / slot.size
    np.testing.assert_allclose(frequency, [1 / 15, 2 / 15, 4 / 15, 8 / 15, 0.0], atol=0.05)
    assert np.abs(frequency - 1 / 5).max() > 0.2  # what a uniform rule would give is far off


def _complement(scores: Scores, filled: np.ndarray, parent: int, m: int = 3) -> list[int]:
    isl, slot = map(
        np.asarray,
        select.inspirations(
            _state(filled), jax.random.key(0), 0, np.full(4, parent), m, "complement", scores
        ),
    )
    assert (slot == slot[0]).all() and ((isl == 0) == (slot >= 0)).all()  # no randomness
    return slot[0].tolist()


def test_complement_picks_the_elites_best_on_the_rows_the_parent_misses():
    filled = np.zeros((I, S), bool)
    filled[0, :5] = True
    rows = np.zeros((I, S, R))
    rows[0, :5] = [
        [1, 1, 0, 0, 0, 0],  # the parent
        [1, 1, 1, 0, 0, 0],  # gains 1
        [0, 0, 1, 1, 1, 0],  # gains 3, though worse on average than the next
        [1, 1, 1, 1, 0, 0],  # gains 2
        [1, 1, 0, 0, 0, 0],  # gains nothing
    ]
    scores = _scores(np.zeros((I, S, M)), rows)
    assert _complement(scores, filled, 0) == [2, 3, 1]
    assert _complement(scores, filled, 0, m=6)[4:] == [-1, -1]  # four other elites
    assert _complement(scores, filled, -1) == [-1, -1, -1]  # no parent, no partner


def test_complement_without_rows_picks_the_best_on_the_parents_worst_objective():
    filled = np.zeros((I, S), bool)
    filled[0, :4] = True
    objectives = np.zeros((I, S, M))
    objectives[0, :4] = [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.9, 0.2]]  # the parent is worst on the second
    rows = np.full((I, S, R), np.nan)  # no row scored
    assert _complement(_scores(objectives, rows), filled, 0) == [2, 1, 3]
    objectives[0, 0] = [0.0, 1.0]  # now worst on the first: the best there leads
    objectives[0, 2] = [1.0, 0.0]
    assert _complement(_scores(objectives, rows), filled, 0)[0] == 2


@pytest.mark.slow
def test_a_wave_row_is_what_the_unbatched_draws_give_its_keys():
    rule, inspiration = "instance", "complement"
    rng = np.random.default_rng(3)
    filled = rng.random((I, S)) < 0.8
    scores = _scores(rng.integers(0, 3, (I, S, M)).astype(float), rng.integers(0, 2, (I, S, R)).astype(float))
    state, parent_keys, inspire_keys = (
        _state(filled),
        jax.random.split(jax.random.key(1), 2),
        jax.random.split(jax.random.key(2), 2),
    )
    island = np.asarray([0, 1])
    wave = select.wave(
        state,
        parent_keys,
        inspire_keys,
        island,
        np.ones(2, int),
        2,
        1,
        rule,
        m=2,
        inspiration_rule=inspiration,
        scores=scores,
    )
    for r in range(2):
        _, cell = select.parents(state, parent_keys[r], int(island[r]), 2, rule, scores=scores)
        np.testing.assert_array_equal(np.asarray(wave.cell[r]), np.asarray(cell))
        _, spot = select.inspirations(state, inspire_keys[r], int(island[r]), cell, 2, inspiration, scores)
        np.testing.assert_array_equal(np.asarray(wave.spot[r]), np.asarray(spot))


def test_the_rules_refuse_to_draw_without_scores():
    state = _state(np.ones((I, S), bool))
    for rule in criteria.PARENT_RULES:
        with pytest.raises(ValueError, match="Scores"):
            select.parents(state, jax.random.key(0), 0, 4, rule)
    with pytest.raises(ValueError, match="Scores"):
        select.inspirations(state, jax.random.key(0), 0, np.zeros(4, np.int32), 2, "complement")


def _elite(metrics: dict | None) -> Candidate:
    return Candidate("text", 0, 1.0, np.zeros(2), True, text="x", metrics=metrics)


def test_scores_of_reads_the_elites_objectives_and_validation_rows_from_their_metrics():
    state = qa.init(qa.GridSpec((3,), (0.0,), (1.0,)), islands=1, descriptor_dim=1)
    state = state._replace(
        genome_id=jnp.asarray([[4, -1, 7]], jnp.int32), fitness=jnp.asarray([[0.5, -jnp.inf, 0.25]])
    )
    table = np.empty((1, 3), object)
    table[0, 0] = _elite({"accuracy": 0.5, "tokens": 30.0, "validation_scores": [1.0, 0.0]})
    table[0, 2] = _elite({"accuracy": 0.25, "tokens": 10.0})  # lost its minibatch: no rows
    scores = criteria.scores_of(
        slots_of(state), table, (("accuracy", "max"), ("tokens", "min")), None, "pareto"
    )
    assert scores.objectives.shape == (1, 3, 1, 2) and scores.rows.shape == (1, 3, 1, 2)
    np.testing.assert_array_equal(np.asarray(scores.objectives)[0, [0, 2], 0], [[0.5, -30.0], [0.25, -10.0]])
    assert np.isnan(np.asarray(scores.objectives)[0, 1]).all()  # an empty cell
    np.testing.assert_array_equal(np.asarray(scores.rows)[0, 0, 0], [1.0, 0.0])
    assert np.isnan(np.asarray(scores.rows)[0, 2]).all()
    plain = criteria.scores_of(slots_of(state), None, (), None, "pareto")  # a numeric run: its fitness
    np.testing.assert_array_equal(np.asarray(plain.objectives)[0, [0, 2], 0, 0], [0.5, 0.25])


def test_scores_of_a_pareto_state_weighs_each_member_by_its_exclusive_hypervolume():
    genome_id = np.full((1, 2, 3), -1)
    genome_id[0, 0] = [0, 1, 2]
    genome_id[0, 1, 0] = 3
    objectives = np.full((1, 2, 3, 2), np.nan)
    objectives[0, 0] = [[0.0, 4.0], [1.0, 2.0], [3.0, 1.0]]  # maximised, one front
    objectives[0, 1, 0] = [2.0, 3.0]  # alone in its cell
    state = ParetoState(jnp.asarray(objectives), jnp.zeros((1, 2, 3, 1)), jnp.asarray(genome_id, jnp.int32))
    # error (min) and accuracy (max), maximised above: the reference is error 1, accuracy 0,
    # so (-1, 0) maximised
    scores = criteria.scores_of(
        slots_of(state), None, (("error", "min"), ("accuracy", "max")), (1.0, 0.0), "hypervolume"
    )
    # exclusive boxes above (-1, 0): (1-0)*(4-2), (2-1)*(2-1), (4-2)*(1-0); the lone one its whole box
    np.testing.assert_allclose(np.asarray(scores.contribution)[0], [[2.0, 1.0, 2.0], [9.0, 0.0, 0.0]])


@pytest.mark.slow
def test_function_fit_on_fronts_draws_by_hypervolume_and_complement_through_the_host_engine(
    scripted_llm, tmp_path
):
    """The rules read a Pareto archive's slots: parents from its fronts by contribution,
    partners on the objective where the parent is worst (function_fit: error and size). Two
    islands of fronts of three: the archive of the readers' ``pareto_run``, whose compiled
    insert this run reuses."""
    from helpers import on_server, run_config, stored, varied_program
    from scripted_llm import Rule

    from qd.plan import compose

    server = scripted_llm([Rule("", varied_program)])
    overrides = [
        "archive=pareto",
        "archive.front_size=3",
        "islands.count=2",
        "select=hypervolume",
        "select.inspirations=complement",
    ]
    cfg = compose(
        [
            "experiment=function_fit",
            *overrides,
            *on_server(server.base_url),
            "runner.max_llm_calls=16",
            "operators.mix=[{name: crossover}]",
            "runner.progress=false",
        ]
    )
    run_config(cfg, tmp_path / "run")
    found = stored(tmp_path / "run")
    valid = {c.id for c in found if c.valid}
    children = [c for c in found if c.parent_ids]
    assert len(children) >= 8 and all(set(c.parent_ids) <= valid for c in children)
    assert any(len(set(c.parent_ids)) == 2 for c in children)  # crossover got a complementing partner


@pytest.mark.slow
def test_a_crossovers_second_parent_is_the_complement_of_its_first():
    filled = np.zeros((I, S), bool)
    filled[:, :4] = True
    rows = np.zeros((I, S, R))
    rows[:, :4] = [[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]]
    scores, state = _scores(np.zeros((I, S, M)), rows), _state(filled)
    keys = jax.random.split(jax.random.key(4), 2)
    wave = select.wave(
        state, keys, keys, np.asarray([0, 1]), np.asarray([2, 1]), 3, 2, "uniform", m=1,
        inspiration_rule="complement", scores=scores,
    )  # fmt: skip
    cell = np.asarray(wave.cell)
    # whichever first parent was drawn, the partner wins the most of the rows it loses
    best = {0: 1, 1: 0, 2: 3, 3: 2}  # from 1, three elites gain 2 rows: the lowest slot
    assert [cell[0, 2 * j + 1] for j in range(3)] == [best[cell[0, 2 * j]] for j in range(3)]
    assert (np.asarray(wave.spot)[0, :, 0] == cell[0, 1::2]).all()  # its inspiration, the same elite
    _, alone = select.parents(state, keys[1], 1, 6, "uniform")  # one parent each: drawn as before
    np.testing.assert_array_equal(cell[1, :3], np.asarray(alone)[:3])
