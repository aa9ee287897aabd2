"""The bandit scheduler: each rule learns the best arm per unit cost, checkpoints, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd.search import scheduler
from qd.search.scheduler import BanditState, make_bandit

ADAPTIVE = ("ucb1", "thompson", "epsilon_greedy")
SEEDS = jnp.arange(10)


@functools.partial(jax.jit, static_argnums=(0, 1, 3, 5))
def simulate(bandit, env, cost, num_arms, seeds, steps=200):
    """i32[S, steps]: the arms pulled in ``steps`` rounds, one run per seed.

    ``env(key, arm, t) -> credit``; ``cost`` f32[A] is each arm's cost per pull.
    """

    def run(seed):
        def step(carry, t):
            state, key = carry
            key, choose_key, env_key = jax.random.split(key, 3)
            arm = bandit.choose(state, choose_key)
            state = bandit.update(state, arm, env(env_key, arm, t), cost[arm])
            return (state, key), arm

        start = (bandit.init(num_arms), jax.random.key(seed))
        return jax.lax.scan(step, start, jnp.arange(steps))[1]

    return jax.vmap(run)(seeds)


def bernoulli(key, arm, t):
    """Improvement 1 with p = 0.6 for arm 1, 0.1 for the others."""
    return (jax.random.uniform(key) < jnp.array([0.1, 0.6, 0.1, 0.1])[arm]).astype(jnp.float32)


def improvement(key, p):
    """An archive-like credit: 0, or with probability ``p`` an improvement in [5, 15)."""
    hit_key, size_key = jax.random.split(key)
    size = jax.random.uniform(size_key, minval=5.0, maxval=15.0)
    return jnp.where(jax.random.uniform(hit_key) < p, size, 0.0)


def mostly_zero(key, arm, t):
    """Arm 2 improves the archive 5x as often as the others."""
    return improvement(key, jnp.array([0.1, 0.1, 0.5, 0.1])[arm])


def same_for_all(key, arm, t):
    return improvement(key, 0.3)


def choose_many(bandit, state, keys):
    """i32[K]: one choice per key from the same state."""
    return np.asarray(jax.vmap(bandit.choose, (None, 0))(state, keys))


def share(arms, arm):
    """f[S]: the fraction of each run's pulls that went to ``arm``."""
    return np.asarray(arms == arm).mean(axis=1)


@pytest.mark.parametrize("rule", ADAPTIVE)
def test_the_better_bernoulli_arm_gets_most_pulls(rule):
    arms = simulate(make_bandit(rule, 4), bernoulli, jnp.ones(4), 4, SEEDS)
    assert share(arms, 1).mean() > 0.5
    assert np.median(share(arms, 1)) > 0.5


@pytest.mark.parametrize("rule", ADAPTIVE)
def test_mostly_zero_improvements_favour_the_5x_arm(rule):
    arms = simulate(make_bandit(rule, 4), mostly_zero, jnp.ones(4), 4, SEEDS)
    counts = np.stack([share(arms, a).mean() for a in range(4)])
    assert counts.argmax() == 2
    if rule != "ucb1":  # UCB1's sqrt(2) bonus is conservative: ~half the pulls at 200.
        assert counts[2] > 0.5


@pytest.mark.parametrize("rule", ADAPTIVE)
def test_an_arm_with_the_same_credit_at_4x_the_cost_loses(rule):
    arms = simulate(make_bandit(rule, 2), same_for_all, jnp.array([4.0, 1.0]), 2, SEEDS)
    assert share(arms, 1).mean() > 0.5


def test_reward_is_credit_per_cost():
    bandit = make_bandit("ucb1", 2)
    state = bandit.update(bandit.update(bandit.init(2), 0, 8.0, 4.0), 1, 8.0, 1.0)
    np.testing.assert_allclose(scheduler.mean_reward(state), [2.0, 8.0])
    assert float(state.reward_scale) == 8.0


def test_decay_follows_an_arm_that_becomes_better():
    def switch(key, arm, t):
        p = jnp.where(t < 150, jnp.array([0.6, 0.1]), jnp.array([0.1, 0.6]))
        return (jax.random.uniform(key) < p[arm]).astype(jnp.float32)

    def late_share(decay):
        arms = simulate(make_bandit("thompson", 2, decay=decay), switch, jnp.ones(2), 2, SEEDS, 300)
        return share(arms[:, 200:], 1).mean()

    discounted = late_share(0.9)
    assert discounted > 0.6
    assert discounted > late_share(1.0) + 0.2


@pytest.mark.parametrize("rule", scheduler.RULES)
def test_choose_is_deterministic_for_a_key(rule):
    bandit = make_bandit(rule, 4)
    state = bandit.init(4)
    for arm, credit in [(0, 1.0), (1, 0.0), (2, 3.0), (3, 0.5), (2, 0.0)]:
        state = bandit.update(state, arm, credit, 1.0)
    keys = jax.random.split(jax.random.key(7), 50)
    first = [int(bandit.choose(state, k)) for k in keys]
    assert first == [int(bandit.choose(state, k)) for k in keys]
    assert all(0 <= a < 4 for a in first)
    if rule in ("thompson", "fixed"):
        assert len(set(first)) > 1  # the key matters


def test_ucb1_tries_untried_arms_first_in_index_order():
    bandit = make_bandit("ucb1", 4)
    state = bandit.update(bandit.init(4), 2, 100.0, 1.0)  # arm 2 is already great
    chosen = []
    for _ in range(3):
        arm = int(bandit.choose(state, jax.random.key(0)))
        chosen.append(arm)
        state = bandit.update(state, arm, 0.0, 1.0)
    assert chosen == [0, 1, 3]
    assert int(bandit.choose(state, jax.random.key(0))) == 2


def test_epsilon_greedy_tries_untried_arms_then_breaks_ties_at_random():
    bandit = make_bandit("epsilon_greedy", 4, epsilon=0.0)
    keys = jax.random.split(jax.random.key(1), 400)
    untried = choose_many(bandit, bandit.update(bandit.init(4), 1, 5.0, 1.0), keys)
    assert set(untried.tolist()) == {0, 2, 3}
    state = bandit.init(4)
    for arm, credit in enumerate([1.0, 0.0, 1.0, 0.5]):
        state = bandit.update(state, arm, credit, 1.0)
    tied = choose_many(bandit, state, keys)
    assert set(tied.tolist()) == {0, 2}
    assert 0.4 < (tied == 0).mean() < 0.6


def test_epsilon_one_is_uniform():
    bandit = make_bandit("epsilon_greedy", 4, epsilon=1.0)
    state = bandit.init(4)
    for arm in range(4):
        state = bandit.update(state, arm, float(arm == 3), 1.0)
    keys = jax.random.split(jax.random.key(2), 4000)
    counts = np.bincount(choose_many(bandit, state, keys), minlength=4)
    np.testing.assert_allclose(counts / 4000, 0.25, atol=0.03)


def test_fixed_follows_its_weights_and_ignores_credit():
    weights = [1.0, 3.0, 0.0, 6.0]
    bandit = make_bandit("fixed", 4, weights=weights)
    keys = jax.random.split(jax.random.key(3), 5000)
    before = choose_many(bandit, bandit.init(4), keys)
    frequency = np.bincount(before, minlength=4) / 5000
    np.testing.assert_allclose(frequency, [0.1, 0.3, 0.0, 0.6], atol=0.02)
    state = bandit.init(4)
    for _ in range(20):
        state = bandit.update(state, 0, 100.0, 1.0)
    np.testing.assert_array_equal(choose_many(bandit, state, keys), before)
    # The loop's choice without a scheduler, draw for draw.
    with np.errstate(divide="ignore"):
        log_w = np.log(np.asarray(weights) / 10.0).astype(np.float32)
    assert int(bandit.choose(state, keys[0])) == int(jax.random.categorical(keys[0], log_w))


def test_fixed_without_weights_is_uniform():
    bandit = make_bandit("fixed", 3)
    keys = jax.random.split(jax.random.key(4), 3000)
    counts = np.bincount(choose_many(bandit, bandit.init(3), keys))
    np.testing.assert_allclose(counts / 3000, 1 / 3, atol=0.03)


def test_state_dict_round_trip():
    bandit = make_bandit("thompson", 3, decay=0.95)
    state = bandit.init(3)
    for arm, credit, cost in [(0, 1.0, 2.0), (2, 0.0, 1.0), (2, 7.0, 3.0)]:
        state = bandit.update(state, arm, credit, cost)
    saved = scheduler.state_dict(state)
    assert all(isinstance(v, np.ndarray) for v in saved.values())
    np.savez("/dev/null", **saved)  # checkpointable as is
    loaded = scheduler.load_state_dict(dict(saved), num_arms=3)
    for name in BanditState._fields:
        assert getattr(loaded, name).dtype == getattr(state, name).dtype
        np.testing.assert_array_equal(getattr(loaded, name), getattr(state, name))
    key = jax.random.key(5)
    assert int(bandit.choose(loaded, key)) == int(bandit.choose(state, key))


def test_load_state_dict_rejects_missing_fields_and_changed_arms():
    saved = scheduler.state_dict(scheduler.init(3))
    with pytest.raises(ValueError, match="missing field.*reward_sq"):
        scheduler.load_state_dict({k: v for k, v in saved.items() if k != "reward_sq"})
    with pytest.raises(ValueError, match="saved for 3 arms, the config has 4"):
        scheduler.load_state_dict(saved, num_arms=4)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        scheduler.load_state_dict({**saved, "pulls": np.zeros(4, np.float32)})


@pytest.mark.parametrize(
    ("rule", "params", "message"),
    [
        ("softmax", {}, r"^scheduler.rule: 'softmax' is not one of"),
        ("epsilon_greedy", {"epsilon": 2}, r"^scheduler.epsilon: must be in \[0, 1\], got 2$"),
        ("epsilon_greedy", {"epsilon": "a lot"}, r"^scheduler.epsilon: must be a number"),
        ("ucb1", {"c": -1.0}, r"^scheduler.c: must be a finite number >= 0, got -1.0$"),
        ("ucb1", {"decay": 0.0}, r"^scheduler.decay: must be in \(0, 1\], got 0.0$"),
        ("ucb1", {"epsilon": 0.1}, r"^scheduler.epsilon: is not a parameter of rule 'ucb1'"),
        ("thompson", {"prior_var": 0.0}, r"^scheduler.prior_var: must be a finite number > 0"),
        ("thompson", {"prior_count": float("inf")}, r"^scheduler.prior_count: must be a finite"),
        ("fixed", {"weights": [1.0, 2.0]}, r"^scheduler.weights: must be a list of 3 numbers"),
        ("fixed", {"weights": [1.0, -1.0, 2.0]}, r"^scheduler.weights: must be finite and >= 0"),
        ("fixed", {"weights": [0.0, 0.0, 0.0]}, r"^scheduler.weights: must have a positive sum"),
    ],
)
def test_bad_params_name_the_field(rule, params, message):
    with pytest.raises(ValueError, match=message):
        make_bandit(rule, 3, **params)


def test_bad_arm_count_and_bad_pulls_raise():
    with pytest.raises(ValueError, match=r"^scheduler.num_arms: must be an integer >= 1, got 0$"):
        make_bandit("ucb1", 0)
    with pytest.raises(ValueError, match=r"^scheduler.weights: has 2 entries for 3 arms$"):
        scheduler.fixed([1.0, 1.0]).init(3)
    bandit = make_bandit("ucb1", 3)
    state = bandit.init(3)
    with pytest.raises(ValueError, match="cost must be finite and > 0, got 0"):
        bandit.update(state, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="arm 3 is out of range for 3 arms"):
        bandit.update(state, 3, 1.0, 1.0)
    with pytest.raises(ValueError, match="credit must be finite"):
        bandit.update(state, 0, float("nan"), 1.0)


def test_an_invalid_traced_pull_is_ignored():
    bandit = make_bandit("ucb1", 2)
    state = bandit.update(bandit.init(2), 0, 1.0, 1.0)
    update = jax.jit(bandit.update)
    for arm, credit, cost in [(1, 1.0, 0.0), (1, jnp.nan, 1.0), (5, 1.0, 1.0)]:
        after = update(state, arm, credit, cost)
        for name in BanditState._fields:
            np.testing.assert_array_equal(getattr(after, name), getattr(state, name))


def test_one_bandit_state_per_island_under_vmap():
    bandit = make_bandit("thompson", 3)
    states = jax.tree.map(lambda x: jnp.stack([x] * 4), bandit.init(3))
    arms = jnp.array([0, 1, 2, 1])
    states = jax.vmap(bandit.update)(states, arms, jnp.array([1.0, 2.0, 0.0, 4.0]), jnp.ones(4))
    np.testing.assert_array_equal(states.pulls, np.eye(3, dtype=np.float32)[np.asarray(arms)])
    np.testing.assert_array_equal(states.reward_scale, [1.0, 2.0, 0.0, 4.0])
    chosen = jax.vmap(bandit.choose)(states, jax.random.split(jax.random.key(6), 4))
    assert chosen.shape == (4,) and chosen.dtype == jnp.int32


pulls = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.floats(-100, 100, allow_nan=False, width=32),
        st.floats(0.125, 100, width=32),
    ),
    max_size=30,
)


@settings(max_examples=30, deadline=None)
@given(pulls=pulls, decay=st.sampled_from([1.0, 0.5]))
def test_update_invariants(pulls, decay):
    bandit = scheduler.epsilon_greedy(decay=decay)
    state = bandit.init(4)
    for arm, credit, cost in pulls:
        state = bandit.update(state, arm, credit, cost)
    steps = len(pulls)
    assert int(state.step) == steps
    assert np.all(np.asarray(state.pulls) >= 0)
    discounted_steps = sum(decay**k for k in range(steps))
    np.testing.assert_allclose(float(state.pulls.sum()), discounted_steps, rtol=1e-5)
    rewards = [np.float32(c) / np.float32(k) for _, c, k in pulls]
    assert float(state.reward_scale) == pytest.approx(max(map(abs, rewards), default=0.0), rel=1e-6)
    assert np.all(np.asarray(state.reward_sq) >= 0)
    if decay == 1.0:
        expected = np.zeros(4)
        for (arm, _, _), r in zip(pulls, rewards):
            expected[arm] += r
        np.testing.assert_allclose(state.reward_sum, expected, rtol=1e-4, atol=1e-3)
        counts = np.bincount([arm for arm, _, _ in pulls], minlength=4)
        np.testing.assert_array_equal(state.pulls, counts)
