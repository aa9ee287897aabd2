"""Bandits that choose a proposal's arm (operator, model, prompt template) by its payoff.

Optax-style: a :class:`Bandit` is a NamedTuple of pure functions over a
:class:`BanditState` pytree, so a state per island is just a stacked state
(``jax.vmap(bandit.choose)(states, keys)``; the functions themselves see one
island's f32[A] statistics) and checkpoints are plain arrays.

The loop calls ``choose`` before a proposal and, once its children are inserted,
``update(state, arm, credit, cost)`` with credit = the archive improvement the
children brought and cost > 0 (calls, tokens or USD). A pull's reward is
``credit / cost``, so an arm that costs 4x must improve the archive 4x as much.
All rules share the statistics and ``update``; they differ only in ``choose``:

- ``ucb1``: mean + c * sqrt(ln N / n), untried arms first (lowest index first).
- ``thompson``: a draw from a Gaussian posterior on each arm's mean reward.
- ``epsilon_greedy``: the best mean, or with probability epsilon a uniform arm.
- ``fixed``: a categorical over configured weights; ignores rewards (the
  behaviour without a bandit, kept so the loop talks to one interface).

Rewards are compared in units of the largest |reward| seen so far
(``reward_scale``), because archive improvements have no natural scale (they are
fitness units per call or per token) while UCB's bonus and Thompson's prior need
one. The scale never decays. With ``decay`` < 1 every update first multiplies all
arms' statistics by ``decay`` (discounted bandits, for operators whose usefulness
drifts during a run); ``decay = 1`` keeps plain sums.

:func:`make_bandit` validates its parameters; the rule factories trust theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qd.contract import ConfigError

RULES = ("ucb1", "thompson", "epsilon_greedy", "fixed")


class BanditState(NamedTuple):
    """Statistics of A arms (with islands, every leaf gains a leading axis I).

    Attributes:
        pulls: f32[A]; (discounted) number of updates of each arm.
        reward_sum: f32[A]; (discounted) sum of the arm's rewards credit / cost.
        reward_sq: f32[A]; (discounted) sum of the squared rewards.
        reward_scale: f32[]; the largest |reward| seen (0 before any nonzero one).
        step: i32[]; number of accepted updates, undiscounted.
    """

    pulls: jax.Array
    reward_sum: jax.Array
    reward_sq: jax.Array
    reward_scale: jax.Array
    step: jax.Array

    @property
    def num_arms(self) -> int:
        return self.pulls.shape[-1]


class Bandit(NamedTuple):
    """A rule. ``choose`` is deterministic for a (state, key); both are jitted.

    Attributes:
        init: ``(num_arms) -> BanditState`` with no pulls.
        choose: ``(state, key) -> i32[]``, the arm to pull.
        update: ``(state, arm, credit, cost) -> BanditState``, records one pull.
        choose_many: ``(state, keys [R]) -> i32[R]``, ``choose`` for each key in one
            dispatch (the arms of a wave of proposals, which all see the same state).
    """

    init: Callable[[int], BanditState]
    choose: Callable[[BanditState, jax.Array], jax.Array]
    update: Callable[[BanditState, Any, Any, Any], BanditState]
    choose_many: Callable[[BanditState, jax.Array], jax.Array]


def init(num_arms: int) -> BanditState:
    """The state of ``num_arms`` arms that have never been pulled."""
    if num_arms < 1:
        raise ConfigError("scheduler.num_arms", f"must be >= 1, got {num_arms}")
    zeros = jnp.zeros((num_arms,), jnp.float32)
    return BanditState(zeros, zeros, zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))


def mean_reward(state: BanditState) -> jax.Array:
    """f32[A]: each arm's (discounted) mean reward, 0 for an untried arm; for logging."""
    return state.reward_sum / jnp.maximum(state.pulls, jnp.finfo(jnp.float32).tiny)


def _scale(state: BanditState) -> jax.Array:
    """f32[]: the reward unit; 1 until a nonzero reward is seen."""
    return jnp.where(state.reward_scale > 0, state.reward_scale, 1.0)


def _make_update(decay: float) -> Callable[[BanditState, Any, Any, Any], BanditState]:
    @jax.jit
    def update_jit(state: BanditState, arm: jax.Array, credit: jax.Array, cost: jax.Array) -> BanditState:
        reward = jnp.asarray(credit, jnp.float32) / jnp.asarray(cost, jnp.float32)
        # Under tracing nothing can raise: a pull that would poison the sums is dropped.
        ok = (cost > 0) & jnp.isfinite(reward) & (arm >= 0) & (arm < state.num_arms)
        reward = jnp.where(ok, reward, 0.0)
        hit = (jnp.arange(state.num_arms) == arm) & ok
        keep = jnp.where(ok, jnp.float32(decay), 1.0)
        return BanditState(
            pulls=state.pulls * keep + hit,
            reward_sum=state.reward_sum * keep + hit * reward,
            reward_sq=state.reward_sq * keep + hit * reward**2,
            reward_scale=jnp.maximum(state.reward_scale, jnp.abs(reward)),
            step=state.step + ok.astype(jnp.int32),
        )

    def update(state: BanditState, arm: Any, credit: Any, cost: Any) -> BanditState:
        """Records that ``arm`` brought ``credit`` for ``cost`` (> 0).

        Concrete arguments are checked here (ValueError); traced ones (inside jit
        or vmap) are not, and an invalid pull is then ignored.
        """
        if not any(isinstance(x, jax.core.Tracer) for x in (arm, credit, cost)):
            _check_pull(state, arm, credit, cost)
        return update_jit(state, jnp.asarray(arm, jnp.int32), credit, cost)

    return update


def _check_pull(state: BanditState, arm: Any, credit: Any, cost: Any) -> None:
    arm_, credit_, cost_ = np.asarray(arm), np.asarray(credit), np.asarray(cost)
    if np.any((arm_ < 0) | (arm_ >= state.num_arms)):
        raise ValueError(f"scheduler update: arm {arm_} is out of range for {state.num_arms} arms")
    if not np.all(np.isfinite(credit_)):
        raise ValueError(f"scheduler update: credit must be finite, got {credit_}")
    if not np.all(np.isfinite(cost_) & (cost_ > 0)):
        raise ValueError(f"scheduler update: cost must be finite and > 0, got {cost_}")


def _bandit(choose: Callable[[BanditState, jax.Array], jax.Array], decay: float) -> Bandit:
    return Bandit(
        init=init,
        choose=jax.jit(choose),
        update=_make_update(decay),
        choose_many=jax.jit(jax.vmap(choose, in_axes=(None, 0))),
    )


def ucb1(c: float = math.sqrt(2.0), decay: float = 1.0) -> Bandit:
    """UCB1 (Auer et al. 2002) on rewards in units of the largest seen.

    Score = mean / reward_scale + c * sqrt(ln N / n), N the total pulls. Rewards
    are divided by the scale so that they lie in [-1, 1], where ``c = sqrt(2)``
    is the textbook bonus; with decay < 1 it is discounted UCB. An untried arm
    scores +inf, so arms are tried once each, lowest index first. The key is
    unused: the rule is deterministic.
    """

    def choose(state: BanditState, key: jax.Array) -> jax.Array:
        del key
        total = jnp.maximum(state.pulls.sum(), 1.0)
        n = jnp.maximum(state.pulls, jnp.finfo(jnp.float32).tiny)
        score = mean_reward(state) / _scale(state) + c * jnp.sqrt(jnp.log(total) / n)
        return jnp.argmax(jnp.where(state.pulls > 0, score, jnp.inf)).astype(jnp.int32)

    return _bandit(choose, decay)


def thompson(prior_count: float = 1.0, prior_var: float = 1.0, decay: float = 1.0) -> Bandit:
    """Thompson sampling with a Gaussian posterior on each arm's mean reward.

    Chosen over Beta-Bernoulli because archive improvements are real-valued and
    mostly zero: no binarisation is needed. In reward-scale units, each arm's mean
    starts at 0 with ``prior_count`` pseudo-pulls, so its posterior is
    N(sum / (n + n0), var / (n + n0)). The reward variance ``var`` is pooled over
    all pulls (starting from ``prior_var`` with n0 pseudo-pulls): an arm that has
    only returned zeros has sample variance 0 and would otherwise look certain and
    never be retried, although one lucky child is all that separates it from the
    others.
    """

    def choose(state: BanditState, key: jax.Array) -> jax.Array:
        scale = _scale(state)
        count = state.pulls + prior_count
        mean = state.reward_sum / scale / count
        total = state.pulls.sum() + prior_count
        pooled_mean = state.reward_sum.sum() / scale / total
        var = (state.reward_sq.sum() / scale**2 + prior_count * prior_var) / total - pooled_mean**2
        std = jnp.sqrt(jnp.maximum(var, 0.0) / count)
        draw = mean + std * jax.random.normal(key, mean.shape)
        return jnp.argmax(draw).astype(jnp.int32)

    return _bandit(choose, decay)


def epsilon_greedy(epsilon: float = 0.1, decay: float = 1.0) -> Bandit:
    """The arm of best mean reward, or with probability ``epsilon`` a uniform arm.

    Untried arms count as best (each is tried once, in random order), and ties
    between best arms are broken uniformly at random: mostly-zero rewards make
    exact ties common, and a fixed tie-break would starve the later arms.
    """

    def choose(state: BanditState, key: jax.Array) -> jax.Array:
        explore_key, uniform_key, tie_key = jax.random.split(key, 3)
        mean = jnp.where(state.pulls > 0, mean_reward(state), jnp.inf)
        best = mean == mean.max()
        greedy = jax.random.categorical(tie_key, jnp.where(best, 0.0, -jnp.inf))
        uniform = jax.random.randint(uniform_key, (), 0, state.num_arms)
        explore = jax.random.uniform(explore_key) < epsilon
        return jnp.where(explore, uniform, greedy).astype(jnp.int32)

    return _bandit(choose, decay)


def fixed(weights: Sequence[float] | None = None, decay: float = 1.0) -> Bandit:
    """A categorical over ``weights`` (uniform if None), ignoring rewards.

    The draw is ``jax.random.categorical(key, log(w / sum w))``, the loop's
    operator choice without a scheduler. Rewards are still recorded, for logging.
    """
    log_weights = None
    if weights is not None:
        w = np.asarray(weights, np.float64)
        with np.errstate(divide="ignore"):  # a zero weight is log 0 = -inf: never drawn
            log_weights = jnp.asarray(np.log(w / w.sum()).astype(np.float32))

    def choose(state: BanditState, key: jax.Array) -> jax.Array:
        logits = jnp.zeros_like(state.pulls) if log_weights is None else log_weights
        return jax.random.categorical(key, logits).astype(jnp.int32)

    bandit = _bandit(choose, decay)
    if log_weights is None:
        return bandit

    def init_checked(num_arms: int) -> BanditState:
        if num_arms != len(log_weights):
            raise ConfigError("scheduler.weights", f"has {len(log_weights)} entries for {num_arms} arms")
        return init(num_arms)

    return bandit._replace(init=init_checked)


# The parameters each rule takes (make_bandit rejects the others).
PARAMS = {
    "ucb1": ("c", "decay"),
    "thompson": ("prior_count", "prior_var", "decay"),
    "epsilon_greedy": ("epsilon", "decay"),
    "fixed": ("weights", "decay"),
}
_FACTORIES: dict[str, Callable[..., Bandit]] = {
    "ucb1": ucb1,
    "thompson": thompson,
    "epsilon_greedy": epsilon_greedy,
    "fixed": fixed,
}
_NUMBERS: dict[str, tuple[Callable[[float], bool], str]] = {
    "c": (lambda x: 0 <= x < math.inf, "must be a finite number >= 0"),
    "decay": (lambda x: 0 < x <= 1, "must be in (0, 1]"),
    "epsilon": (lambda x: 0 <= x <= 1, "must be in [0, 1]"),
    "prior_count": (lambda x: 0 < x < math.inf, "must be a finite number > 0"),
    "prior_var": (lambda x: 0 < x < math.inf, "must be a finite number > 0"),
}


def _check_weights(weights: Any, num_arms: int) -> None:
    def fail(problem: str) -> ConfigError:
        return ConfigError("scheduler.weights", f"{problem}, got {weights!r}")

    try:
        w = np.asarray(weights, np.float64)
    except (TypeError, ValueError):
        raise fail(f"must be a list of {num_arms} numbers") from None
    if w.shape != (num_arms,):
        raise fail(f"must be a list of {num_arms} numbers")
    if not np.all(np.isfinite(w) & (w >= 0)):
        raise fail("must be finite and >= 0")
    if w.sum() <= 0:
        raise fail("must have a positive sum")


def make_bandit(name: str, num_arms: int, **params: Any) -> Bandit:
    """The rule ``name`` (one of :data:`RULES`) for ``num_arms`` arms, its params checked
    by :func:`check_bandit`."""
    check_bandit(name, num_arms, **params)
    return _FACTORIES[name](**params)


def check_bandit(name: str, num_arms: int, **params: Any) -> None:
    """Checks a rule and its params without building it (the config plan calls this).

    Raises ConfigError (a ValueError) naming the bad field, e.g.
    ``scheduler.epsilon: must be in [0, 1], got 2``.
    """
    if name not in _FACTORIES:
        raise ConfigError("scheduler.rule", f"{name!r} is not one of {RULES}")
    if isinstance(num_arms, bool) or not isinstance(num_arms, (int, np.integer)) or num_arms < 1:
        raise ConfigError("scheduler.num_arms", f"must be an integer >= 1, got {num_arms!r}")
    for key, value in params.items():
        if key not in PARAMS[name]:
            raise ConfigError(
                f"scheduler.{key}",
                f"is not a parameter of rule {name!r} (it takes {PARAMS[name]})",
            )
        if key == "weights":
            if value is not None:
                _check_weights(value, num_arms)
            continue
        ok, problem = _NUMBERS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ConfigError(f"scheduler.{key}", f"must be a number, got {value!r}")
        if not ok(float(value)):
            raise ConfigError(f"scheduler.{key}", f"{problem}, got {value!r}")


def state_dict(state: BanditState) -> dict[str, np.ndarray]:
    """Host arrays keyed by field name, for a checkpoint."""
    return {k: np.asarray(v) for k, v in state._asdict().items()}


def load_state_dict(d: dict[str, np.ndarray], num_arms: int | None = None) -> BanditState:
    """The state saved by :func:`state_dict`; ValueError if a field is missing or
    the arm count differs from ``num_arms`` (the configured arms changed)."""
    missing = [k for k in BanditState._fields if k not in d]
    if missing:
        raise ValueError(f"scheduler state: missing field(s) {missing}")
    state = BanditState(
        **{k: jnp.asarray(d[k], jnp.int32 if k == "step" else jnp.float32) for k in BanditState._fields}
    )
    shapes = {state.pulls.shape, state.reward_sum.shape, state.reward_sq.shape}
    batch = {state.reward_scale.shape, state.step.shape}
    if len(shapes) != 1 or state.pulls.ndim < 1 or batch != {state.pulls.shape[:-1]}:
        raise ValueError(f"scheduler state: inconsistent shapes {jax.tree.map(jnp.shape, state)}")
    if num_arms is not None and state.num_arms != num_arms:
        raise ValueError(f"scheduler state: saved for {state.num_arms} arms, the config has {num_arms}")
    return state
