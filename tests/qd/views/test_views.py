"""``qd show``, ``qd lineage``, ``qd stats``, ``qd compare``: the values they print are the
run's (recomputed here from the store and the events), bad input is one line with exit
code 2, and they read a run in progress without touching it."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from qd import cli
from qd.rundir import RunDir, setting
from qd.store import Store
from qd.views.summary import wall_time

ROOT = Path(__file__).resolve().parents[3]


def run_cli(capsys, *argv) -> str:
    cli.main([str(a) for a in argv])
    return capsys.readouterr().out


def as_json(capsys, *argv) -> dict:
    return json.loads(run_cli(capsys, *argv, "--json"))


def fails(capsys, *argv) -> str:
    """The one-line error of a command that must reject its input with exit code 2."""
    with pytest.raises(SystemExit) as e:
        cli.main([str(a) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def stored(path: Path) -> list:
    with Store(path / "store.sqlite", readonly=True) as s:
        return list(s.iter())


def last_commit(path: Path) -> dict:
    lines = [json.loads(x) for x in (path / "events.jsonl").read_text().splitlines()]
    return [e for e in lines if e.get("event") == "commit"][-1]


# ----- qd show ----------------------------------------------------------------------


def test_show_top_row_is_the_best_elite(text_run, capsys):
    best = max((c for c in stored(text_run) if c.valid), key=lambda c: c.fitness)  # no resets: it stays
    out = as_json(capsys, "show", text_run, "--top", 3)
    top = out["elites"][0]
    assert top["fitness"] == pytest.approx(best.fitness) and top["rank"] == 1
    assert [r["fitness"] for r in out["elites"]] == sorted(
        (r["fitness"] for r in out["elites"]), reverse=True
    )
    (c,) = [c for c in stored(text_run) if c.id == top["id"]]
    assert top["text"] == c.text and top["operator"] == c.operator and len(out["elites"]) == 3
    assert out["run"]["evaluations"] == len(stored(text_run)) and out["run"]["best_id"] == top["id"]
    # the plain listing: its first row is that elite, with its values
    lines = run_cli(capsys, "show", text_run).splitlines()
    assert lines[0].startswith(f"{text_run}: function_fit, grid archive 2 x ")
    first = lines[3].split()
    assert first[:4] == ["1", str(top["id"]), str(top["island"]), str(top["cell"])]
    assert float(first[4]) == pytest.approx(top["fitness"], abs=1e-4)


def test_show_island_cell_and_full(text_run, capsys):
    one = as_json(capsys, "show", text_run, "--island", 1, "--top", 100)["elites"]
    snap = RunDir(text_run).snapshot()
    assert sorted(r["id"] for r in one) == sorted(snap.genome_id[1][snap.genome_id[1] >= 0].tolist())
    cell = one[0]["cell"]
    at = as_json(capsys, "show", text_run, "--cell", cell)["elites"]
    assert {(r["island"], r["id"]) for r in at} == {
        (i, int(snap.genome_id[i, cell])) for i in range(2) if snap.genome_id[i, cell] >= 0
    }
    body = one[0]["text"].splitlines()[1]  # a program's second line: only --full prints it
    assert body not in run_cli(capsys, "show", text_run, "--island", 1)
    assert one[0]["text"].strip() in run_cli(capsys, "show", text_run, "--island", 1, "--full")


def test_show_id_prints_the_candidate_its_diff_and_answer(text_run, capsys):
    from qd.history import diff

    by_id = {c.id: c for c in stored(text_run)}
    c = next(
        c
        for c in by_id.values()
        if c.parent_ids and c.text and c.text != by_id[c.parent_ids[0]].text and c.response
    )
    expected = diff(by_id[c.parent_ids[0]].text, c.text, f"#{c.parent_ids[0]}", f"#{c.id}")
    out = run_cli(capsys, "show", text_run, "--id", c.id)
    assert c.text in out and expected in out and c.response in out
    got = as_json(capsys, "show", text_run, "--id", c.id)["candidate"]
    snap = RunDir(text_run).snapshot()
    assert got["text"] == c.text and got["diff"] == expected and got["fitness"] == c.fitness
    assert got["elite"] == [[int(i), int(k)] for i, k in np.argwhere(snap.genome_id == c.id)]
    invalid = next(c for c in by_id.values() if not c.valid)  # any stored candidate, elite or not
    got = as_json(capsys, "show", text_run, "--id", invalid.id)["candidate"]
    assert got["valid"] is False and got["error"] == invalid.error and got["elite"] == []


# ----- qd lineage ------------------------------------------------------------------


def test_lineage_follows_the_stores_parent_chain(text_run, capsys):
    by_id = {c.id: c for c in stored(text_run)}

    def chain(i):
        return (chain(by_id[i].parent_ids[0]) if by_id[i].parent_ids else []) + [i]

    deepest = max(by_id, key=lambda i: len(chain(i)))
    steps = as_json(capsys, "lineage", text_run, deepest)["steps"]
    assert [s["id"] for s in steps] == chain(deepest) and len(steps) > 1
    assert [s["operator"] for s in steps] == [by_id[i].operator for i in chain(deepest)]
    out = run_cli(capsys, "lineage", text_run, deepest)
    for before, after in zip(steps, steps[1:]):
        assert f"--- #{before['id']}\n+++ #{after['id']}" in out


def test_lineage_shows_an_evicted_ancestor(cvt_run, capsys):
    run = RunDir(cvt_run)
    elites = set(run.snapshot().genome_id[run.snapshot().genome_id >= 0].tolist())
    by_id = {c.id: c for c in stored(cvt_run)}
    child = next(c.id for c in by_id.values() if c.parent_ids and c.parent_ids[0] not in elites)
    evicted = by_id[child].parent_ids[0]
    steps = as_json(capsys, "lineage", cvt_run, child)["steps"]
    assert steps[-2]["id"] == evicted and steps[-2]["elite"] is None
    row = next(x for x in run_cli(capsys, "lineage", cvt_run, child).splitlines() if f" {evicted} " in x)
    assert "not an elite now" in row


# ----- qd stats --------------------------------------------------------------------


def test_stats_equal_the_store(text_run, capsys):
    groups = defaultdict(lambda: [0, 0, 0, 0.0])
    for c in stored(text_run):
        g = groups[(c.operator or "-", c.model or "-")]
        g[0], g[1], g[2], g[3] = g[0] + 1, g[1] + c.valid, g[2] + c.tokens_in + c.tokens_out, g[3] + c.cost
    out = as_json(capsys, "stats", text_run)
    got = {
        (r["operator"], r["model"]): [r["candidates"], r["valid"], r["tokens"], r["cost"]]
        for r in out["groups"]["operator,model"]
    }
    assert got.keys() == groups.keys()
    for key, (n, valid, tokens, cost) in groups.items():
        assert got[key][:3] == [n, valid, tokens] and got[key][3] == pytest.approx(cost)
    assert out["totals"]["candidates"] == sum(g[0] for g in groups.values())
    db = sqlite3.connect(f"file:{text_run / 'store.sqlite'}?mode=ro", uri=True)
    calls, failed, cost = db.execute("SELECT SUM(calls), SUM(failed), SUM(cost) FROM llm_calls").fetchone()
    db.close()
    assert calls == 24 and out["llm_totals"]["calls"] == calls and out["llm_totals"]["failed"] == failed
    assert out["llm_totals"]["cost"] == pytest.approx(cost)
    text = run_cli(capsys, "stats", text_run, "--by", "model")
    total = next(x for x in text.splitlines() if x.startswith("total") and "%" in x).split()
    assert total[1] == str(sum(g[0] for g in groups.values()))


# ----- qd compare ------------------------------------------------------------------


def test_compare_a_multirun_by_setting(cvt_run, text_run, tmp_path, capsys):
    members = [(cvt_run, "seed=0"), (cvt_run, "seed=1"), (text_run, "seed=2"), (text_run, "seed=0")]
    multi = tmp_path / "multi"
    for k, (source, seed) in enumerate(members):
        shutil.copytree(source, multi / str(k))
        (multi / str(k) / ".hydra").mkdir()
        extra = "- islands.count=2\n" if k == 3 else ""
        (multi / str(k) / ".hydra" / "overrides.yaml").write_text(
            f"- runner.batch_size=32\n- {seed}\n{extra}"
        )
    (multi / "multirun.yaml").write_text("hydra: {}\n")
    out = as_json(capsys, "compare", multi)
    assert [r["name"] for r in out["runs"]] == [f"multi/{k}" for k in range(4)]
    for r, (source, _) in zip(out["runs"], members):
        final = last_commit(source)["global"]
        assert r["qd_score"] == pytest.approx(final["qd_score"], rel=1e-5)
        assert r["coverage"] == pytest.approx(final["coverage"])
        assert r["evaluations"] == len(stored(source))
    (three, one) = out["settings"]
    assert three["setting"] == "runner.batch_size=32" and three["runs"] == 3
    assert one["setting"] == "runner.batch_size=32 islands.count=2" and one["runs"] == 1
    for key in ("best", "qd_score", "coverage"):
        values = [r[key] for r in out["runs"][:3]]
        assert three[key] == pytest.approx(
            {"median": np.median(values), "min": min(values), "max": max(values)}
        )
    text = run_cli(capsys, "compare", multi, text_run)
    assert "per setting" in text and f"\n{text_run.name} " in text


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["seed=3", "archive=cvt"], ["archive=cvt"]),
        (["+seed=3"], []),
        (
            ["archive=grid", "++seed=1", "hydra.job.num=2", "runner.seed_x=2"],
            ["archive=grid", "runner.seed_x=2"],
        ),
    ],
)
def test_setting_drops_only_the_seed(tmp_path, overrides, expected):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    assert setting(tmp_path) == expected


@given(st.lists(st.lists(st.floats(0.01, 100), min_size=1, max_size=5), min_size=1, max_size=4))
def test_wall_time_adds_up_the_sessions(sessions):
    """A resumed session's clock restarts (its first reading is below the last one's
    end); the wall time is the sum of the sessions' lengths, not the last reading."""
    clocks = [np.cumsum(steps) for steps in sessions]
    assume(all(b[0] < a[-1] for a, b in zip(clocks, clocks[1:])))
    events = [{"event": "meta"}]  # events without a clock are skipped
    for clock in clocks:
        events += [{"event": "commit", "elapsed_s": float(e)} for e in clock]
    assert wall_time(events) == pytest.approx(sum(float(c[-1]) for c in clocks))
    assert wall_time(events[:1]) is None


# ----- errors, the entry point, a live run ------------------------------------------


def test_bad_input_is_one_line_and_exit_code_2(text_run, tmp_path, capsys):
    for command in (["show"], ["lineage"], ["stats"]):
        err = fails(capsys, *command, tmp_path, *(["1"] if command == ["lineage"] else []))
        assert "RUN_DIR" in err and "no config.yaml" in err
    assert "--id 99999" in fails(capsys, "show", text_run, "--id", 99999)
    assert "ID 99999" in fails(capsys, "lineage", text_run, 99999)
    assert "--island 5" in fails(capsys, "show", text_run, "--island", 5)
    assert "--by 'colour'" in fails(capsys, "stats", text_run, "--by", "operator,colour")
    assert "neither a run directory" in fails(capsys, "compare", text_run, tmp_path)
    assert "--top" in fails(capsys, "show", text_run, "--top", "zero")


def test_the_qd_entry_point(cvt_run):
    out = subprocess.run(
        [sys.executable, "-m", "qd.cli", "show", str(cvt_run), "--top", "1", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    best = max((c for c in stored(cvt_run) if c.valid), key=lambda c: c.fitness)
    assert json.loads(out)["elites"][0]["id"] == best.id


def test_the_views_read_a_run_in_progress_without_touching_it(tmp_path, capsys):
    from helpers import run_engine, small_config

    from qd.run import build_engine

    path, seen, commits = tmp_path / "live", {}, []

    def look(event):
        commits.append(event)
        if len(commits) != 3:
            return
        files = [p for p in path.rglob("*") if p.is_file()]
        seen["checked"] = {p.relative_to(path).as_posix() for p in files}
        before = {p: p.stat().st_mtime_ns for p in files}
        with Store(path / "store.sqlite", readonly=True) as store:
            now = list(store.iter())
        seen["show"] = as_json(capsys, "show", path, "--top", 10_000)
        seen["stored"] = now
        for argv in (["lineage", path, now[-1].id], ["stats", path], ["compare", path]):
            as_json(capsys, *argv)
        seen["untouched"] = {p: p.stat().st_mtime_ns for p in files} == before
        seen["same files"] = sorted(p for p in path.rglob("*") if p.is_file()) == sorted(files)

    run_engine(build_engine(small_config("runner.max_evaluations=160"), path, on_commit=look))
    now, shown = seen["stored"], seen["show"]
    assert len(commits) > 3 and len(now) < len(stored(path))  # it looked mid-run
    assert shown["run"]["evaluations"] == len(now) == commits[2]["evaluations"]
    assert shown["run"]["elites"] == len(shown["elites"]) == commits[2]["global"]["num_elites"]
    assert {r["id"] for r in shown["elites"]} <= {c.id for c in now}
    assert shown["elites"][0]["fitness"] == pytest.approx(max(c.fitness for c in now if c.valid))
    assert {"config.yaml", "checkpoints/checkpoint.npz", "store.sqlite", "events.jsonl"} <= seen["checked"]
    assert seen["untouched"] and seen["same files"]


def test_a_reader_that_stops_reading_ends_the_command_quietly(text_run, monkeypatch, capsys):
    """``qd show RUN | head -1``: a closed pipe ends the command with no traceback."""
    read, write = os.pipe()
    os.close(read)
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w", buffering=1))
    with pytest.raises(SystemExit) as e:
        cli.main(["show", str(text_run), "--full"])
    assert e.value.code == 141
    assert "Traceback" not in capsys.readouterr().err
