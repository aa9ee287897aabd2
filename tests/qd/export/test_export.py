"""``qd export`` (qd.export): the elites, sft and trace kinds in every format, read back
against the store; byte-identical repeats; one-line errors; the run left untouched."""

import io
import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd import history
from qd.cli import main as qd
from qd.export import elites as elites_kind
from qd.export import export, sft, write
from qd.export import trace as trace_kind
from qd.export.rows import PerCell
from qd.rundir import RunDir

KINDS = {"elites": elites_kind, "sft": sft, "trace": trace_kind}
FORMATS = ("jsonl", "parquet", "hf")


def read(path, fmt):
    """The rows of an export, as plain dicts."""
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    import datasets

    return datasets.load_from_disk(str(path)).to_list()


def mtimes(run_dir):
    """Each file's mtime and size; not SQLite's shared-memory index, which every reader of a WAL store
    maps."""
    return {
        p: (p.stat().st_mtime_ns, p.stat().st_size)
        for p in run_dir.rglob("*")
        if p.is_file() and not p.name.endswith("-shm")
    }


@pytest.fixture(scope="module")
def exported(text_run, tmp_path_factory):
    """Every kind x format exported twice (for determinism), and the run's files before."""
    before = mtimes(text_run)
    out = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        paths = {
            (kind, fmt, n): export(text_run, kind, fmt, out / str(n) / f"{kind}.{fmt}")
            for kind in KINDS
            for fmt in FORMATS
            for n in (1, 2)
        }
    return paths, before


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_format_holds_the_same_rows_with_the_documented_columns(exported, kind, fmt):
    paths, _ = exported
    rows = read(paths[kind, fmt, 1], fmt)
    assert rows, kind
    assert all(list(r) == list(KINDS[kind].COLUMNS) for r in rows)
    assert rows == read(paths[kind, "jsonl", 1], "jsonl")
    card = (
        paths[kind, fmt, 1] / "README.md"
        if fmt == "hf"
        else paths[kind, fmt, 1].with_name(paths[kind, fmt, 1].name + ".card.md")
    ).read_text()
    assert f"| kind | {kind} |" in card and f"| rows | {len(rows)} |" in card and "function_fit" in card


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_exports_are_byte_identical(exported, fmt):
    paths, _ = exported
    for kind in KINDS:
        a, b = paths[kind, fmt, 1], paths[kind, fmt, 2]
        if fmt == "hf":
            files = sorted(p.name for p in a.iterdir() if p.suffix == ".arrow")
            assert files and files == sorted(p.name for p in b.iterdir() if p.suffix == ".arrow")
            assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
            assert (a / "README.md").read_text() == (b / "README.md").read_text()
        else:
            assert a.read_bytes() == b.read_bytes(), kind


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_with_no_rows_reads_back_empty(text_run, tmp_path, fmt):
    assert read(export(text_run, "elites", fmt, tmp_path / f"none.{fmt}", min_fitness=1e9), fmt) == []


def test_elites_are_the_archive_best_first_as_stored(exported, text_run):
    rows = read(exported[0]["elites", "jsonl", 1], "jsonl")
    with RunDir(text_run) as run:
        snap = run.snapshot()
        assert sorted(r["id"] for r in rows) == sorted(snap.genome_id[snap.genome_id >= 0].tolist())
        assert [r["fitness"] for r in rows] == sorted((r["fitness"] for r in rows), reverse=True)
        for r, c in zip(rows, run.store.get(r["id"] for r in rows)):
            assert (r["text"], r["vector"], r["fitness"], r["operator"], r["model"]) == (
                c.text,
                None,
                c.fitness,
                c.operator,
                c.model,
            )
            assert json.loads(r["metrics"]) == c.metrics and r["descriptor"] == c.descriptor.tolist()
            assert snap.genome_id[r["island"], r["cell"]] == c.id and r["genome"] == "program"
            assert r["lineage"] == [step["id"] for step in history.lineage(run, c.id)][:-1]


def test_sft_task_pairs_the_description_with_the_best_program_of_each_cell(exported, text_run):
    rows = read(exported[0]["sft", "jsonl", 1], "jsonl")
    description = sft.task_of(RunDir(text_run)).description
    with RunDir(text_run) as run:
        f = history.fates(run)
        for r, c in zip(rows, run.store.get(r["id"] for r in rows)):
            assert r["prompt"] == [{"role": "user", "content": description}]
            assert r["completion"] == [{"role": "assistant", "content": c.text}] and c.valid
            same = (f["island"] == r["island"]) & (f["cell"] == r["cell"]) & f["valid"]
            assert r["fitness"] == c.fitness == np.nanmax(f["fitness"][same])
    assert len({(r["island"], r["cell"]) for r in rows}) == len(rows)
    assert [r["fitness"] for r in rows] == sorted((r["fitness"] for r in rows), reverse=True)


def test_sft_operator_rows_are_the_children_that_entered_the_archive(text_run, tmp_path):
    path = export(text_run, "sft", out=tmp_path / "op.jsonl", variant="operator")
    rows = read(path, "jsonl")
    with RunDir(text_run) as run:
        f = history.fates(run)
        assert [r["id"] for r in rows] == f["id"][f["entered"] & (f["parent"] >= 0)].tolist()
        for r, c in zip(rows, run.store.get(r["id"] for r in rows)):
            assert r["prompt"] == json.loads(c.prompt) and r["completion"][0]["content"] == c.response
    capped = read(
        export(
            text_run,
            "sft",
            out=tmp_path / "cap.jsonl",
            variant="operator",
            min_fitness=rows[0]["fitness"],
            per_cell=1,
        ),
        "jsonl",
    )
    assert all(r["fitness"] >= rows[0]["fitness"] for r in capped)
    assert len({(r["island"], r["cell"]) for r in capped}) == len(capped)


def test_sft_never_exports_a_held_out_item(text_run, tmp_path, monkeypatch):
    from qd.task import load_task

    agents = load_task("agent_design", {})  # a task with held-out problems: its prompt must not hold one
    assert agents.held_out() and not any(h in agents.description for h in sft.held_out_strings(agents))
    rows = read(export(text_run, "sft", out=tmp_path / "all.jsonl", per_cell=100), "jsonl")
    leaked = (
        rows[0]["completion"][0]["content"].strip().splitlines()[-1]
    )  # pretend a program line is held out
    real = sft.task_of

    class Holding:
        def __init__(self, task):
            self.description = task.description

        def held_out(self):
            return [leaked]

    monkeypatch.setattr(sft, "task_of", lambda run: Holding(real(run)))
    kept = read(export(text_run, "sft", out=tmp_path / "kept.jsonl", per_cell=100), "jsonl")
    assert kept and len(kept) < len(rows)
    assert not any(leaked in m["content"] for r in kept for m in r["prompt"] + r["completion"])


def test_trace_has_a_record_per_child_with_its_parent_and_diff(exported, text_run):
    rows = read(exported[0]["trace", "jsonl", 1], "jsonl")
    with RunDir(text_run) as run:
        children = [c for c in run.store.iter() if c.parent_ids]
        assert [r["child_id"] for r in rows] == [c.id for c in children]
        entered = dict(zip(*(history.fates(run)[k].tolist() for k in ("id", "entered"))))
        for r, c in zip(rows, children):
            (p,) = run.store.get([c.parent_ids[0]])
            assert (r["parent_id"], r["valid"], r["error"], r["response"], r["entered"]) == (
                p.id,
                c.valid,
                c.error,
                c.response,
                entered[c.id],
            )
            assert r["prompt"] == json.loads(c.prompt) and r["diff"] == history.parent_diff(run, c)
            assert (r["diff"] is None) == (c.text is None)  # an answer with no program is not a deletion
            assert r["child_fitness"] == (c.fitness if c.valid else None)
            if r["improvement"] is not None:
                assert r["improvement"] == pytest.approx(c.fitness - p.fitness)
    assert any(not r["valid"] for r in rows) and any(r["improvement"] is not None for r in rows)
    assert any(c.text is None for c in children) and any(r["diff"] for r in rows)


def test_a_vector_run_exports_its_elites_and_refuses_sft(cvt_run, tmp_path, capsys):
    rows = read(export(cvt_run, "elites", out=tmp_path / "e.jsonl"), "jsonl")
    with RunDir(cvt_run) as run:
        (c,) = run.store.get([rows[0]["id"]])
        assert rows[0]["vector"] == c.vector.tolist() and rows[0]["text"] is None
        assert len(rows) == int((run.snapshot().genome_id >= 0).sum())
    with pytest.raises(SystemExit) as e:
        qd(["export", str(cvt_run), "--kind", "sft", "--out", str(tmp_path / "s.jsonl")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "vectors" in err
    assert sorted(tmp_path.iterdir()) == [
        tmp_path / "e.jsonl",
        tmp_path / "e.jsonl.card.md",
    ]  # no half-written file


@pytest.mark.parametrize(
    "args, says",
    [
        (["--kind", "nope"], "unknown; use one of elites"),
        (["--kind", "elites", "--format", "csv"], "format 'csv'"),
        (["--kind", "elites", "--option", "per_cel=2"], "unknown option 'per_cel'"),
        (["--kind", "sft", "--option", "variant=chat"], "variant 'chat'"),
        (["--kind", "elites", "--option", "oops"], "KEY=VALUE"),
        (["--kind", "elites", "--out", "{run}/x.jsonl"], "inside the run directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(text_run, args, says, capsys):
    with pytest.raises(SystemExit) as e:
        qd(["export", str(text_run), *[a.format(run=text_run) for a in args]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_the_command_prints_the_path_and_the_rows(text_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    qd(["export", str(text_run), "--kind", "elites", "--option", "min_fitness=-1e9"])
    path, count = capsys.readouterr().out.split()[:2]
    assert path == f"qd-export/{text_run.name}.elites.jsonl"
    assert int(count) == len(read(tmp_path / path, "jsonl")) > 0


def test_exports_leave_the_run_untouched(exported, text_run):
    assert mtimes(text_run) == exported[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=40), st.integers(1, 3))
def test_per_cell_keeps_the_k_best_of_each_cell_as_a_full_sort_would(offers, k):
    """What sft and dpo keep while the store streams by equals sorting everything at the end."""
    kept = PerCell(5, k)
    for i, (cell, score) in enumerate(offers):
        kept.offer(cell, float(score), i)
    everything = sorted(((-score, i, cell) for i, (cell, score) in enumerate(offers)))
    taken: dict[int, int] = {}
    want = []
    for neg, i, cell in everything:
        if taken.get(cell, 0) < k:
            taken[cell] = taken.get(cell, 0) + 1
            want.append((cell, -neg, i))
    cell, score, ids = kept.kept()
    assert list(zip(cell.tolist(), score.tolist(), ids.tolist())) == [(c, float(s), i) for c, s, i in want]


def test_the_progress_bar_follows_the_scan_and_the_rows(text_run, tmp_path):
    from qd.export.command import Bar

    stream = io.StringIO()
    ticks = itertools.count()  # each clock read a second later: every update is drawn
    bar = Bar(stream, clock=lambda: float(next(ticks)))
    _, count = write(text_run, "trace", "jsonl", tmp_path / "t.jsonl", progress=bar)
    bar.done()
    with RunDir(text_run) as run:
        stored = run.store.last_id() + 1
    lines = [line.removesuffix("\x1b[K") for line in stream.getvalue().strip().split("\r") if line]
    assert f"of {stored:,} candidates read" in lines[0]  # the scan is under way before the first row
    assert lines[-1].startswith(
        f"qd export: [{'#' * Bar.WIDTH}] 100% of {stored:,} candidates read, {count:,} rows"
    )
    written = [int(line.split(" rows")[0].rsplit(" ", 1)[1].replace(",", "")) for line in lines]
    assert written == sorted(written) and written[-1] == count > 0


def test_a_kind_that_does_not_scan_the_store_shows_rows_only(text_run, tmp_path):
    from qd.export.command import Bar

    stream = io.StringIO()
    bar = Bar(stream, clock=itertools.count().__next__)
    _, count = write(text_run, "diverse", "jsonl", tmp_path / "d.jsonl", {"k": 3}, progress=bar)
    bar.done()
    assert stream.getvalue().split("\r")[-1].startswith(f"qd export: {count} rows")
