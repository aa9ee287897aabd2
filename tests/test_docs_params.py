"""Every ``experiment.params.X`` the docs name is accepted as written: it composes (no ``+``)
and plans with its experiment; an unknown one is refused naming the valid ones."""

import functools
import json
import re
import shutil
from pathlib import Path

import pytest

from qd.contract import ConfigError
from qd.paths import experiments_dir
from qd.plan import compose, plan
from qd.task import declared_params, load_module

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "experiments").glob("*/README.md")]
)
# experiment.params.name (not a placeholder such as NAME), with its value where a command sets
# it (a quoted list may hold spaces)
PARAM = re.compile(r"experiment\.params\.([a-z_][a-z0-9_]*)(?:=(\[[^\]]*\]|[^\s`\"']+))?")
EXPERIMENT = re.compile(r"\bexperiment=(\w+)")
OPENEVOLVE = ROOT / "experiments" / "openevolve" / "example"


def declared(experiment: str) -> list[str]:
    module = load_module(experiments_dir() / experiment / "task.py", f"qd_experiment_{experiment}")
    return declared_params(module.make_task) or []


@functools.cache
def default_task(experiment: str):
    return plan(compose([f"experiment={experiment}"])).task


EXPERIMENTS = sorted(p.parent.name for p in experiments_dir().glob("*/task.py"))


def documented() -> list[tuple[str, str | None, str, str | None]]:
    """(where, experiment, param, value as written or None) for each mention in the docs.
    The experiment is the one the same line runs, the folder of an experiment's README, or
    else each experiment that declares the param (None if none does)."""
    found = set()
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for param, value in PARAM.findall(line):
                on_line = EXPERIMENT.search(line)
                if on_line:
                    runs = [on_line.group(1)]
                elif doc.parent.parent.name == "experiments":
                    runs = [doc.parent.name]
                else:
                    runs = [e for e in EXPERIMENTS if param in declared(e)] or [None]
                for experiment in runs:
                    found.add((f"{doc.relative_to(ROOT)}:{number}", experiment, param, value or None))
    return sorted(found, key=str)


MENTIONS = documented()


def test_the_docs_name_params():
    names = {param for _, _, param, _ in MENTIONS}
    assert {"description", "function", "descriptors", "target", "max_chars"} <= names


@pytest.mark.parametrize("where, experiment, param, value", MENTIONS, ids=[m[0] for m in MENTIONS])
def test_each_documented_param_is_accepted_as_written(where, experiment, param, value, tmp_path, monkeypatch):
    assert experiment is not None and param in declared(experiment), f"{where}: no experiment takes {param}"
    for name in ("initial_program.py", "evaluator.py"):  # the files an OpenEvolve user's command names
        shutil.copy(OPENEVOLVE / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    if value is None:  # named in prose: the key as written, with the value the experiment has by default
        value = json.dumps(getattr(default_task(experiment), param))
    p = plan(compose([f"experiment={experiment}", f"experiment.params.{param}={value}"]))
    assert param in p.cfg.experiment.params


def test_an_unknown_param_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        plan(compose(["experiment=openevolve", "experiment.params.descripton=x"]))
    assert str(e.value).startswith(
        "experiment.params.descripton: not a param of openevolve (its params: initial_program, evaluator, "
        "descriptors, description, function"
    )
