"""A Pareto run read: the hypervolume in the summary, the commit events and ``qd stats`` is the
brute-force hypervolume of the fronts the run stored, against the reference its events record."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from qd import cli
from qd.budget import Budget
from qd.report import closing_lines
from qd.rundir import RunDir
from qd.views.summary import header, summary


def brute_area(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The union of the rectangles [reference, point] by inclusion-exclusion over every subset."""
    total = 0.0
    for size in range(1, len(points) + 1):
        for subset in itertools.combinations(points, size):
            sides = [max(min(p[j] for p in subset) - reference[j], 0.0) for j in (0, 1)]
            total += (-1) ** (size + 1) * sides[0] * sides[1]
    return total


def stored_fronts(run: RunDir) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """Each front's members as the store holds them: (error, size) negated (both are minimised)."""
    state = run.fronts()
    ids = np.asarray(state.genome_id)
    out = {}
    for island, cell in zip(*np.nonzero((ids >= 0).any(-1))):
        members = run.store.get([int(i) for i in ids[island, cell] if i >= 0])
        out[int(island), int(cell)] = [(-c.metrics["error"], -c.metrics["size"]) for c in members]
    return out


def test_the_summary_events_and_stats_give_the_brute_force_hypervolume_of_the_stored_fronts(
    pareto_run, capsys
):
    events = [json.loads(x) for x in (pareto_run / "events.jsonl").read_text().splitlines()]
    commits = [e for e in events if e.get("event") == "commit"]
    assert all("hypervolume" in e for e in commits)
    reference = commits[0]["hypervolume"]["reference"]  # derived once (no archive.reference) ...
    assert all(e["hypervolume"]["reference"] == reference for e in commits)  # ... and kept
    with RunDir(pareto_run) as run:
        fronts = stored_fronts(run)
        s = summary(run)
    maximised_reference = (-reference[0], -reference[1])
    per_cell = {at: brute_area(points, maximised_reference) for at, points in fronts.items()}
    expected = sum(per_cell.values())
    assert len(fronts) >= 2 and expected > 0
    assert s["hypervolume"] == pytest.approx(expected, rel=1e-5)
    assert ", hypervolume " in header(s)
    assert commits[-1]["hypervolume"]["total"] == pytest.approx(expected, rel=1e-5)

    cli.main(["stats", str(pareto_run), "--json"])
    stats = json.loads(capsys.readouterr().out)["hypervolume"]
    assert stats["total"] == pytest.approx(expected, rel=1e-5)
    assert {(r["island"], r["cell"]): pytest.approx(r["hypervolume"], rel=1e-5) for r in stats["cells"]} == {
        at: pytest.approx(v, rel=1e-5) for at, v in per_cell.items()
    }
    volumes = [r["hypervolume"] for r in stats["cells"]]
    assert volumes == sorted(volumes, reverse=True)
    cli.main(["stats", str(pareto_run)])
    assert "fronts: hypervolume" in capsys.readouterr().out


def test_the_end_of_a_pareto_run_shows_the_front_of_the_cell_with_the_largest_hypervolume(pareto_run):
    commits = [json.loads(x) for x in (pareto_run / "events.jsonl").read_text().splitlines()]
    final = [e for e in commits if e.get("event") == "commit"][-1]
    reference = final["hypervolume"]["reference"]
    with RunDir(pareto_run) as run:
        fronts = stored_fronts(run)
        ids = np.asarray(run.fronts().genome_id)
    per_cell = {at: brute_area(points, (-reference[0], -reference[1])) for at, points in fronts.items()}
    island, cell = max(per_cell, key=lambda at: (per_cell[at], -at[0], -at[1]))  # the earlier on ties
    lines = closing_lines(final, pareto_run, Budget(max_llm_calls=24), None)
    at = next(k for k, line in enumerate(lines) if "the largest front" in line)
    assert f"the largest front, island {island}, cell {cell}" in lines[at]
    members = [int(i) for i in ids[island, cell] if i >= 0]
    assert [line.split(":")[0].strip() for line in lines[at + 1 :]] == [f"#{i}" for i in members]
    error, size = fronts[island, cell][0]
    assert lines[at + 1] == f"  #{members[0]}: error {-error:.6g}, size {-size:.6g}"
