"""``qd.history``'s statistics read the store a page at a time: every grouping merged from the
per-combination tallies equals the same grouping of every candidate's fates held at once."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import stored

from qd import history
from qd.rundir import RunDir


def test_the_store_scan_reads_each_first_parents_fitness(text_run):
    rows = stored(text_run)
    fitness = {c.id: c.fitness for c in rows}
    with RunDir(text_run) as run:
        got = dict(row for page in run.store.columns(("id", "parent_fitness"), page=7) for row in page)
    assert got == {c.id: fitness[c.parent_ids[0]] if c.parent_ids else None for c in rows}
    assert any(v is not None for v in got.values()) and None in got.values()


@pytest.mark.parametrize("by", [(), ("operator",), ("operator", "model"), ("model",)])
def test_streamed_stats_equal_the_groups_of_every_fate_at_once(text_run, by):
    with RunDir(text_run) as run:
        f = history.fates(run)
        got = history.operator_stats(run, by)
    keys = list(zip(*(f[b].tolist() for b in by))) if by else [()] * len(f["id"])
    assert len(got) == len(set(keys)) and sum(r["candidates"] for r in got) == len(f["id"])
    for row in got:
        key = tuple(row[b] for b in by)
        m = np.asarray([k for k, x in enumerate(keys) if tuple(v or "-" for v in x) == key])
        gains = f["improvement"][m][np.isfinite(f["improvement"][m])]
        assert row["candidates"] == len(m) and row["valid"] == f["valid"][m].sum()
        assert row["entered"] == f["entered"][m].sum() and row["tokens"] == f["tokens"][m].sum()
        assert row["cost"] == pytest.approx(f["cost"][m].sum())
        assert row["mean_improvement"] == (pytest.approx(gains.mean()) if len(gains) else None)
