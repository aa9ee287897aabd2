"""The shape of the code: plug-ins import only the ground floor, the driver stays short."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_FROM_ENGINE = ("qd.contract", "qd.archive")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "qd")
    return out


@pytest.mark.parametrize("package", ["operators", "descriptors"])
def test_plugins_import_only_the_contract_and_the_archive_from_the_engine(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    reached = {
        (f.relative_to(ROOT).as_posix(), m)
        for f in files
        for m in _imports(f)
        if m == "qd" or m.startswith("qd.")
    }
    outside = {
        (f, m) for f, m in reached if not any(m == a or m.startswith(a + ".") for a in ALLOWED_FROM_ENGINE)
    }
    assert not outside, f"{package}/ reaches into the engine: {sorted(outside)}"
    assert any(m == "qd.contract" for _, m in reached)  # the walk sees the imports at all


def test_the_walk_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from qd.store import Store\n    import qd.llm\n")
    assert {"qd.store", "qd.llm"} <= _imports(source)


def _classes(path: Path) -> list[ast.ClassDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]


def test_the_driver_is_short_and_no_class_or_module_is_long():
    """Caps met by moving a responsibility (ruff's format pass keeps lines from being packed)."""
    assert len((ROOT / "qd" / "loop.py").read_text().splitlines()) <= 350
    modules = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "qd").rglob("*.py")
    }
    assert {m: n for m, n in modules.items() if n > 600} == {}
    long = [
        (p.relative_to(ROOT).as_posix(), c.name, c.end_lineno - c.lineno + 1)
        for p in sorted((ROOT / "qd").rglob("*.py"))
        for c in _classes(p)
        if c.end_lineno - c.lineno + 1 > 250
    ]
    assert not long, long


def test_the_commit_reads_as_the_pipeline_in_at_most_40_lines():
    tree = ast.parse((ROOT / "qd" / "loop.py").read_text())
    commit = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "_commit")
    assert commit.end_lineno - commit.lineno + 1 <= 40
    named = [
        n.attr
        for n in sorted(
            (n for n in ast.walk(commit) if isinstance(n, ast.Attribute)),
            key=lambda n: (n.lineno, n.col_offset),
        )
    ]
    order = [named.index(step) for step in ("offers", "add", "insert", "enter", "after_insert", "write")]
    assert order == sorted(order), named  # place -> store -> insert -> record -> strategy -> report


def test_engine_parts_are_not_mixins_and_hold_no_driver():
    from qd import loop

    assert loop.Engine.__bases__ == (object,)
    builders = {"loop.py", "run.py", "api.py", "__init__.py"}  # the driver and what builds and runs it
    for path in sorted((ROOT / "qd").rglob("*.py")):
        if path.parent.name == "qd" and path.name in builders:
            continue
        assert "qd.loop" not in _imports(path), f"{path} imports the driver"


def test_every_package_ships_in_the_wheel():
    """A package missing from pyproject's list installs without it: ``qd plot`` once failed so."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        p.parent.relative_to(ROOT).as_posix().replace("/", ".")
        for top in ("qd", "operators", "descriptors", "genomes")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_the_tests_of_qd_mirror_its_subpackages():
    """One test folder per ``qd/`` subpackage, so a part's tests are found where the part is."""
    packages = {p.parent.name for p in (ROOT / "qd").glob("*/__init__.py")}
    folders = {p.name for p in (ROOT / "tests" / "qd").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages and packages == folders


def test_the_cma_mae_settings_are_named_only_by_the_archive_the_schema_and_the_plan():
    """They are the spec's fields: nothing else carries them beside it."""
    allowed = ("qd/archive/", "qd/config.py", "qd/plan.py")
    named = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "qd").rglob("*.py")
        if "learning_rate" in p.read_text() and not p.relative_to(ROOT).as_posix().startswith(allowed)
    )
    assert named == []
