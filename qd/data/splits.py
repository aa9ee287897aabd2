"""Seeded train / validation / test splits of a dataset's rows.

Training rows are what a child is scored on first (a minibatch) and the only rows whose
mistakes are shown to the model; validation rows decide which children are good (only
children that beat their parent on the minibatch are scored on them); test rows are
scored once, after the run (``qd.data.heldout``), and never shown.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from qd.contract import ConfigError
from qd.data.rows import Row

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Splits:
    train: list[Row]
    validation: list[Row]
    test: list[Row]


def split_rows(rows: list[Row], seed: int = 0, fractions: tuple[float, ...] = (0.5, 0.25, 0.25)) -> Splits:
    """``rows`` shuffled with ``seed`` and cut by ``fractions`` (train, validation, test; they sum
    to 1, test may be 0). Every split but test gets at least one row."""
    if (
        len(fractions) != 3
        or any(not isinstance(f, (int, float)) or f < 0 for f in fractions)
        or not math.isclose(sum(fractions), 1.0)
        or min(fractions[:2]) <= 0
    ):
        raise ConfigError(
            "splits",
            f"{tuple(fractions)!r} are not three fractions of the rows",
            "give (train, validation, test) fractions summing to 1, e.g. (0.5, 0.25, 0.25); test may be 0",
        )
    ids = [row.id for row in rows]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(
            "dataset", f"row id {twice!r} is used twice", "give each row a unique 'id' (or none)"
        )
    n = len(rows)
    n_test = round(n * fractions[2])
    n_val = max(1, round(n * fractions[1]))
    if n - n_val - n_test < 1:
        raise ConfigError(
            "dataset", f"{n} rows cannot make the splits {tuple(fractions)}", "give more rows (3 at least)"
        )
    order = np.random.default_rng(seed).permutation(n)
    shuffled = [rows[i] for i in order]
    return Splits(shuffled[n_val + n_test :], shuffled[:n_val], shuffled[n_val : n_val + n_test])
