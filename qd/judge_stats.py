"""How far a judge is from chance on labelled items, and the floor a judge must clear to be trusted.

Every experiment that lets a model judge (a text's quality or tone, whether two roles duplicate
each other, which of two attacks is stronger) measures that judge on a small labelled set. The
number that can tell a judge from a coin is the AUC: the chance that an item labelled 1 scores above
one labelled 0, ties half. A constant judge, a judge that always answers "A" and a check that never
rejects all score exactly 0.5, whatever the labels' balance, which plain accuracy does not (a check
that never rejects is right on every distinct pair). An answer that does not parse is a tie with
everything: not answering is chance, never a win.

:func:`above_chance` is the floor the experiments' tests assert on a scripted judge of known
accuracy (which must clear it) and on a constant one (which must not): the AUC at least
:data:`FLOOR` and its 95 % bootstrap interval above :data:`CHANCE`. The embedded model's numbers are
printed by the experiments' measuring scripts and stated in their READMEs, not floored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from qd.heldout import bootstrap

CHANCE = 0.5  # the AUC of any judge that ignores the item
FLOOR = 0.6  # the least AUC worth a judge's calls: right on a pair of items well beyond chance


def auc(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int], resamples: int = 2000, seed: int = 0
) -> dict:
    """The AUC of ``scores`` (NaN: no answer, a tie) against 0/1 ``labels``, with a 95 % interval.

    The interval resamples the labelled 1s and 0s separately (so every resample has both), ``seed``
    fixed: the same scores always print the same interval.

    Returns:
        ``{"auc", "auc_ci95": (low, high)}``, to merge into a judge's other numbers.
    """
    s, y = np.asarray(scores, np.float64), np.asarray(labels)
    if s.shape != y.shape or not np.isin(y, (0, 1)).all() or y.min() == y.max():
        raise ValueError("auc: pass one 0/1 label per score, with both labels present")
    pos, neg = s[y == 1][:, None], s[y == 0][None, :]
    beats = np.where(np.isnan(pos) | np.isnan(neg), 0.5, (pos > neg) + 0.5 * (pos == neg))  # f[P, N]
    rng = np.random.default_rng(seed)
    p = rng.integers(0, beats.shape[0], (resamples, beats.shape[0]))
    q = rng.integers(0, beats.shape[1], (resamples, beats.shape[1]))
    resampled = beats[p[:, :, None], q[:, None, :]].mean(axis=(1, 2))
    return {
        "auc": float(beats.mean()),
        "auc_ci95": (float(np.percentile(resampled, 2.5)), float(np.percentile(resampled, 97.5))),
    }


def paired_auc(outcomes: Sequence[float]) -> dict:
    """The AUC of a judge over labelled pairs (stronger, weaker): per pair 1 when the stronger one
    wins, 0 when the weaker one does, 0.5 when neither; with its 95 % bootstrap interval over pairs.

    Returns:
        ``{"auc", "auc_ci95": (low, high)}``.
    """
    return {"auc": float(np.mean(outcomes)), "auc_ci95": bootstrap(list(outcomes))}


def above_chance(measured: dict) -> bool:
    """The floor: an AUC of at least :data:`FLOOR` whose 95 % interval lies above :data:`CHANCE`."""
    value, (low, _) = measured["auc"], measured["auc_ci95"]
    return not math.isnan(value) and value >= FLOOR and low > CHANCE
