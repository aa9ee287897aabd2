"""The judge floor: a judge that ignores the item sits at chance whatever the labels' balance, and only
a judge that ranks the labels right clears the floor."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd import judge_stats

labels = st.lists(st.sampled_from([0, 1]), min_size=2, max_size=30).filter(lambda y: 0 < sum(y) < len(y))


@settings(max_examples=25)
@given(labels, st.sampled_from([0.0, 0.4, 1.0, math.nan]))
def test_a_judge_that_gives_every_item_one_score_or_none_is_at_chance_and_fails_the_floor(y, score):
    measured = judge_stats.auc([score] * len(y), y)
    assert measured == {"auc": 0.5, "auc_ci95": (0.5, 0.5)} and not judge_stats.above_chance(measured)


@settings(max_examples=25)
@given(labels, st.randoms(use_true_random=False))
def test_reversing_a_judge_mirrors_its_auc_about_chance(y, rng):
    scores = [rng.random() for _ in y]
    assert judge_stats.auc(scores, y)["auc"] == pytest.approx(
        1 - judge_stats.auc([-s for s in scores], y)["auc"]
    )


def test_the_auc_counts_ties_and_unanswered_items_half_and_the_interval_contains_it():
    measured = judge_stats.auc([0.9, 0.5, math.nan, 0.1, 0.5], [1, 1, 1, 0, 0])
    # of the 6 (1, 0) pairs: 0.9 beats both, 0.5 beats 0.1 and ties 0.5, the unanswered one ties both
    assert measured["auc"] == pytest.approx((2 + 1.5 + 1) / 6)
    low, high = measured["auc_ci95"]
    assert low <= measured["auc"] <= high


def test_a_judge_that_knows_the_labels_clears_the_floor_and_a_weak_one_on_few_items_does_not():
    y = np.arange(24) % 2
    assert judge_stats.above_chance(judge_stats.auc(y.astype(float), y))
    weak = judge_stats.auc([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [1, 1, 0, 0, 1, 0])  # AUC 0.67 on six items
    assert weak["auc"] > judge_stats.FLOOR and weak["auc_ci95"][0] <= judge_stats.CHANCE
    assert not judge_stats.above_chance(weak)
    with pytest.raises(ValueError, match="both labels"):
        judge_stats.auc([0.1, 0.2], [1, 1])


def test_paired_outcomes_score_the_stronger_wins_with_draws_half():
    assert judge_stats.paired_auc([0.5] * 12) == {"auc": 0.5, "auc_ci95": (0.5, 0.5)}
    measured = judge_stats.paired_auc([1.0] * 9 + [0.5] * 3)
    assert measured["auc"] == pytest.approx(0.875) and judge_stats.above_chance(measured)
