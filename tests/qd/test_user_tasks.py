"""Your own task from your own folder: ``experiment.task=path/to/task.py``, ``--config-dir``,
resume from elsewhere, and the OpenEvolve adapter (``experiment=openevolve``)."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import evaluate_in_sandbox, qd_run, run_config, stored
from omegaconf import OmegaConf
from scripted_llm import Rule

from qd.contract import ConfigError
from qd.plan import compose, plan
from qd.run import _overrides_and_config_dirs, main
from qd.task import load_task

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "my_task"
OPENEVOLVE = REPO / "experiments" / "openevolve" / "example"
QUIET = ["runner.progress=false"]


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """A working directory outside the repository holding the docs' example task (``my_task/``)."""
    cwd = tmp_path / "project"
    shutil.copytree(EXAMPLE, cwd / "my_task")
    return cwd


def test_a_task_file_outside_the_repository_runs_and_resumes_from_another_directory(
    user_folder, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    qd_run(
        "experiment=skills",
        "experiment.task=my_task/task.py",
        "runner.max_evaluations=128",
        f"hydra.run.dir={run_dir}",
        *QUIET,
        cwd=user_folder,
    )
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.experiment.task == str(user_folder / "my_task" / "task.py")  # absolute: found from anywhere
    assert len(stored(run_dir)) == 128

    monkeypatch.chdir(tmp_path)  # where my_task/task.py names nothing
    main([f"resume={run_dir}", "runner.max_evaluations=256"])  # in process: one interpreter start less
    rows = stored(run_dir)
    assert len(rows) == 256 and len({c.id for c in rows}) == 256


def test_config_dir_adds_the_users_experiment(user_folder):
    proc = qd_run(
        "--config-dir",
        "my_task",
        "experiment=my_task",
        "runner.max_evaluations=128",
        "--json",
        *QUIET,
        cwd=user_folder,
    )
    (run_dir,) = (user_folder / "outputs" / "my_task").iterdir()
    assert OmegaConf.load(run_dir / "config.yaml").experiment.task == str(user_folder / "my_task" / "task.py")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["global"]
    assert summary["num_elites"] > 10 and summary["max_fitness"] > 50


def test_compose_finds_an_experiment_only_in_the_given_config_dirs(user_folder, monkeypatch):
    monkeypatch.chdir(user_folder)
    cfg = compose(["experiment=my_task"], config_dirs=["my_task"])
    assert cfg.experiment.task == "my_task/task.py" and cfg.archive.bins == [20, 20]
    with pytest.raises(Exception, match="my_task"):
        compose(["experiment=my_task"])
    with pytest.raises(ConfigError, match=r"^--config-dir: no folder .*nope"):
        compose(["experiment=my_task"], config_dirs=["nope"])


def test_hydra_flags_values_are_config_dirs_never_overrides():
    argv = [
        "-m",
        "--config-dir",
        "a",
        "-cd=b",
        "--config-name",
        "other",
        "experiment=x",
        "hydra.job.chdir=true",
    ]
    assert _overrides_and_config_dirs(argv) == (["experiment=x"], ["a", "b"])


def test_a_missing_task_file_is_a_one_line_error_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        plan(compose(["experiment=skills", "experiment.task=nowhere/task.py"]))
    assert str(e.value).startswith(
        f"experiment.task: no task file {tmp_path / 'nowhere' / 'task.py'} (give the path"
    )
    assert "\n" not in str(e.value)


def test_a_relative_entry_in_a_task_is_refused(tmp_path):
    task = tmp_path / "task.py"
    task.write_text(
        "class T:\n    kind = 'text'\n    sandbox_entry = 'entry.py:run'\n\n"
        "def make_task():\n    return T()\n"
    )
    with pytest.raises(
        ConfigError, match=r"^experiment.task: .*sandbox_entry 'entry.py:run' is a relative path"
    ):
        load_task(str(task), {})


def test_pool_workers_reload_a_task_file_by_its_path(user_folder, tmp_path):
    cfg = compose(
        [
            "experiment=my_task",
            "runner.evaluator=pool",
            "runner.workers=2",
            "runner.max_evaluations=128",
            f"experiment.task={user_folder / 'my_task' / 'task.py'}",
            *QUIET,
        ],
        config_dirs=[user_folder / "my_task"],
    )
    summary = run_config(cfg, tmp_path / "run")
    assert summary["evaluations"] == 128 and all(c.valid for c in stored(tmp_path / "run"))


GRID = (
    "```python\nimport random\n\n\n# EVOLVE-BLOCK-START\ndef search(f, budget=200):\n"
    "    points = [(-2.5 + 2 * (i % 20) / 19, (i // 20) / 19) for i in range(400)]  # twice the budget\n"
    "    return min(points, key=lambda p: f(*p))\n# EVOLVE-BLOCK-END\n```"
)


def test_openevolve_example_evolves_with_the_evaluators_metrics_as_its_scores(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", GRID)])
    cfg = compose(
        [
            "experiment=openevolve",
            "llm.provider=server",
            f"llm.base_url={server.base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "llm.timeout_s=5",
            "runner.max_llm_calls=3",
            "runner.workers=2",
            "operators.mix=[{name: rewrite}]",
            *QUIET,
        ]
    )
    assert plan(cfg).evaluator == "sandbox"  # evaluate(program_path) runs the program: never on the host
    run_config(cfg, tmp_path)
    rows = stored(tmp_path)
    seed = next(c for c in rows if c.operator == "init")
    assert seed.text == (OPENEVOLVE / "initial_program.py").read_text()
    child = next(c for c in rows if c.operator == "rewrite" and c.valid)
    assert child.metrics["calls"] == 400.0  # the evaluator's numbers, as it computed them in the sandbox
    for c in (seed, child):
        assert c.fitness == pytest.approx(c.metrics["combined_score"])
    assert (
        child.metrics["combined_score"] < child.metrics["value_score"]
    )  # over budget: the evaluator's penalty
    assert seed.metrics["combined_score"] == pytest.approx(0.814353, abs=1e-5)


def test_openevolve_reads_an_evaluation_result_and_named_metric_descriptors(tmp_path):
    evaluator = tmp_path / "evaluator.py"  # under /tmp, which the sandbox cannot see: its source travels
    evaluator.write_text(
        "import importlib.util, types\n\n"
        "def evaluate(program_path):\n"
        "    spec = importlib.util.spec_from_file_location('p', program_path)\n"
        "    p = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(p)\n"
        "    x = p.value()\n"
        "    return types.SimpleNamespace(metrics={'x': x, 'half': x / 2, 'note': 'ok'},\n"
        "                                 artifacts={'log': b'ran'})\n"
    )
    program = tmp_path / "initial_program.py"
    program.write_text("def value():\n    return 4.0\n")
    task = load_task(
        "openevolve",
        {"initial_program": str(program), "evaluator": str(evaluator), "descriptors": ["half", "lines"]},
    )
    e = evaluate_in_sandbox(task, [task.seed, "def value():\n    return 'four'\n"])
    assert e.valid.tolist() == [True, False]
    assert e.descriptor[0].tolist() == [2.0, 2.0]  # the evaluator's 'half'; the code metric 'lines'
    assert e.fitness[0] == 4.0  # no combined_score: the mean of the numbers not used as descriptors
    assert e.artifacts[0]["note"] == "ok" and e.artifacts[0]["log"] == "ran"
    assert "TypeError" in e.error[1]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"evaluator": "nope.py"}, "experiment.params.evaluator: no file"),
        ({"function": "score"}, "experiment.params.evaluator: .* defines no function score"),
        ({"descriptors": []}, "experiment.params.descriptors: must name at least one metric"),
    ],
)
def test_openevolve_bad_params_are_one_line_errors(params, message):
    base = {
        "initial_program": str(OPENEVOLVE / "initial_program.py"),
        "evaluator": str(OPENEVOLVE / "evaluator.py"),
    }
    with pytest.raises(ConfigError, match="^" + message):
        load_task("openevolve", {**base, **params})


def test_openevolve_saves_its_files_as_absolute_paths(tmp_path, monkeypatch):
    shutil.copytree(OPENEVOLVE, tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    p = plan(
        compose(
            [
                "experiment=openevolve",
                "experiment.params.initial_program=mine/initial_program.py",
                "experiment.params.evaluator=mine/evaluator.py",
            ]
        )
    )
    assert p.cfg.experiment.params.evaluator == str(tmp_path / "mine" / "evaluator.py")


def test_a_missing_model_file_names_the_config_key_to_fix(tmp_path):
    from qd.contract import LLMError
    from qd.llm.server import EmbeddedServer

    with pytest.raises(LLMError, match=r"does not exist \(check llm\.local\.model_path\)"):
        EmbeddedServer(tmp_path / "missing.gguf", log_path=tmp_path / "server.log").start()
    assert OmegaConf.select(compose([]), "llm.local.model_path", default="absent") is None  # the key exists


def test_declared_params_join_own_keywords_and_the_class_params_go_to():
    import dataclasses

    from qd.task import declared_params

    @dataclasses.dataclass
    class Made:
        size: int = 1

    @dataclasses.dataclass
    class Other:
        rows: int = 2

    def own_and_passed(dataset: str | None = None, **params) -> Made | Other:
        return Made(**params)

    def takes_anything(**params):
        return Made(**params)

    def takes_nothing() -> Made:
        return Made()

    own_and_passed.__annotations__["return"] = Made | Other  # (local classes: resolved here, not by name)
    assert declared_params(own_and_passed) == ["dataset", "size"]
    assert declared_params(takes_anything) is None and declared_params(takes_nothing) == []


def test_experiment_dataset_and_metric_reach_the_params_only_when_set():
    from qd.task import task_params

    unset = OmegaConf.create({"params": {"search_items": 4}, "dataset": None, "metric": None})
    assert task_params(unset) == {"search_items": 4}  # a task that takes no dataset loads as it is
    given = OmegaConf.create({"params": {}, "dataset": "rows.jsonl", "metric": "numeric"})
    assert task_params(given) == {"dataset": "rows.jsonl", "metric": "numeric"}
    saved = OmegaConf.create(
        {"params": {"dataset": "/abs/rows.jsonl"}, "dataset": "rows.jsonl", "metric": None}
    )
    assert task_params(saved) == {"dataset": "/abs/rows.jsonl"}  # as a resumed run saved it, made absolute
