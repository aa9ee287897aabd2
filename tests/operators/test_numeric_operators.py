import asyncio

import jax
import numpy as np
import pytest

from operators import gaussian, isoline, make_numeric_operator


def test_gaussian_moves_each_parent_by_sigma():
    parents = np.tile(np.arange(4, dtype=np.float32), (20_000, 1, 1))  # [B, 1, n]
    children = np.asarray(gaussian(jax.random.key(0), parents, 0.5))
    assert children.shape == (20_000, 4)
    step = children - parents[:, 0]
    np.testing.assert_allclose(step.mean(0), 0, atol=0.02)
    np.testing.assert_allclose(step.std(0), 0.5, rtol=0.03)


def test_gaussian_clips_to_bounds():
    parents = np.zeros((1000, 1, 3), np.float32)
    children = np.asarray(gaussian(jax.random.key(1), parents, 10.0, -1.0, 1.0))
    assert children.min() >= -1 and children.max() <= 1


def test_isoline_follows_the_line_between_parents():
    n = 20_000
    x_i = np.zeros((n, 2), np.float32)
    x_j = np.tile(np.array([1.0, 0.0], np.float32), (n, 1))
    children = np.asarray(isoline(jax.random.key(2), np.stack([x_i, x_j], 1), 0.0, 0.3))
    assert np.allclose(children[:, 1], 0)  # no isotropic term: stays on the line
    np.testing.assert_allclose(children[:, 0].std(), 0.3, rtol=0.03)


def test_isoline_isotropic_part():
    parents = np.zeros((20_000, 2, 3), np.float32)  # identical parents: only iso noise
    children = np.asarray(isoline(jax.random.key(3), parents, 0.1, 5.0))
    np.testing.assert_allclose(children.std(0), 0.1, rtol=0.03)


def test_operators_are_deterministic_for_a_key():
    parents = np.random.default_rng(0).normal(size=(8, 2, 5)).astype(np.float32)
    a = isoline(jax.random.key(7), parents, 0.1, 0.2)
    b = isoline(jax.random.key(7), parents, 0.1, 0.2)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_make_numeric_operator_is_async_and_validates():
    op = make_numeric_operator("isoline", iso_sigma=0.1, line_sigma=0.2)
    assert op.num_parents == 2
    children = asyncio.run(op(jax.random.key(0), np.zeros((4, 2, 3), np.float32)))
    assert children.shape == (4, 3)
    with pytest.raises(ValueError, match="unknown operator 'cauchy'"):
        make_numeric_operator("cauchy")
    with pytest.raises(ValueError, match="sigma: required by the gaussian operator"):
        make_numeric_operator("gaussian")
