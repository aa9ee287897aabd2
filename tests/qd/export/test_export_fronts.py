"""Exports of a Pareto run: ``dpo`` pairs along the fronts, and the ``diverse`` pool that ``qd
committee`` draws its members from is the union of the fronts."""

from __future__ import annotations

import numpy as np
import pytest

from qd.contract import ConfigError
from qd.export import diverse, dpo
from qd.rundir import RunDir


def front_members(run: RunDir) -> dict[int, tuple[int, int]]:
    """Each front member's id -> (island, cell) (a migrant sits on several islands: the first)."""
    ids = np.asarray(run.fronts().genome_id)
    out: dict[int, tuple[int, int]] = {}
    for island, cell, slot in zip(*np.nonzero(ids >= 0)):
        out.setdefault(int(ids[island, cell, slot]), (int(island), int(cell)))
    return out


def test_dpo_along_the_fronts_pairs_only_a_dominating_with_a_dominated_elite(pareto_run):
    with RunDir(pareto_run) as run:
        rows = list(dpo.rows(run, {"front_pairs": True, "max_pairs_per_prompt": 100}))
        members = front_members(run)
        held = {
            c.id: c for c in run.store.get(sorted({r[k] for r in rows for k in ("chosen_id", "rejected_id")}))
        }
        fronts = np.asarray(run.fronts().genome_id)
    assert rows and {r["source"] for r in rows} == {"front"}
    for r in rows:
        hi, lo = held[r["chosen_id"]].metrics, held[r["rejected_id"]].metrics
        assert r["chosen_id"] in members and r["chosen_id"] in fronts[r["island"], r["cell"]]
        assert r["rejected_id"] not in fronts[r["island"], r["cell"]]  # a member dominates no member
        assert hi["error"] <= lo["error"] and hi["size"] <= lo["size"]
        assert hi["error"] < lo["error"] or hi["size"] < lo["size"]
        assert r["margin"] == pytest.approx(lo["error"] - hi["error"] + lo["size"] - hi["size"], rel=1e-5)
        assert r["chosen"][0]["content"] != r["rejected"][0]["content"]


def test_front_pairs_on_a_run_without_fronts_is_refused(text_run):
    with RunDir(text_run) as run, pytest.raises(ConfigError, match="no Pareto run"):
        next(dpo.rows(run, {"front_pairs": True}))


def test_the_committee_pool_is_the_union_of_the_fronts(pareto_run):
    with RunDir(pareto_run) as run:
        members = front_members(run)
        picked = list(diverse.rows(run, {"k": len(members) + 10}))
        cells = [(r["island"], r["cell"]) for r in picked]
    assert sorted(r["id"] for r in picked) == sorted(members)  # every member, and nothing else
    assert len(set(cells)) < len(cells)  # cells with several members: a front, not a cell's best
