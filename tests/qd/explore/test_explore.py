"""The web explorer's API (``qd.explore``), called in process: its answers are the readers'
(``RunDir``, ``qd.history``), it follows a run in progress, and it never writes to the run."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from fastapi.testclient import TestClient

from qd import history
from qd.explore import main, make_app
from qd.rundir import RunDir


@pytest.fixture(scope="module")
def api(text_run, cvt_run):
    with TestClient(make_app([text_run, cvt_run], watch_s=None)) as client:
        yield client


def heatmap(api, run, island, **axes):
    response = api.get(f"/api/run/{run}/heatmap", params={"island": island, **axes})
    assert response.status_code == 200, response.text
    w, h = int(response.headers["X-QD-Width"]), int(response.headers["X-QD-Height"])
    values = np.frombuffer(response.content[: 4 * w * h], "<f4")
    cells = np.frombuffer(response.content[4 * w * h :], "<i4")
    return w, h, values, cells


def test_the_api_names_function_fits_axes_by_what_they_measure(api):
    assert api.get("/api/run/0/summary").json()["axes"] == ["AST nodes", "numeric constants"]
    assert api.get("/api/runs").json()[1]["axes"] == ["first-half sum", "second-half sum"]


def elite_with_parent(run: RunDir):
    """(island, cell, candidate) of an elite made from a parent (it has a diff)."""
    snap = run.snapshot()
    for island, cell in zip(*snap.filled()):
        (c,) = run.store.get([int(snap.genome_id[island, cell])])
        if c.parent_ids:
            return int(island), int(cell), c
    raise AssertionError("the fixture run has no elite with a parent")


def test_heatmap_values_are_the_snapshot_fitness(api, text_run, cvt_run):
    with RunDir(text_run) as run:
        snap, g = run.snapshot(), run.geometry
        for island in range(g.islands):
            w, h, values, cells = heatmap(api, 0, island)
            assert (w, h) == (g.bins[0], g.bins[1])
            # every cell once, row 0 the top: pixel (row, col) is grid cell (col, h - 1 - row)
            rows, cols = np.divmod(np.arange(w * h), w)
            expected = cols * g.bins[1] + (h - 1 - rows)
            np.testing.assert_array_equal(values, snap.fitness[island][expected])
            assert sorted(cells[cells >= 0]) == sorted(np.flatnonzero(snap.genome_id[island] >= 0))
    with RunDir(cvt_run) as run:  # a nearest-centroid raster: each pixel shows its centroid's cell
        snap = run.snapshot()
        w, h, values, cells = heatmap(api, 1, 2)
        filled = cells >= 0
        np.testing.assert_array_equal(values[filled], snap.fitness[2][cells[filled]])
        assert np.isnan(values[~filled]).all()
        assert set(cells[filled]) <= set(np.flatnonzero(snap.genome_id[2] >= 0))


def test_cell_shows_the_stored_elite_and_its_parent_diff(api, text_run):
    with RunDir(text_run) as run:
        island, cell, c = elite_with_parent(run)
        got = api.get("/api/run/0/cell", params={"island": island, "cell": cell}).json()
        assert got["id"] == c.id and got["text"] == c.text and got["diff"] == history.parent_diff(run, c)
        assert got["diff"] and '<span class="gd">' in got["diff_html"]  # Pygments' deleted-line class
        assert [island, cell] in got["elite"] and got["cell"]["fitness"] == pytest.approx(c.fitness)
        assert got["prompt"][0]["role"] == "system" and got["response"] == c.response
        assert got == api.get(f"/api/run/0/candidate/{c.id}").json() | {"cell": got["cell"]}


def test_lineage_is_history_lineage(api, text_run):
    with RunDir(text_run) as run:
        _, _, c = elite_with_parent(run)
        steps = history.lineage(run, c.id)
    got = api.get(f"/api/run/0/lineage/{c.id}").json()
    assert len(got) == len(steps) >= 2 and got[-1]["id"] == c.id
    for mine, theirs in zip(got, steps):
        assert mine == json.loads(json.dumps({k: v for k, v in theirs.items() if k not in ("text", "diff")}))


def test_search_finds_text_and_filters(api, text_run):
    with RunDir(text_run) as run:
        _, _, c = elite_with_parent(run)
        invalid = [x.id for x in run.store.iter() if not x.valid]
        errors = [x.id for x in run.store.iter() if x.error]
    line = max(c.text.splitlines(), key=len).strip()
    found = api.get("/api/run/0/search", params={"q": line, "limit": 200}).json()
    assert c.id in [r["id"] for r in found["rows"]] and found["total"] == len(found["rows"])
    assert all(line in r["snippet"] for r in found["rows"])
    bad = api.get("/api/run/0/search", params={"valid": "false", "sort": "id", "limit": 200}).json()
    assert invalid and [r["id"] for r in bad["rows"]] == invalid and bad["total"] == len(invalid)
    erred = api.get("/api/run/0/search", params={"error": "true", "sort": "id"}).json()
    assert [r["id"] for r in erred["rows"]] == errors
    page = api.get("/api/run/0/search", params={"sort": "newest", "limit": 5, "offset": 5}).json()
    assert [r["id"] for r in page["rows"]] == list(range(page["total"] - 6, page["total"] - 11, -1))
    assert api.get("/api/run/0/search", params={"q": "no such text %_"}).json()["total"] == 0


def test_stats_and_ledger_are_the_readers(api, text_run):
    with RunDir(text_run) as run:
        assert api.get("/api/run/0/stats").json() == history.operator_stats(run, ("operator", "model"))
        assert api.get("/api/run/0/stats", params={"by": "operator"}).json() == history.operator_stats(
            run, ("operator",)
        )
        calls = run.store.calls.totals()
    ledger = api.get("/api/run/0/ledger").json()
    assert ledger["total"]["calls"] == sum(r[2] for r in calls) == 24
    assert api.get("/api/run/0/stats", params={"by": "colour"}).status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/api/run/7/summary",
        "/api/run/x/curves",
        "/api/run/0/cell?island=0&cell=100000",
        "/api/run/0/cell?island=9&cell=0",
        "/api/run/0/candidate/100000",
        "/api/run/0/lineage/100000",
        "/api/run/0/heatmap?island=5",
    ],
)
def test_what_is_not_there_is_a_404_with_one_line(api, path):
    response = api.get(path)
    assert response.status_code == 404
    (message,) = response.json().values()
    assert message and "\n" not in message


def test_an_empty_cell_is_a_404(api, text_run):
    with RunDir(text_run) as run:
        empty = int(np.flatnonzero(run.snapshot().genome_id[0] < 0)[0])
    response = api.get("/api/run/0/cell", params={"island": 0, "cell": empty})
    assert response.status_code == 404 and "empty" in response.json()["error"]


def test_a_run_in_progress_shows_what_is_stored_so_far(tmp_path):
    from helpers import run_engine, small_config

    from qd.run import build_engine
    from qd.store import Store

    path = tmp_path / "live"
    seen: list[dict] = []
    clients: list[TestClient] = []

    def look(event: dict) -> None:
        if event["batches"] % 6:
            return
        if not clients:
            clients.append(TestClient(make_app([path], watch_s=None)).__enter__())
        api = clients[0]
        with Store(path / "store.sqlite", readonly=True) as store:
            stored = store.count()
        with RunDir(path) as fresh:
            snap = fresh.snapshot()
        summary = api.get("/api/run/0/summary").json()
        assert summary["evaluations"] == stored == api.get("/api/run/0/search").json()["total"]
        assert summary["last_id"] == stored - 1 and summary["elites"] == (snap.genome_id >= 0).sum(1).tolist()
        _, _, values, _ = heatmap(api, 0, 0)
        assert np.isfinite(values).sum() == (snap.genome_id[0] >= 0).sum()
        seen.append({"version": api.get("/api/version").json()["versions"][0], "evaluations": stored})

    try:
        run_engine(build_engine(small_config("runner.max_evaluations=384"), path, on_commit=look))
    finally:
        for client in clients:
            client.__exit__(None, None, None)
    assert len(seen) >= 2
    assert len({s["version"] for s in seen}) == len(seen)
    assert [s["evaluations"] for s in seen] == sorted({s["evaluations"] for s in seen})


def test_the_explorer_writes_nothing_to_the_run(text_run):
    def files() -> dict:
        return {
            str(p.relative_to(text_run)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(text_run.rglob("*"))
            if p.is_file()
        }

    before = files()
    assert {"config.yaml", "events.jsonl", "store.sqlite", "checkpoints/checkpoint.npz"} <= set(before)
    with TestClient(make_app([text_run])) as api:  # the background warmer too
        for path in (
            "/",
            "/highlight.css",
            "/static/app.js",
            "/api/runs",
            "/api/version",
            "/api/run/0/curves",
            "/api/run/0/stats?by=instruction",
            "/api/run/0/ledger",
            "/api/run/0/heatmap?island=1",
            "/api/run/0/search?q=def",
            "/api/run/0/lineage/0",
            "/api/run/0/candidate/1",
        ):
            assert api.get(path).status_code == 200, path
    assert files() == before


def test_bad_command_lines_exit_2_with_one_line(tmp_path, text_run, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "nope"), "--no-browser"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qd explore: ") and "\n" not in err and "run directory" in err
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(SystemExit) as exit_:
            main([str(text_run), "--no-browser", "--port", str(taken.getsockname()[1])])
    finally:
        taken.close()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "cannot listen" in err and "--port" in err and "\n" not in err


def test_more_axes_show_the_best_over_the_rest():
    from types import SimpleNamespace

    from qd.explore import data
    from qd.rundir import Geometry, Snapshot

    g = Geometry(
        kind="grid",
        islands=1,
        cells=60,
        dim=3,
        bins=(4, 3, 5),
        lower=(0,) * 3,
        upper=(1,) * 3,
        axes=("a", "b", "c"),
    )
    fitness, ids = np.full((1, 60), np.nan, np.float32), np.full((1, 60), -1)
    fitness[0, [0, 1, 17, 59]], ids[0, [0, 1, 17, 59]] = [1, 5, 3, 2], [10, 11, 12, 13]
    snap = Snapshot(fitness, np.zeros((1, 60, 3), np.float32), ids, 3, -1, 4)
    run = SimpleNamespace(geometry=g, snapshot=lambda: snap, spec=lambda: None)
    r = data._raster(run, 0, 1)  # cells (a, b, c): 0 = (0,0,0), 1 = (0,0,1), 17 = (1,0,2), 59 = (3,2,4)
    values, cells = data._heatmap(run, r, 0)
    assert (r.width, r.height, r.cell_map) == (4, 3, None)
    np.testing.assert_array_equal(cells.reshape(3, 4), [[-1, -1, -1, 59], [-1, -1, -1, -1], [1, 17, -1, -1]])
    np.testing.assert_array_equal(values[cells >= 0], fitness[0, cells[cells >= 0]])


def test_the_front_api_answers_a_pareto_cells_members_in_own_units_and_404_elsewhere(api, pareto_run):
    from qd import fronts

    with TestClient(make_app([pareto_run], watch_s=None)) as client, RunDir(pareto_run) as run:
        state, meter = fronts.of_run(run)
        volumes = meter.cells(state)
        island, cell = (int(v) for v in np.unravel_index(int(np.argmax(volumes)), volumes.shape))
        got = client.get(f"/api/run/0/front?island={island}&cell={cell}").json()
        members = run.store.get([genome_id for genome_id, _ in fronts.front(state, island, cell)])
        summary = client.get("/api/run/0/summary").json()
    assert got["objectives"] == [["error", "min"], ["size", "min"]]
    assert got["hypervolume"] == pytest.approx(volumes[island, cell])
    assert [m["id"] for m in got["members"]] == [c.id for c in members]
    for m, c in zip(got["members"], members):
        assert m["values"] == pytest.approx([c.metrics["error"], c.metrics["size"]], rel=1e-6)
    assert summary["hypervolume"]["total"] == pytest.approx(volumes.sum())
    missing = api.get("/api/run/0/front?island=0&cell=0")  # text_run: one elite per cell
    assert missing.status_code == 404 and "no fronts" in missing.json()["error"]
