"""``archive=pareto`` through the host engine: function_fit's fronts of (held-out error, program
size) on the scripted server, and a run killed with ``kill -9`` and resumed that ends with the
fronts of the same run left alone.

The run left alone runs in this process (a run's result does not depend on the process it runs
in), while ``qd-run resume=`` continues the killed one: a real ``qd-run`` process killed with
SIGKILL mid-way."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from helpers import on_server, run_config, start_qd_run, varied_program
from scripted_llm import Rule

from qd.plan import compose
from qd.rundir import RunDir, checkpoint
from qd.rundir.layout import Geometry, spec_of
from qd.store import Store


def _args(base_url: str) -> list[str]:
    """A small function_fit run on fronts of three (the shape of the readers' ``pareto_run``: one
    compilation of its insert serves both): one proposal in flight and a checkpoint after every
    commit, so where it stands at a checkpoint is all a resume needs."""
    return [
        "experiment=function_fit",
        "archive=pareto",
        "archive.front_size=3",
        *on_server(base_url),
        "llm.timeout_s=60",  # a call or a run that times out under load would part the two runs' histories
        "sandbox.wall_s=60",
        "runner.in_flight=1",
        "runner.workers=1",
        "runner.checkpoint_every=1",
        "runner.initial_population=2",
        "runner.max_llm_calls=10",
        "islands.count=2",
        "islands.migrate_every=4",
        "operators.mix=[{name: rewrite}]",
        "seed=2",
    ]


def _fronts(run_dir) -> dict[str, np.ndarray]:
    state, _, counters = checkpoint.load(run_dir / "checkpoints")
    return {"last_id": counters["last_id"], **{k: np.asarray(v) for k, v in state._asdict().items()}}


@pytest.mark.slow
def test_a_pareto_run_killed_and_resumed_ends_with_the_fronts_of_one_left_alone(scripted_llm, tmp_path):
    server = scripted_llm([Rule("", varied_program)])
    alone, killed = tmp_path / "alone", tmp_path / "killed"
    proc = start_qd_run(*_args(server.base_url), f"hydra.run.dir={killed}", cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # past the 4 founders, mid-way through the model's children
        if _last_id(killed) >= 8:
            break
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = _last_id(killed)
    # The resume starts in its own process while the run left alone runs in this one.
    resume = start_qd_run(f"resume={killed}", cwd=tmp_path)
    end = run_config(compose(_args(server.base_url)), alone)
    fronts = _fronts(alone)
    g = Geometry.load(alone)
    assert g.kind == "grid" and g.objectives == (("error", "min"), ("size", "min"))
    assert spec_of(g, None).front_size == 3 and fronts["objectives"].shape == (2, 60, 3, 2)
    members = fronts["genome_id"] >= 0
    assert (members.sum(axis=2) >= 2).any()  # some cell keeps a trade-off of two programs
    with Store(alone / "store.sqlite", readonly=True) as store:
        metrics = {c.id: c.metrics for c in store.iter()}
    for gid, values in zip(fronts["genome_id"][members], fronts["objectives"][members]):
        want = np.float32([-metrics[gid]["error"], -metrics[gid]["size"]])  # maximised
        np.testing.assert_array_equal(values, want)
    filled = members.any(axis=2).sum()
    assert end["global"]["num_elites"] == filled  # coverage counts cells with a member
    with RunDir(alone) as run:  # a reader replays the same fronts and shows each cell's best
        snap = run.snapshot()
    np.testing.assert_array_equal(snap.fronts.genome_id, fronts["genome_id"])
    assert ((snap.genome_id >= 0) == members.any(axis=2)).all()

    _, stderr = resume.communicate(timeout=300)
    assert resume.returncode == 0, stderr[-3000:]
    resumed = _fronts(killed)
    assert killed_at < fronts["last_id"]
    for name, array in fronts.items():
        np.testing.assert_array_equal(resumed[name], array, err_msg=name)


def _last_id(run_dir) -> int:
    """The newest store row the checkpoint holds (written atomically: read whole or not at all)."""
    loaded = checkpoint.load(run_dir / "checkpoints")
    return -1 if loaded is None else loaded[2]["last_id"]
