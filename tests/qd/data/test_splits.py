"""Seeded splits: disjoint, covering, reproducible, and at least one train and validation row."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qd.contract import ConfigError
from qd.data import Row, split_rows


def rows(n):
    return [Row(str(i), f"q{i}", i, {}) for i in range(n)]


@given(
    st.integers(3, 80),
    st.integers(0, 2**31),
    st.sampled_from([(0.5, 0.25, 0.25), (0.6, 0.4, 0.0), (0.2, 0.3, 0.5)]),
)
def test_splits_partition_the_rows_the_same_way_for_a_seed(n, seed, fractions):
    try:
        s = split_rows(rows(n), seed, fractions)
    except ConfigError:
        assert n < 5  # only a handful of rows can fail to make the splits
        return
    ids = [r.id for part in (s.train, s.validation, s.test) for r in part]
    assert sorted(ids, key=int) == [str(i) for i in range(n)]
    assert s.train and s.validation and (s.test or fractions[2] == 0)
    assert split_rows(rows(n), seed, fractions) == s


def test_another_seed_shuffles_otherwise():
    assert split_rows(rows(40), 0).test != split_rows(rows(40), 1).test


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.7, 0.2, 0.2), (1.0, 0.0, 0.0), (0.5, -0.1, 0.6)])
def test_fractions_that_do_not_split_are_refused(fractions):
    with pytest.raises(ConfigError, match="splits: .* are not three fractions"):
        split_rows(rows(20), 0, fractions)


def test_duplicate_row_ids_are_refused():
    with pytest.raises(ConfigError, match="row id '1' is used twice"):
        split_rows([Row("1", "a", 1, {}), Row("1", "b", 2, {}), Row("2", "c", 3, {})], 0)
