"""Scripted judges of known accuracy, for the tests that a judge floor passes a judge that knows the
labels and fails one that ignores the item (``qd.judge_stats.above_chance``).

A judge of known accuracy answers as labelled on every item except a fixed share of them, chosen by
the hash of the item's prompt: deterministic across runs and machines, and blind to which answer is
right, so the wrong items fall on either label as chance has it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

ACCURACY = 0.8  # the share of labelled items a scripted judge answers as labelled


def wrong_on(prompts: Iterable[str], accuracy: float = ACCURACY) -> frozenset[str]:
    """The prompts a judge of ``accuracy`` answers wrongly: the round((1 - accuracy) * n) of smallest
    sha256."""
    ranked = sorted(prompts, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    return frozenset(ranked[: round((1 - accuracy) * len(ranked))])
