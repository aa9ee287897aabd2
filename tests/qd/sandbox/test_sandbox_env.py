"""The sandbox sees the environment qd runs from, even a virtual environment under /tmp,
while the rest of /tmp stays private and the isolation report is the same."""

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import pytest
from helpers import qd_run, run_python, stored
from scripted_llm import Rule

from qd.sandbox.isolation import kept_private, top_entry

REPO = Path(__file__).resolve().parents[3]
EVALUATOR = """\
import importlib.util
import os
import socket

import qd_env_probe  # installed in the virtual environment qd runs from, under /tmp


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("program", program_path)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
        online = 1.0
    except OSError:
        online = 0.0
    return {{
        "combined_score": qd_env_probe.SCORE * program.value(),
        "sees_host_tmp": float(os.path.exists({planted!r})),
        "online": online,
    }}
"""
ISOLATION = (
    "import json, sys; from qd.sandbox import Sandbox; print(json.dumps(Sandbox('json:dumps').isolation()))"
)


@pytest.fixture
def under_tmp():
    """A folder directly under /tmp (whatever TMPDIR says): where the private tmpfs goes."""
    root = Path(tempfile.mkdtemp(prefix="qd-env-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def venv_with_probe(root: Path) -> Path:
    """A virtual environment at ``root/venv`` seeing the system's packages (qd and its
    dependencies), with a package of its own, ``qd_env_probe``; returns its python."""
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert site.startswith(str(venv))
    (Path(site) / "qd_env_probe").mkdir()
    (Path(site) / "qd_env_probe" / "__init__.py").write_text("SCORE = 0.5\n")
    return python


@pytest.mark.slow
def test_an_evaluator_imports_what_the_venv_under_tmp_holds(under_tmp, scripted_llm):
    python = venv_with_probe(under_tmp)
    server = scripted_llm([Rule("", "```python\ndef value():\n    return 3.0\n```")])
    planted = under_tmp / "planted.txt"  # the host's /tmp beside the venv: still hidden
    planted.write_text("secret")
    project = under_tmp / "project"  # the working directory, under /tmp too: still hidden
    project.mkdir()
    (project / "initial_program.py").write_text("def value():\n    return 2.0\n")
    port = urllib.parse.urlsplit(server.base_url).port  # the evaluator tries to reach it: network off
    (project / "evaluator.py").write_text(EVALUATOR.format(port=port, planted=str(planted)))
    run_dir = under_tmp / "run"
    qd_run(  # this checkout's qd, the venv's other packages
        "experiment=openevolve",
        "experiment.params.initial_program=initial_program.py",
        "experiment.params.evaluator=evaluator.py",
        "llm.provider=server",
        f"llm.base_url={server.base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "llm.timeout_s=5",
        "operators.mix=[{name: rewrite}]",
        "runner.max_llm_calls=2",
        "runner.workers=1",
        "runner.progress=false",
        f"hydra.run.dir={run_dir}",
        cwd=project,
        timeout=120,
        python=python,
    )
    rows = stored(run_dir)
    assert len(rows) >= 3 and all(c.valid for c in rows), [c.error for c in rows]
    assert sorted({c.fitness for c in rows}) == [1.0, 1.5]  # SCORE of the venv's package × value()
    assert all(c.metrics["sees_host_tmp"] == 0.0 and c.metrics["online"] == 0.0 for c in rows)

    isolation = [
        json.loads(run_python("-c", ISOLATION, cwd=Path.cwd(), python=py).stdout)
        for py in (sys.executable, python)
    ]
    assert isolation[0] == isolation[1]  # with the venv under /tmp as without it


def test_the_paths_kept_under_tmp_are_the_outermost_environment_ones_but_the_working_directory(under_tmp):
    site, src, cwd = (under_tmp / "venv/lib/site-packages", under_tmp / "src", under_tmp / "project")
    for path in (site, src, cwd):
        path.mkdir(parents=True)
    host_path = [str(cwd), str(site), str(under_tmp / "venv"), str(src), "/tmp", "/usr/lib", "/no/such/dir"]
    # (this interpreter's own prefix is kept too where it lives under /tmp)
    kept = [path for path in kept_private(host_path, str(cwd)) if path.startswith(str(under_tmp))]
    assert kept == [str(src), str(under_tmp / "venv")]  # not site-packages inside the venv, nor the cwd
    assert {top_entry(path) for path in kept} == {str(under_tmp)}
