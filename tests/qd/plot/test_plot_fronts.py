"""``qd plot`` of a Pareto run: the fronts drawn are the run's, in the objectives' own units,
the largest hypervolume first, and the curve is the commit events' total hypervolume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qd import cli
from qd.plot.fronts import fronts_figure
from qd.rundir import RunDir


def test_the_fronts_figure_draws_each_cells_members_and_the_hypervolume_curve(pareto_run):
    with RunDir(pareto_run) as run:
        fig, drawn = fronts_figure(run)
        ids = np.asarray(run.fronts().genome_id)
        fronts = {
            (island, cell): run.store.get([int(i) for i in ids[island, cell] if i >= 0])
            for island, cell in drawn.cells
        }
    commits = [json.loads(x) for x in (pareto_run / "events.jsonl").read_text().splitlines()]
    totals = {e["evaluations"]: e["hypervolume"]["total"] for e in commits if e.get("event") == "commit"}
    assert drawn.evaluations.tolist() == sorted(totals)
    assert drawn.hypervolume.tolist() == pytest.approx([totals[k] for k in sorted(totals)])
    assert drawn.cells and drawn.hypervolumes == sorted(drawn.hypervolumes, reverse=True)
    for (island, cell), points in zip(drawn.cells, drawn.points):
        own = [[c.metrics["error"], c.metrics["size"]] for c in fronts[island, cell]]
        np.testing.assert_allclose(points, own, rtol=1e-6)  # own units: the error and size as stored
    assert len(fig.axes) == 1 + len(drawn.cells)


@pytest.mark.slow
def test_qd_plot_writes_a_pareto_runs_fronts(pareto_run, tmp_path, capsys):
    cli.main(["plot", str(pareto_run), "--out", str(tmp_path), "--format", "png"])
    written = capsys.readouterr().out.split()
    assert str(tmp_path / "fronts.png") in written and (tmp_path / "fronts.png").stat().st_size > 0
