"""``resume=RUN_DIR`` appended to the command that started a run resumes it; a budget may be
given anew, any other setting that differs from the run's is a one-line error naming it."""

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers import HYDRA_IN_PROCESS, SPHERE_RUN, qd_run
from omegaconf import OmegaConf

import qd.run
from qd.plan import compose, plan

OPENEVOLVE = Path(__file__).resolve().parents[2] / "experiments" / "openevolve" / "example"
START = [*SPHERE_RUN, "seed=3"]  # 32 evaluations, batches of 16


def evaluations(run_dir: Path) -> int:
    return json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["evaluations"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A run directory as far as a resume's check reads it: the config ``START`` saves."""
    run_dir = tmp_path_factory.mktemp("saved")
    OmegaConf.save(plan(compose(START)).cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


@pytest.mark.slow
def test_the_starting_command_with_resume_appended_resumes_and_may_raise_the_budget(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    command = [*START, f"hydra.run.dir={run_dir}", *HYDRA_IN_PROCESS]
    monkeypatch.setattr(sys, "argv", ["qd-run"])  # main() hands hydra its own argv
    monkeypatch.chdir(tmp_path)
    qd.run.main(command)  # in process: one interpreter start less
    assert evaluations(run_dir) == 32
    qd_run(*command, "runner.max_evaluations=64", f"resume={run_dir}", cwd=tmp_path)
    assert evaluations(run_dir) == 64
    qd.run.main([*command, "runner.max_evaluations=64", f"resume={run_dir}"])  # nothing left to do
    assert evaluations(run_dir) == 64
    assert not (tmp_path / "outputs").exists()  # the same run, not a new one


@pytest.mark.parametrize(
    "changed, message",
    [
        (["runner.batch_size=32"], "runner.batch_size: differs from the run's (32 ≠ 16)"),
        (["seed=4"], "seed: differs from the run's (4 ≠ 3)"),
        (["archive=cvt"], "archive.kind: differs from the run's (cvt ≠ grid)"),
        (["experiment.params.dim=6"], "experiment.params.dim: differs from the run's (6 ≠ 4)"),
    ],
)
def test_a_differing_override_is_a_one_line_error_naming_it(saved, changed, message, capsys):
    with pytest.raises(SystemExit) as e:
        qd.run.main([*START, f"hydra.run.dir={saved}", *changed, f"resume={saved}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"qd-run: error: {message} (drop it to resume, or start a new run)"
    ]


def test_relative_paths_of_the_starting_command_agree_with_the_saved_absolute_ones(tmp_path, monkeypatch):
    for name in ("initial_program.py", "evaluator.py"):
        shutil.copy(OPENEVOLVE / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    command = [
        "experiment=openevolve",
        "experiment.params.initial_program=initial_program.py",
        "experiment.params.evaluator=evaluator.py",
        "runner.max_llm_calls=50",
    ]
    saved = plan(compose(command)).cfg
    assert saved.experiment.params.evaluator == str(tmp_path / "evaluator.py")
    assert qd.run._new_budgets(saved, [*command, "runner.max_llm_calls=80"], []) == {
        "runner.max_llm_calls": 80
    }
