"""qd-run end to end, as a user calls it: subprocesses, exit codes, one-line errors."""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import qd_run, run_python
from omegaconf import OmegaConf

from qd import archive
from qd.rundir import checkpoint
from qd.store import Store

EXPERIMENT_CONFIGS = Path(__file__).parents[2] / "conf" / "experiment"

SMALL = [
    "experiment=sphere",
    "experiment.params.dim=10",
    "archive.bins=[20,20]",
    "archive.lower=[-26,-26]",
    "archive.upper=[26,26]",
    "runner.batch_size=32",
    "runner.progress=false",
    "runner.checkpoint_every=2",
    "runner.loop=host",
]


@pytest.mark.parametrize(
    "override, message",
    [
        ("llm.provider=nope", "llm.provider: unknown provider 'nope'"),
        (
            "runner.evaluator=inprocess",
            "runner.evaluator: 'inprocess' would run LLM-written code outside the sandbox",
        ),
        ("llm=openai", "llm.api_key_env: environment variable QD_TEST_UNSET_KEY is not set"),
        ("operators.mix.0.name=mutate", "operators.mix[0].name: unknown operator 'mutate'"),
        ("llm.models=[]", "llm.models: is empty"),
    ],
)
def test_bad_llm_config_fails_before_any_server_starts(tmp_path, override, message):
    extra = ["llm.api_key_env=QD_TEST_UNSET_KEY"] if override == "llm=openai" else []
    proc = qd_run("experiment=function_fit", override, *extra, cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("qd-run: error: " + message), lines[0]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("runner.batch_sise=3", "runner.batch_sise: unknown config key (did you mean runner.batch_size?"),
        (
            "runner.batch_size=abc",
            "runner.batch_size: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (
            "experiment=nope",
            "experiment: no config 'nope' (available: "
            + ", ".join(sorted(p.stem for p in EXPERIMENT_CONFIGS.glob("*.yaml")))
            + ")",
        ),
        ("archive.bins=[10]", "archive.bins: has 1 entries but the task has 2 descriptors"),
        ("islands.topology=star", "islands.topology: unknown topology 'star'"),
        ("experiment.params.function=cube", "experiment.params.function: unknown function 'cube'"),
        ("operators.mix.0.name=cauchy", "operators.mix[0].name: unknown operator 'cauchy'"),
        ("runner.batch_size=0", "runner.batch_size: must be >= 1"),
    ],
)
def test_bad_config_fails_at_start_with_one_line(tmp_path, override, message):
    experiment = [] if override.startswith("experiment=") else ["experiment=sphere"]
    proc = qd_run(*experiment, override, cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("qd-run: error: " + message), lines[0]
    assert not (tmp_path / "outputs").exists()


def test_multirun_sweeps_seeds(tmp_path):
    proc = qd_run(
        "-m", "experiment=sphere", "seed=0,1", "runner.max_evaluations=64", "--json", *SMALL, cwd=tmp_path
    )
    runs = sorted((tmp_path / "outputs" / "sphere" / "multirun").glob("*/[0-9]*"))
    assert [r.name for r in runs] == ["0", "1"]
    for r in runs:
        assert (r / "config.yaml").exists() and (r / "store.sqlite").exists()
        assert (r / "events.jsonl").read_text().strip()
    ends = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [Path(e["run_dir"]) for e in ends] == runs and all("global" in e for e in ends)


def test_arm_experiment_runs_on_the_device_loop(tmp_path):
    proc = qd_run(
        "--json", "experiment=arm", "runner.max_evaluations=512", "runner.progress=false", cwd=tmp_path
    )
    end = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (end["loop"], end["store"]) == ("device", "elites")
    summary = end["global"]
    assert summary["num_elites"] > 20 and summary["max_fitness"] <= 0


@pytest.mark.slow
def test_kill9_then_resume_counts_every_candidate_once(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "qd.run",
        "runner.max_evaluations=20000",
        f"hydra.run.dir={run_dir}",
        *SMALL,
    ]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store_path = run_dir / "store.sqlite"
    target = random.randint(1_000, 15_000)  # a random point mid-run: after this many evaluations
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until it is evaluating, past the target
        if store_path.exists() and (run_dir / "checkpoints").exists():
            with Store(store_path, readonly=True) as store:
                if store.count() >= target:
                    break
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Store(store_path, readonly=True) as store:
        before = store.count()
    assert 0 < before < 20000

    qd_run(f"resume={run_dir}", cwd=tmp_path)

    with Store(store_path, readonly=True) as store:
        ids = [c.id for c in store.iter()]
        offers = store.placements()
    assert ids == list(range(20000))  # every candidate exactly once, none lost
    state, _, counters = checkpoint.load(run_dir / "checkpoints")
    assert counters["last_id"] == 19999
    spec = archive.GridSpec((20, 20), (-26, -26), (26, 26))
    rebuilt = archive.rebuild(
        spec, 1, offers["island"], offers["descriptor"], offers["fitness"], offers["id"], offers["valid"]
    )
    for field in ("fitness", "genome_id", "descriptor", "threshold"):
        np.testing.assert_array_equal(np.asarray(getattr(state, field)), np.asarray(getattr(rebuilt, field)))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["evaluations"] == 20000


def test_resume_of_a_missing_run_is_a_one_line_error(tmp_path):
    proc = qd_run(f"resume={tmp_path / 'nothing'}", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"qd-run: error: resume: {tmp_path / 'nothing'} has no config.yaml "
        "(pass a run directory made by qd-run)"
    ]


COUNT_COMPOSITIONS = """
import atexit, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl

composed = []
load = ConfigLoaderImpl.load_configuration
ConfigLoaderImpl.load_configuration = lambda self, *a, **k: composed.append(1) or load(self, *a, **k)
atexit.register(lambda: print("compositions", len(composed)))
from qd.run import main

main(sys.argv[1:])
"""


@pytest.mark.slow
def test_a_single_run_composes_its_config_once_and_keeps_hydras_files(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_python(
        "-c",
        COUNT_COMPOSITIONS,
        *SMALL,
        "runner.max_evaluations=64",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.stdout.strip().splitlines()[-1] == "compositions 1"
    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert saved.runner.max_evaluations == 64 and saved.experiment.name == "sphere"
    assert "runner.max_evaluations=64" in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    hydra = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra
    assert (hydra.job.name, hydra.mode, hydra.runtime.output_dir) == ("run", "RUN", str(run_dir))
    assert (run_dir / "run.log").exists() and (run_dir / "store.sqlite").exists()


class _Exited(Exception):
    """``os._exit`` stood in by the tests of ``cli``: it would end pytest's own process."""


def _cli_exit(monkeypatch, run_main) -> tuple[int | None, list[str]]:
    import atexit
    import os

    import qd.run

    events: list[str] = []
    monkeypatch.setattr(qd.run, "main", run_main)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: events.append("atexit"))

    def exit_now(code):
        events.append(f"exit {code}")
        raise _Exited

    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(_Exited):
        qd.run.cli()
    return events


def test_cli_runs_the_exit_handlers_then_ends_with_mains_code(monkeypatch, capsys):
    def fails_with_2():
        print('{"evaluations": 1}')
        raise SystemExit(2)

    assert _cli_exit(monkeypatch, fails_with_2) == ["atexit", "exit 2"]
    assert capsys.readouterr().out == '{"evaluations": 1}\n'  # flushed before the exit
    assert _cli_exit(monkeypatch, lambda: None) == ["atexit", "exit 0"]


def test_cli_exits_the_ordinary_way_while_a_thread_of_the_program_runs(monkeypatch):
    import threading

    import qd.run

    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    monkeypatch.setattr(qd.run, "main", lambda: None)
    try:
        with pytest.raises(SystemExit) as e:
            qd.run.cli()  # an ordinary exit waits for the thread; os._exit would cut it off
        assert e.value.code == 0
    finally:
        release.set()
        worker.join()
