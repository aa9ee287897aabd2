"""The device loop (qd.device): the fused step's results, the plan's choice, and durability by determinism."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import qd
from qd import archive, cli, compile_cache
from qd.contract import ConfigError
from qd.device import step
from qd.device.driver import NO_LIMIT
from qd.device.step import DeviceOperator, device_loop, select_uniform
from qd.plan import compose, plan
from qd.rundir import checkpoint
from qd.store import Store
from qd.task import load_task

ROOT = Path(__file__).resolve().parents[3]
SMALL = [
    "experiment=sphere",
    "experiment.params.dim=10",
    "archive.bins=[20,20]",
    "archive.lower=[-26,-26]",
    "archive.upper=[26,26]",
    "runner.batch_size=32",
    "runner.progress=false",
]


def small_loop(islands=1, keep_ops=None, initial=None, spec=None):
    from operators import make_numeric_operator

    task = load_task("sphere", {"dim": 10})
    spec = spec or archive.GridSpec((20, 20), (-26.0, -26.0), (26.0, 26.0))
    ops = keep_ops or [make_numeric_operator("gaussian", sigma=0.5)]
    loop = device_loop(
        spec,
        task.evaluate_jax,
        [DeviceOperator(o.draw, o.apply, o.num_parents, o.params, 1.0) for o in ops],
        islands,
        16,
        10,
        np.zeros((4, 10), np.float32) if initial is None else initial,
    )
    return spec, loop


def test_parents_come_uniformly_from_the_cells_each_island_has_filled():
    spec, loop = small_loop(islands=2)
    state, _, cands = loop.run(loop.init(1), 30, NO_LIMIT, 30, True)
    ids = np.asarray(state.archive.genome_id)
    for i in range(2):  # the list of filled cells is exactly the island's filled cells
        n = int(state.num_occupied[i])
        assert sorted(np.asarray(state.occupied[i, :n]).tolist()) == np.nonzero(ids[i] >= 0)[0].tolist()
    cells, has = select_uniform(jax.random.key(0), state, 40_000)
    assert np.all(np.asarray(has))
    for i in range(2):
        counts = np.bincount(np.asarray(cells[i]), minlength=ids.shape[1])
        filled = ids[i] >= 0
        assert np.all(counts[~filled] == 0)
        expected = 40_000 / filled.sum()
        assert np.all(np.abs(counts[filled] - expected) < 6 * np.sqrt(expected))


@pytest.mark.parametrize("predraw", [True, False], ids=["noise drawn per call", "noise drawn per generation"])
def test_the_archive_is_the_map_elites_archive_of_every_candidate(predraw, monkeypatch):
    """After K generations the fused archive equals one insert of every candidate the
    calls emitted (hard thresholds do not depend on batching), each cell's stored
    genome is the one evaluated under its id, and the budget is met exactly."""
    monkeypatch.setattr(step, "PREDRAW_FLOATS", step.PREDRAW_FLOATS if predraw else 0)
    spec, loop = small_loop(islands=2)
    state = loop.init(3)
    seen = []
    budget = 2 * 4 + 12 * 32 - 10  # founders, then 12 generations, the last 10 candidates short
    for count in (5, 5, 3):  # the last call masks 2 of its 5 generations
        state, counts, cands = loop.run(state, count, budget, 5, True)
        seen.append(jax.device_get(cands))
    flat = {
        k: np.concatenate([getattr(c, k).reshape(-1, *getattr(c, k).shape[2:]) for c in seen])
        for k in seen[0]._fields
    }
    real = flat["id"] >= 0
    assert int(state.evaluations) == real.sum() == budget
    assert np.array_equal(np.sort(flat["id"][real]), np.arange(real.sum()))
    rebuilt = archive.rebuild(
        spec,
        2,
        flat["island"][real],
        flat["descriptor"][real],
        flat["fitness"][real],
        flat["id"][real],
        flat["valid"][real],
    )
    np.testing.assert_array_equal(np.asarray(state.archive.genome_id), np.asarray(rebuilt.genome_id))
    np.testing.assert_array_equal(np.asarray(state.archive.fitness), np.asarray(rebuilt.fitness))
    ids = np.asarray(state.archive.genome_id)
    by_id = dict(zip(flat["id"][real].tolist(), flat["genome"][real]))
    for i, c in zip(*np.nonzero(ids >= 0)):
        np.testing.assert_array_equal(np.asarray(state.genomes)[i, c], by_id[int(ids[i, c])])


def _assert_same_archive(got: archive.ArchiveState, want: archive.ArchiveState) -> None:
    for field in archive.ArchiveState._fields:
        np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)))


def test_a_new_run_takes_its_empty_thresholds_from_the_spec():
    soft = archive.GridSpec((20, 20), (-26.0, -26.0), (26.0, 26.0), learning_rate=0.5, threshold_min=-3.0)
    _, loop = small_loop(islands=2, spec=soft)
    state = loop.init(0)
    np.testing.assert_array_equal(np.asarray(state.archive.threshold), -3.0)
    assert float(state.archive.threshold_min) == -3.0
    _assert_same_archive(state.archive, archive.init(soft, 2))


@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1])
def test_a_new_run_starts_from_the_key_of_its_seed_and_an_empty_archive(seed):
    spec, loop = small_loop(islands=2)
    state = loop.init(seed)
    assert np.array_equal(jax.random.key_data(state.key), jax.random.key_data(jax.random.key(seed)))
    _assert_same_archive(state.archive, archive.init(spec, 2))


def test_a_mix_of_operators_uses_each_by_weight_and_records_parents():
    from operators import make_numeric_operator

    ops = [
        make_numeric_operator("gaussian", sigma=0.5),
        make_numeric_operator("isoline", iso_sigma=0.01, line_sigma=0.2),
    ]
    _, loop = small_loop(keep_ops=ops)
    state, _, cands = loop.run(loop.init(0), 6, NO_LIMIT, 6, True)
    parents = np.asarray(cands.parents)
    assert parents.shape == (6, 16, 2)
    assert np.all(parents[0] == -1)  # founders have none
    assert np.all(parents[1:, :, 0] >= 0) and np.all(parents[1:] < np.asarray(cands.id)[1:, :, None])


def test_auto_picks_the_device_loop_only_where_every_setting_allows_it():
    assert plan(compose(SMALL)).loop == "device"
    assert plan(compose(SMALL)).store == "elites"
    assert plan(compose([*SMALL, "select=fitness"])).loop == "host"
    assert plan(compose(["experiment=function_fit"])).loop == "host"
    with pytest.raises(ConfigError, match=r"^select\.parents: the device loop picks parents uniformly"):
        plan(compose([*SMALL, "select=fitness", "runner.loop=device"]))
    with pytest.raises(ConfigError, match=r"^runner\.batch_size: must be a multiple of islands\.count=3"):
        plan(compose([*SMALL, "islands.count=3", "runner.loop=device"]))
    with pytest.raises(ConfigError, match=r"^runner\.store: an elites-only store needs the device loop"):
        plan(compose([*SMALL, "runner.loop=host", "runner.store=elites"]))
    with pytest.raises(ConfigError, match=r"^runner\.loop: experiment 'function_fit' has no JAX evaluation"):
        plan(compose(["experiment=function_fit", "runner.loop=device"]))


def run_small(run_dir, *overrides):
    engine = qd.build(compose([*SMALL, *overrides]), run_dir)
    try:
        return engine.run()
    finally:
        engine.close()


def test_the_elites_store_holds_every_elite_with_its_genome_and_parents(tmp_path):
    engine = qd.build(
        compose([*SMALL, "runner.max_evaluations=2000", "runner.generations_per_call=7"]), tmp_path
    )
    try:
        summary = engine.run()
        genomes = np.asarray(engine.state.genomes)  # the run's own, not read back from the store
    finally:
        engine.close()
    assert summary["loop"] == "device" and summary["evaluations"] == 2000
    state, _, counters = checkpoint.load(tmp_path / "checkpoints")
    assert "genomes" not in checkpoint.load_arrays(tmp_path / "checkpoints")  # the store holds them
    np.testing.assert_array_equal(_loaded_genomes(tmp_path), genomes)
    elites = qd.elites(tmp_path)
    assert len(elites) == int((np.asarray(state.genome_id) >= 0).sum()) == summary["global"]["num_elites"]
    for e in elites:
        assert e.candidate.id == int(state.genome_id[e.island, e.cell])
        np.testing.assert_array_equal(e.candidate.vector, genomes[e.island, e.cell])
        assert all(0 <= p < e.candidate.id for p in e.candidate.parent_ids)
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        assert store.meta.get("store") == "elites" and store.count() >= len(elites)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [7, 14, 21, 28, 35, 42, 49, 56, 63, 64]
    with pytest.raises(
        SystemExit, match=r"stores only its elites \(runner.store=elites\); judging samples every"
    ):
        cli.main(["judge", str(tmp_path)])


def test_store_all_keeps_every_candidate_of_a_device_run(tmp_path):
    summary = run_small(
        tmp_path, "runner.max_evaluations=500", "runner.store=all", "runner.generations_per_call=4"
    )
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        ids = [c.id for c in store.iter()]
    assert ids == list(range(summary["evaluations"]))


def test_islands_exchange_migrants_on_the_device(tmp_path):
    run_small(
        tmp_path,
        "islands=ring4",
        "islands.migrate_every=32",
        "runner.max_evaluations=1000",
        "runner.store=all",
    )
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        island_of = {c.id: c.island for c in store.iter()}
    state = checkpoint.load(tmp_path / "checkpoints")[0]
    ids = np.asarray(state.genome_id)
    moved = [(i, int(ids[i, c])) for i, c in zip(*np.nonzero(ids >= 0)) if island_of[int(ids[i, c])] != i]
    assert moved and all(island_of[g] == (i - 1) % 4 for i, g in moved)  # ring: from the previous island


@pytest.mark.slow
def test_kill9_at_a_random_point_then_resume_is_bit_identical(tmp_path):
    budget = 60_000
    args = [*SMALL, f"runner.max_evaluations={budget}", "runner.generations_per_call=10", "seed=5"]

    def qd_run(*extra):
        return [sys.executable, "-m", "qd.run", *args, *extra]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree's qd, installed or not
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(
        qd_run(f"hydra.run.dir={straight}"),
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )
    proc = subprocess.Popen(
        qd_run(f"hydra.run.dir={killed}"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    kill_after = (
        random.uniform(0.1, 0.6) * budget
    )  # a random point mid-run: in a call, a store write or a checkpoint
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        loaded = (killed / "checkpoints" / checkpoint.FILE).exists() and checkpoint.load(
            killed / "checkpoints"
        )
        if loaded and loaded[2]["evaluations"] >= kill_after:
            break
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.load(killed / "checkpoints")[2]["evaluations"] < budget
    subprocess.run(
        [sys.executable, "-m", "qd.run", f"resume={killed}"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )

    (a, key_a, ca), (b, key_b, cb) = (checkpoint.load(d / "checkpoints") for d in (straight, killed))
    for field in archive.ArchiveState._fields:
        np.testing.assert_array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field)))
    extra_a, extra_b = (checkpoint.load_arrays(d / "checkpoints") for d in (straight, killed))
    np.testing.assert_array_equal(extra_a["parents"], extra_b["parents"])
    np.testing.assert_array_equal(_loaded_genomes(straight), _loaded_genomes(killed))
    assert np.array_equal(jax.random.key_data(key_a), jax.random.key_data(key_b))
    assert (ca["evaluations"], ca["generations"]) == (cb["evaluations"], cb["generations"])
    with Store(killed / "store.sqlite", readonly=True) as store:
        stored = {c.id for c in store.iter()}
    assert set(np.asarray(b.genome_id)[np.asarray(b.genome_id) >= 0].tolist()) <= stored


def _loaded_genomes(run_dir):
    """The elites' genomes as a resume loads them (from the store, by the checkpoint's ids)."""
    from qd.device.record import DeviceRecord

    record = DeviceRecord(run_dir, "elites", None)
    try:
        return np.asarray(record.load()[0].genomes)
    finally:
        record.close()


def _on_host(state):
    return jax.device_get(state._replace(key=jax.random.key_data(state.key)))


@pytest.mark.parametrize("kept", ["elites", "all"])
def test_the_record_writes_each_row_once_and_loads_the_state_it_saved(tmp_path, kept):
    from qd.device.record import DeviceRecord, HostState

    _, loop = small_loop()
    state, _, candidates = loop.run(loop.init(3), 3, NO_LIMIT, 3, kept == "all")
    snap, candidates = HostState(_on_host(state), 12.5), jax.device_get(candidates)
    record = DeviceRecord(tmp_path, kept, "gaussian")
    assert record.load() is None  # a new run
    for _ in range(2):  # a call recomputed after a crash writes nothing twice
        record.add_rows(snap.state, candidates)
    record.save(snap)
    ids = [c.id for c in record.store.iter()]
    assert {c.operator for c in record.store.iter()} == {"gaussian"}
    record.close()
    genome_id = np.asarray(snap.state.archive.genome_id)
    want = range(int(snap.state.evaluations)) if kept == "all" else np.unique(genome_id[genome_id >= 0])
    assert ids == list(want)
    loaded, elapsed = DeviceRecord(tmp_path, kept, "gaussian").load()
    assert elapsed == 12.5 and int(loaded.evaluations) == int(snap.state.evaluations)
    _assert_same_archive(loaded.archive, snap.state.archive)
    np.testing.assert_array_equal(np.asarray(loaded.genomes), snap.state.genomes)
    assert np.array_equal(jax.random.key_data(loaded.key), snap.state.key)


def test_a_host_checkpoint_is_not_resumed_on_the_device(tmp_path):
    from qd.errors import CheckpointError

    run_small(tmp_path, "runner.loop=host", "runner.max_evaluations=64")
    with pytest.raises(CheckpointError, match="host-loop checkpoint; resume it with runner.loop=host"):
        qd.build(compose([*SMALL, "runner.max_evaluations=64"]), tmp_path)


GPU_SECTION = "## Device (GPU) run: bench/device.py --gpu"


def bench_device(*args: str) -> subprocess.CompletedProcess:
    """``bench/device.py`` with this tree's qd; its programs go to the suite's JAX compilation
    cache (every one, however quickly it compiled), so a rerun compiles nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cache = compile_cache.folder()
    if cache is not None:
        env |= {
            "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
    return subprocess.run(
        [sys.executable, "bench/device.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def table_rows(section: list[str]) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell, the header and the rule left out."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section if line[:2] == "| "]
    return {row[0]: row[1:] for row in rows[1:]}


@pytest.mark.slow
def test_bench_device_gpu_run_on_cpu_reports_and_records_its_section(tmp_path):
    """The GPU run's code at tiny sizes (``--gpu --allow-cpu --quick``): a line and a row per case,
    the issue's goals judged from the figures in ``--json``, and a rerun replaces its section in
    RESULTS.md, leaving the others as they were."""
    results, numbers = tmp_path / "RESULTS.md", tmp_path / "out.json"
    other = "# Benchmark results\n\n## Another benchmark\n\nits figures\n"
    results.write_text(other)
    for _ in range(2):
        proc = bench_device(
            "--gpu",
            "--allow-cpu",
            "--quick",
            "--repeats",
            "1",
            "--results",
            str(results),
            "--json",
            str(numbers),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0].startswith(f"backend={jax.default_backend()} devices=")
    assert "inserts/s" in proc.stdout and "evaluations/s" in proc.stdout
    assert re.fullmatch(r"elapsed \d+ s in all", out[-1])
    text = results.read_text()
    assert text.startswith(other + "\n" + GPU_SECTION + "\n") and text.count("\n## ") == 2
    section = text.split(GPU_SECTION + "\n\n", 1)[1].splitlines()
    assert section[0] == f"`{out[0]}`" and "backend=gpu" not in text  # the README's test keys on it
    assert "- Command: `PYTHONPATH=. python bench/device.py --gpu --allow-cpu --quick" in text
    rows, figures = table_rows(section), json.loads(numbers.read_text())
    cases = [*figures["insert"], *figures["loop"]]
    assert (
        list(rows)
        == [c["case"] for c in cases]
        == [
            "insert 10,000 cells, batch 256",
            "insert 40,000 cells, batch 512",
            "device loop sphere 10-D, batch 64",
        ]
    )
    small, large = figures["insert"]
    assert not small["goal"] and rows[small["case"]][3:] == ["none set", "", ""]
    rate = large["qd"]["inserts_per_s"]
    assert rows[large["case"]][:1] + rows[large["case"]][3:] == [
        f"{rate:.3g} inserts/s",
        ">= 1,000,000,000 inserts/s",
        f"{rate / 1e9:.3g}x",
        "met" if rate >= 1e9 else "missed",
    ]
    (loop,) = figures["loop"]
    goal = rows[loop["case"]][3:]
    if "QDax" in loop:
        ratio = loop["qd"]["evaluations_per_s"] / loop["QDax"]["evaluations_per_s"]
        assert goal == ["qd/QDax >= 10x", f"{ratio / 10:.3g}x", "met" if ratio >= 10 else "missed"]
    else:
        assert goal == ["qd/QDax >= 10x", "", "not measured (QDax not installed)"]


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="JAX sees a GPU: --gpu runs")
def test_bench_device_gpu_refuses_another_backend_with_a_one_line_error():
    proc = bench_device("--gpu", "--quick")
    assert proc.returncode == 1 and proc.stdout == ""
    error = proc.stderr.splitlines()[-1]  # any line before it is JAX's own
    assert error.startswith(
        f"bench/device.py --gpu: JAX's default backend is {jax.default_backend()}, not gpu;"
    )
    assert "--allow-cpu" in error and "jax[cuda12]" in error
