"""``qd plot``: each figure draws the run's numbers (heatmap cells = the snapshot's
fitness, curves = the commit events', the comparison = numpy's median/min/max over
the runs), the command line writes the files, and bad input is a one-line error."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from qd.rundir import RunDir

CUBE_TASK = '''
import numpy as np
from qd.task import Evaluation


class Cube:
    """Sphere-like fitness with three descriptors (sphere has two)."""

    kind, genome_dim, descriptor_dim, descriptor_names = "vector", 6, 3, ("a", "b", "c")

    def initial(self, rng, n):
        return np.zeros((n, 6), np.float32)

    def evaluate(self, g):
        x = np.asarray(g, np.float64)
        d = np.stack([x[:, :2].sum(1), x[:, 2:4].sum(1), x[:, 4:].sum(1)], 1)
        fitness = (100 - (x * x).sum(1)).astype(np.float32)
        return Evaluation(fitness, d.astype(np.float32), np.isfinite(x).all(1))


def make_task(**params):
    return Cube()
'''

SETTINGS = {"0": ["seed=0"], "1": ["seed=1"], "2": ["seed=0", "runner.batch_size=16"]}


@pytest.fixture(scope="module")
def multirun(tmp_path_factory) -> Path:
    """A multirun folder as ``qd-run -m`` leaves it: runs 0, 1 (seeds of one setting) and 2
    (another setting), each a 2-island run on a 6x5x4 grid over three descriptors."""
    from helpers import run_config, small_config

    root = tmp_path_factory.mktemp("multirun")
    task = root / "cube.py"
    task.write_text(CUBE_TASK)
    for name, overrides in SETTINGS.items():
        run_config(
            small_config(
                f"experiment.task={task}",
                "archive.bins=[6,5,4]",
                "archive.lower=[-4,-4,-4]",
                "archive.upper=[4,4,4]",
                "runner.max_evaluations=320",
                "islands.count=2",
                *overrides,
            ),
            root / "sweep" / name,
        )
        (root / "sweep" / name / ".hydra").mkdir()
        (root / "sweep" / name / ".hydra" / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in overrides)
        )
    return root / "sweep"


def test_grid_heatmap_pixel_of_each_cell_is_its_fitness(text_run):
    from qd.plot.archive import archive_figure

    with RunDir(text_run) as run:
        fig, drawn = archive_figure(run, dpi=40)
        g, snap = run.geometry, run.snapshot()
    assert drawn.mode == "image" and drawn.islands == [0, 1]
    isl, cell = snap.filled()
    assert len(cell) > 3
    rows_cols = np.unravel_index(cell, g.bins)  # x = axis 0 (columns), y = axis 1 (rows)
    images = np.stack(drawn.values)
    assert images.shape == (2, g.bins[1], g.bins[0])
    np.testing.assert_array_equal(images[isl, rows_cols[1], rows_cols[0]], snap.fitness[isl, cell])
    assert np.isnan(images).sum() == np.isnan(snap.fitness).sum()  # every other pixel blank
    assert drawn.limits == (np.nanmin(snap.fitness), np.nanmax(snap.fitness))  # one scale for both islands
    # function_fit's 10 x 6 bins are few: one tick label per bin range
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "[0, 2)",
        "[2, 4)",
        "[4, 6)",
        "[6, 8)",
        "[8, 10)",
        "[10, 12)",
    ]


def test_function_fits_axes_are_labelled_by_what_they_measure(text_run):
    from qd.plot.archive import archive_figure, parallel_figure

    with RunDir(text_run) as run:
        heatmap, _ = archive_figure(run, dpi=40)
        parallel, _ = parallel_figure(run, dpi=40)
    for ax in heatmap.axes[:2]:  # both islands' panels
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("AST nodes", "numeric constants")
    ticks = [t.get_text().split("\n")[0] for t in parallel.axes[0].get_xticklabels()]
    assert ticks == ["AST nodes", "numeric constants"]


def test_cvt_cells_are_voronoi_polygons_filled_with_their_fitness(cvt_run):
    from matplotlib.path import Path as Polygon

    from qd.plot.archive import archive_figure

    with RunDir(cvt_run) as run:
        fig, drawn = archive_figure(run, islands=[2, 0], dpi=40)
        snap, centroids, g = run.snapshot(), run.centroids(), run.geometry
    assert drawn.mode == "voronoi" and drawn.islands == [2, 0] and len(drawn.cells) == 500
    for ax, island in zip(fig.axes, [2, 0]):
        filled = ax.collections[0].get_array()
        np.testing.assert_array_equal(filled.filled(np.nan), snap.fitness[island])
    assert all(Polygon(p).contains_point(c) for p, c in zip(drawn.cells, centroids))  # cell k is centroid k's
    x, y = np.concatenate(drawn.cells).T
    area = sum(
        0.5 * abs(np.dot(p[:, 0], np.roll(p[:, 1], 1)) - np.dot(p[:, 1], np.roll(p[:, 0], 1)))
        for p in drawn.cells
    )
    assert area == pytest.approx((x.max() - x.min()) * (y.max() - y.min()), rel=1e-6)  # they tile the box
    # ... which covers the archive's bounds, not only its centroids
    assert x.min() <= g.lower[0] and y.min() <= g.lower[1] and x.max() >= g.upper[0] and y.max() >= g.upper[1]


def test_projection_pixel_is_the_best_elite_over_the_other_axes(multirun):
    from qd.plot.archive import archive_figure

    with RunDir(multirun / "0") as run:
        _, drawn = archive_figure(run, axes=(2, 0), dpi=40)
        snap = run.snapshot()
    cube = snap.fitness[1].reshape(6, 5, 4)
    expected = np.full((6, 4), np.nan)  # rows: axis 0's bins (y), columns: axis 2's (x)
    for r in range(6):
        for c in range(4):
            found = cube[r, :, c][np.isfinite(cube[r, :, c])]
            expected[r, c] = found.max() if len(found) else np.nan
    assert np.isfinite(expected).sum() > 5
    np.testing.assert_array_equal(drawn.values[1], expected)


def test_parallel_lines_are_the_elites_scaled_descriptors(multirun, tmp_path):
    from qd.plot.archive import parallel_figure

    with RunDir(multirun / "0") as run:
        fig, drawn = parallel_figure(run, islands=[1], dpi=40)
        snap = run.snapshot()
    _, cell = snap.filled(1)
    order = np.argsort(snap.fitness[1, cell], kind="stable")
    np.testing.assert_array_equal(drawn.fitness[0], snap.fitness[1, cell[order]])
    np.testing.assert_allclose(drawn.lines[0], (snap.descriptor[1, cell[order]] + 4) / 8, rtol=1e-6)
    fig.savefig(tmp_path / "parallel.svg")
    assert _svg_axes(tmp_path / "parallel.svg") == 2  # island 1 and the colour bar


def test_curves_are_the_commit_events_numbers(cvt_run):
    from qd.plot.curves import STATS, curves_figure

    commits = {}
    for line in (cvt_run / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("event", "commit") == "commit":
            commits[e["evaluations"]] = e  # a wave's last line holds its numbers
    with RunDir(cvt_run) as run:
        fig, drawn = curves_figure(run, dpi=40)
    assert drawn.evaluations.tolist() == sorted(commits) and len(commits) > 3
    assert list(drawn.lines) == ["global", "union", "island 0", "island 1", "island 2"]
    for k, stat in enumerate(STATS):
        for label, numbers in (("global", lambda e: e["global"]), ("island 2", lambda e: e["islands"][2])):
            logged = np.array([numbers(commits[x])[stat] for x in sorted(commits)])
            # an empty island's best is -inf in the log: a gap in the line
            np.testing.assert_array_equal(
                drawn.lines[label][stat], np.where(np.isfinite(logged), logged, np.nan)
            )
        np.testing.assert_array_equal(fig.axes[k].lines[0].get_ydata(), drawn.lines["global"][stat])


def test_compare_groups_seeds_of_a_setting_median_and_range(multirun):
    from qd import history
    from qd.plot.curves import STATS, compare_figure

    runs = {name: RunDir(multirun / name) for name in SETTINGS}
    try:
        _, groups = compare_figure(runs, dpi=40)
        raw = {name: history.curves(run) for name, run in runs.items()}
    finally:
        for run in runs.values():
            run.close()
    assert [(g.label, g.runs) for g in groups] == [("defaults", ["0", "1"]), ("runner.batch_size=16", ["2"])]
    same = groups[0]
    first = max(raw[n]["evaluations"][0] for n in same.runs)
    grid = sorted({x for n in same.runs for x in raw[n]["evaluations"] if x >= first})
    assert same.evaluations.tolist() == grid
    for stat in STATS:
        held = np.array(
            [
                [
                    raw[n]["global"][stat][max(k for k, e in enumerate(raw[n]["evaluations"]) if e <= x)]
                    for x in grid
                ]
                for n in same.runs
            ]
        )
        np.testing.assert_allclose(same.median[stat], np.median(held, 0))
        np.testing.assert_allclose(same.low[stat], held.min(0))
        np.testing.assert_allclose(same.high[stat], held.max(0))


def test_command_line_writes_each_runs_figures_and_the_comparison(multirun, tmp_path, capsys):
    from qd.cli import main

    before = sorted(p.relative_to(multirun) for p in multirun.rglob("*"))
    out = tmp_path / "plots"
    main(["plot", str(multirun), "--out", str(out), "--islands", "1", "--axes", "0,2", "--dpi", "30"])
    printed = capsys.readouterr().out.split()
    expected = [
        out / run / f"{figure}.{fmt}"
        for run in SETTINGS
        for figure in ("archive", "curves")
        for fmt in ("png", "svg")
    ] + [out / "compare.png", out / "compare.svg"]
    assert printed == [str(p) for p in expected] and all(p.stat().st_size > 0 for p in expected)
    assert (out / "0" / "archive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = {name: _svg_axes(out / name) for name in ("0/archive.svg", "0/curves.svg", "compare.svg")}
    assert panels == {
        "0/archive.svg": 2,
        "0/curves.svg": 3,
        "compare.svg": 3,
    }  # island 1 + colour bar; 3 stats
    assert sorted(p.relative_to(multirun) for p in multirun.rglob("*")) == before  # the runs are only read


def _svg_axes(path: Path) -> int:
    """The axes (panels and colour bars) in a matplotlib SVG: its ``<g id="axes_N">`` groups."""
    return sum(
        1 for g in ET.parse(path).iter("{http://www.w3.org/2000/svg}g") if g.get("id", "").startswith("axes_")
    )


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--axes", "0,5"], "--axes 0,5:"),
        (["--axes", "x"], "--axes x:"),
        (["--islands", "0,3"], "--islands 0,3:"),
        (["--format", "gif"], "--format gif:"),
        (["--out", "{run}/plots"], "--out "),
        (["--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_bad_argument_is_a_one_line_error(cvt_run, capsys, args, flag):
    from qd.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["plot", str(cvt_run), *[a.format(run=cvt_run) for a in args]])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and err.startswith(f"qd plot: {flag}")
    assert not (cvt_run / "plots").exists()


def test_a_folder_that_is_no_run_is_a_one_line_error(tmp_path, capsys):
    from qd.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["plot", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert (
        exit.value.code == 2
        and err.count("\n") == 1
        and err.startswith(f"qd plot: RUN_DIR {tmp_path}: neither")
    )
