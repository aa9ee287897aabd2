"""Polynomial mutation and QDax's polynomial crossover (operators.polynomial).

Every example has the same shapes (parents f32[64, k, 12]), so hypothesis's draws share
one compilation per operator.
"""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import make_numeric_operator, polynomial_crossover, polynomial_mutation
from qd.contract import ConfigError

BATCH, DIM, LOWER, UPPER = 64, 12, -2.0, 4.0


def _parents(seed: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(LOWER, UPPER, (BATCH, count, DIM)).astype(np.float32)


def _count(proportion: float) -> int:
    """``int(proportion * DIM)`` as the operators take it: the proportion as a float32 (a device
    operator's parameter), so 0.9999999999999999 is 1.0 and moves every gene."""
    return int(np.float32(proportion) * np.float32(DIM))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    eta=st.floats(0.0, 50.0),
    proportion=st.floats(0.0, 1.0),
)
def test_mutation_stays_in_bounds_and_moves_exactly_its_share_of_genes(seed, eta, proportion):
    parents = _parents(seed, 1)
    children = np.asarray(polynomial_mutation(jax.random.key(seed), parents, eta, proportion, LOWER, UPPER))
    assert children.shape == (BATCH, DIM) and np.isfinite(children).all()
    assert children.min() >= LOWER and children.max() <= UPPER
    moved = (children != parents[:, 0]).sum(axis=1)
    # int(proportion * n) genes are drawn without replacement; a drawn gene keeps its value
    # only if its step rounds to 0 (a draw near u = 0.5, or a bound it is clipped back to).
    assert (moved <= _count(proportion)).all()
    assert moved.sum() >= 0.9 * BATCH * _count(proportion)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), proportion=st.floats(0.0, 1.0))
def test_crossover_takes_at_most_its_share_of_genes_from_the_second_parent(seed, proportion):
    parents = _parents(seed, 2)
    children = np.asarray(polynomial_crossover(jax.random.key(seed), parents, proportion, LOWER, UPPER))
    from_first, from_second = children == parents[:, 0], children == parents[:, 1]
    assert (from_first | from_second).all()  # an exchange of genes: nothing blended
    taken = from_second.sum(axis=1)
    count = _count(proportion)
    assert (taken <= count).all()  # indices drawn with replacement: repeats take fewer
    assert (taken >= min(count, 1)).all()


def test_a_larger_eta_keeps_mutated_children_nearer_their_parent():
    parents = np.full((20_000, 1, 4), 1.0, np.float32)  # the middle of [-2, 4]
    key = jax.random.key(0)
    steps = [
        np.abs(np.asarray(polynomial_mutation(key, parents, eta, 1.0, LOWER, UPPER)) - 1.0).mean()
        for eta in (0.0, 1.0, 5.0, 20.0)
    ]
    assert all(a > b for a, b in zip(steps, steps[1:])), steps
    # Up and down alike from the middle of the range: the steps average to 0.
    children = np.asarray(polynomial_mutation(key, parents, 1.0, 1.0, LOWER, UPPER))
    assert abs((children - 1.0).mean()) < 0.02 * (UPPER - LOWER)


def test_both_are_deterministic_per_key_and_differ_across_keys():
    cases = (
        (polynomial_mutation, _parents(0, 1), (1.0, 0.6, LOWER, UPPER)),
        (polynomial_crossover, _parents(0, 2), (0.5, LOWER, UPPER)),
    )
    for op, parents, args in cases:
        first, again, other = (np.asarray(op(jax.random.key(k), parents, *args)) for k in (5, 5, 6))
        np.testing.assert_array_equal(first, again)
        assert not np.array_equal(first, other)


def test_made_by_name_with_their_parameters_and_bounds():
    mutation = make_numeric_operator("polynomial_mutation", LOWER, UPPER, eta=1.0, proportion=0.6)
    crossover = make_numeric_operator("polynomial_crossover", LOWER, UPPER, proportion=0.5)
    assert (mutation.num_parents, crossover.num_parents) == (1, 2)
    with pytest.raises(ConfigError, match="eta: required by the polynomial_mutation operator"):
        make_numeric_operator("polynomial_mutation", LOWER, UPPER, proportion=0.6)
    with pytest.raises(ConfigError, match="needs a task with finite genome bounds"):
        make_numeric_operator("polynomial_mutation", eta=1.0, proportion=0.6)
