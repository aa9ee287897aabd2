"""Reading a run directory (``qd.rundir``): the archive as a resume rebuilds it, live and
after the end; what the end of a run writes and prints; and the history behind the views."""

import json
import sqlite3

import jax
import numpy as np
import pytest
from helpers import small_config, stored

from qd import archive, history, rundir
from qd.archive import pareto
from qd.plan import plan
from qd.run import build_engine, print_best
from qd.rundir import Geometry, RunDir, RunDirError, checkpoint, written_best
from qd.rundir.layout import CENTROIDS, CONFIG, GEOMETRY, spec_of


def _files(path):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.rglob("*") if p.is_file()}


def test_a_reader_sees_a_run_in_progress_as_the_engine_holds_it_and_writes_nothing(tmp_path):
    """At each checked commit the replayed archive (last checkpoint + store rows after it,
    migrations and island resets included) equals the engine's own, cell for cell."""
    cfg = small_config(
        "archive=cvt",
        "archive.cells=200",
        "islands.count=3",
        "islands.migrate_every=60",
        "islands.reset_patience=150",
        "runner.max_evaluations=640",
        "runner.checkpoint_every=5",
    )
    seen = []

    def check(event):
        if event["batches"] not in (3, 8, 14, 19):  # before the first checkpoint (at 5), then between them
            return
        state = engine.state.archive
        before = _files(tmp_path)
        with RunDir(tmp_path) as run:
            snap = run.snapshot()
            assert snap.evaluations == event["evaluations"] == len(stored(tmp_path))
            np.testing.assert_array_equal(snap.genome_id, np.asarray(state.genome_id))
            np.testing.assert_array_equal(
                snap.fitness, np.where(np.asarray(state.genome_id) >= 0, np.asarray(state.fitness), np.nan)
            )
            seen.append((snap.checkpoint_id, snap.last_id))
        assert _files(tmp_path) == before  # read-only: no file touched (the store's WAL included)

    engine = build_engine(cfg, tmp_path, on_commit=check)
    try:
        engine.run()
    finally:
        engine.close()
    assert len(seen) == 4 and seen[0][0] == -1  # the first reading replayed the store alone
    assert all(0 <= ckpt < last for ckpt, last in seen[1:])  # the others, a checkpoint and the rows after it


@pytest.mark.parametrize(
    "kind",
    [
        ("archive=grid",),
        ("archive=cvt", "archive.cells=60", "archive.cvt_samples=600"),
        ("archive=novelty", "archive.capacity=40"),
    ],
    ids=["grid", "cvt", "novelty"],
)
def test_a_build_writes_the_founding_files_and_its_spec_is_the_one_a_reader_makes(tmp_path, kind):
    """The engine's spec and a reader's come from the saved geometry by one function, so
    they are the same cells; a second build (a resume) reuses the saved CVT centroids."""
    p = plan(small_config("islands.count=2", *kind))
    spec = rundir.create(p, tmp_path)
    assert (tmp_path / CONFIG).is_file() and (tmp_path / GEOMETRY).is_file()
    g = Geometry.load(tmp_path)
    assert (g.kind, g.islands, g.cells, g.dim) == (p.cfg.archive.kind, 2, spec.num_cells, 2)
    centroids = np.load(tmp_path / CENTROIDS) if g.kind == "cvt" else None
    assert (centroids is not None) == (tmp_path / CENTROIDS).is_file()
    again = spec_of(g, centroids)
    if g.kind == "cvt":
        np.testing.assert_array_equal(np.asarray(again.centroids), np.asarray(spec.centroids))
        resumed = rundir.create(plan(small_config("islands.count=2", *kind, "archive.cvt_seed=9")), tmp_path)
        np.testing.assert_array_equal(np.asarray(resumed.centroids), centroids)
    else:
        assert again == spec


def test_a_run_from_before_archive_json_is_refused_with_the_command_that_writes_it(tmp_path):
    from qd.store import Store

    (tmp_path / CONFIG).write_text("seed: 0\n")
    Store(tmp_path / "store.sqlite").close()
    with RunDir(tmp_path) as run, pytest.raises(RunDirError) as refused:
        run.snapshot()
    assert str(refused.value) == (
        f"{tmp_path}: no archive.json (a run from before qd saved its archive's geometry); "
        f"`qd-run resume={tmp_path}` writes it"
    )


def test_the_end_of_a_run_writes_elites_and_the_best_program_and_prints_it(text_run, capsys):
    with RunDir(text_run) as run:
        snap = run.snapshot()
        best = run.best()
    rows = [json.loads(line) for line in (text_run / "elites.jsonl").read_text().splitlines()]
    assert len(rows) == int((snap.genome_id >= 0).sum())
    assert [r["fitness"] for r in rows] == sorted((r["fitness"] for r in rows), reverse=True)
    for r in rows:
        assert snap.genome_id[r["island"], r["cell"]] == r["id"]
        (c,) = [c for c in stored(text_run) if c.id == r["id"]]
        assert r["text"] == c.text and r["operator"] == c.operator and r["parent_ids"] == list(c.parent_ids)
    assert rows[0]["id"] == best["id"] and rows[0]["fitness"] == np.nanmax(snap.fitness)
    assert (text_run / "best.py").read_text().strip() == best["text"].strip()
    print_best(written_best(text_run), text_run)
    out = capsys.readouterr().out
    assert (
        f"best: fitness={best['fitness']:.6g} island={best['island']} cell={best['cell']} id={best['id']}"
        in out
    )
    assert best["text"].strip() in out and f"qd lineage {text_run} {best['id']}" in out


def test_a_vector_run_saves_its_best_as_json(cvt_run):
    best = json.loads((cvt_run / "best.json").read_text())
    with RunDir(cvt_run) as run:
        snap = run.snapshot()
        (c,) = run.store.get([best["id"]])
    assert best["fitness"] == np.nanmax(snap.fitness)
    np.testing.assert_allclose(best["vector"], c.vector)
    assert snap.genome_id[best["island"], best["cell"]] == best["id"]


def test_a_path_that_is_not_a_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(RunDirError, match=r"no config.yaml; pass a run directory made by qd-run") as e:
        RunDir(tmp_path)
    assert "\n" not in str(e.value)


def test_fates_and_operator_stats_agree_with_a_replay_of_the_store(text_run):
    """``entered``: the candidate beat every earlier candidate of its island and cell."""
    rows = stored(text_run)
    with RunDir(text_run) as run:
        f = history.fates(run)
        spec = run.spec()
        stats = {(s["operator"], s["model"]): s for s in history.operator_stats(run)}
    best = {}
    for k, c in enumerate(rows):
        cell = (
            int(spec.index(np.asarray(c.descriptor)[None])[0]) if c.valid and np.isfinite(c.fitness) else -1
        )
        assert f["cell"][k] == cell
        entered = cell >= 0 and c.fitness > best.get((c.island, cell), -np.inf)
        if entered:
            best[(c.island, cell)] = c.fitness
        assert f["entered"][k] == entered
    children = [c for c in rows if c.operator == "rewrite"]
    s = stats[("rewrite", "scripted")]
    assert s["candidates"] == len(children) and s["valid"] == sum(c.valid for c in children)
    assert s["cost"] == pytest.approx(sum(c.cost for c in children))
    by_id = {c.id: c for c in rows}
    gains = [c.fitness - by_id[c.parent_ids[0]].fitness for c in children if c.valid]
    assert s["mean_improvement"] == pytest.approx(np.mean(gains))


def test_lineage_follows_first_parents_with_diffs_and_keeps_evicted_ancestors(text_run):
    rows = {c.id: c for c in stored(text_run)}
    with RunDir(text_run) as run:
        elites = set(run.snapshot().genome_id[run.snapshot().genome_id >= 0].tolist())
        deepest = max(rows, key=lambda i: len(history.lineage(run, i)))
        steps = history.lineage(run, deepest)
    assert len(steps) >= 2 and steps[-1]["id"] == deepest and steps[0]["parent_ids"] == []
    for parent, child in zip(steps, steps[1:]):
        assert rows[child["id"]].parent_ids[0] == parent["id"]
        assert child["diff"] == history.diff(
            rows[parent["id"]].text or "", rows[child["id"]].text or "", f"#{parent['id']}", f"#{child['id']}"
        )
    assert all((s["elite"] is not None) == (s["id"] in elites) for s in steps)


def test_stores_from_before_instructions_still_read_and_new_ones_keep_them(tmp_path):
    from qd.contract import Candidate
    from qd.store import Store

    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.add(
            [
                Candidate(
                    fitness=1.0,
                    descriptor=np.zeros(2),
                    valid=True,
                    kind="text",
                    text="x",
                    island=0,
                    instruction=7,
                )
            ]
        )
    with Store(path, readonly=True) as store:
        assert store.get([0])[0].instruction == 7
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE candidates DROP COLUMN instruction")
    db.commit()
    db.close()
    with Store(path, readonly=True) as store:  # an old store, opened read-only: the column reads as None
        assert store.get([0])[0].instruction is None
        assert list(store.columns(("id", "instruction"))) == [[(0, None)]]


def test_ancestors_walk_sparse_ids_and_stop_at_an_ancestor_the_store_lacks():
    """A device run's elites-only store keeps a few ids out of millions of evaluations: the
    first parents are two arrays over what is stored, never an array over every id."""
    parents = history.FirstParents(
        np.asarray([5, 2_000_000_000, 3_000_000_000], np.int64), np.asarray([-1, 7, 2_000_000_000], np.int64)
    )
    assert history.ancestors(parents, 3_000_000_000) == ([3_000_000_000, 2_000_000_000], 7)  # 7 was not kept
    assert history.ancestors(parents, 5) == ([5], -1)
    assert history.ancestors(parents, 6) == ([], -1)


def test_a_geometry_from_before_the_grouped_thresholds_loads_them_grouped(tmp_path):
    import json

    from qd import archive
    from qd.rundir import Geometry, layout

    old = {"kind": "grid", "islands": 1, "cells": 4, "dim": 1, "bins": [4], "lower": [0.0], "upper": [1.0]}
    old.update(axes=["d0"], learning_rate=0.5, threshold_min=-2.0)
    (tmp_path / layout.GEOMETRY).write_text(json.dumps(old))
    g = Geometry.load(tmp_path)
    assert g.thresholds == {"learning_rate": 0.5, "threshold_min": -2.0}
    spec = layout.spec_of(g, None)
    assert archive.thresholds(spec) == g.thresholds and spec.bins == (4,)


def test_a_setting_the_run_settles_at_its_start_is_what_its_resume_reads(tmp_path):
    """``runner.in_flight`` sized from a cluster is written into the saved config, so the
    resumed run replays with the number it ran with, not a new cluster's."""
    from omegaconf import OmegaConf

    from qd.plan import compose
    from qd.rundir import founding, layout

    p = plan(compose(["experiment=openevolve", "runner=ray"]))
    assert p.cfg.runner.in_flight is None
    founding.create(p, tmp_path)
    founding.settle(tmp_path, "runner.in_flight", 7)
    saved = OmegaConf.load(tmp_path / layout.CONFIG)
    assert (
        saved.runner.in_flight == 7 and saved.runner.name == "ray" and "runner.in_flight" in founding.SETTLED
    )


def test_a_pareto_geometry_and_checkpoint_read_back_as_its_spec_and_fronts(tmp_path):
    spec = archive.ParetoSpec(archive.GridSpec((3,), (0.0,), (1.0,)), front_size=2, num_objectives=2)
    objectives = (("error", "min"), ("size", "min"))
    Geometry.of_spec(spec, 2, "program", ("x",), objectives).save(tmp_path)
    g = Geometry.load(tmp_path)
    assert (g.kind, g.objectives, g.pareto["front_size"]) == ("grid", objectives, 2)
    assert spec_of(g, None) == spec
    state, _ = pareto.insert(spec, pareto.init(spec, 2), 1, [[0.5]], [[-1.0, -4.0]], [7])
    checkpoint.save(tmp_path / "checkpoints", state, jax.random.key(0), {"last_id": 7})
    loaded, _, counters = checkpoint.load(tmp_path / "checkpoints")
    assert type(loaded) is archive.ParetoState and counters["last_id"] == 7
    for got, want in zip(loaded, state):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
