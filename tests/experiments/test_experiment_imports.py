"""Experiments are folders that import shared code from the installed package, never each other's files.

A file loaded by path from another experiment's folder is a hidden dependency: it ships under a
hand-picked module name, and moving either folder breaks the other. A sandbox entry is stricter:
it runs under ``python -I`` with the standard library and its own folder only (docs/tasks.md).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
LOADERS = {"load_module", "spec_from_file_location"}


class Unresolved(Exception):
    """A path expression this reader cannot follow: a new form to teach it, or to rewrite."""


def _path(node: ast.expr, env: dict[str, object]) -> object:
    """The value of a path expression built from ``__file__``, module constants and string parts."""
    match node:
        case ast.Constant(value=str() as text):
            return text
        case ast.Name(id=name) if name in env:
            return env[name]
        case ast.Call(func=ast.Name(id="Path" | "str" as make), args=[arg], keywords=[]):
            return (Path if make == "Path" else str)(_path(arg, env))
        case ast.Call(func=ast.Attribute(value=inner, attr="resolve" | "absolute" | "expanduser"), args=[]):
            return Path(_path(inner, env)).resolve()
        case ast.Attribute(value=inner, attr="parent"):
            return Path(_path(inner, env)).resolve().parent
        case ast.Subscript(
            value=ast.Attribute(value=inner, attr="parents"), slice=ast.Constant(value=int() as i)
        ):
            return Path(_path(inner, env)).resolve().parents[i]
        case ast.BinOp(left=left, op=ast.Div(), right=right):
            return Path(_path(left, env)) / _path(right, env)
    raise Unresolved(ast.unparse(node))


def _constants(tree: ast.Module, path: Path) -> dict[str, object]:
    """``__file__`` and the module-level names assigned a path expression (``_HERE = ...``)."""
    env: dict[str, object] = {"__file__": str(path)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                env[node.targets[0].id] = _path(node.value, env)
            except Unresolved:
                pass
    return env


def _parameters(tree: ast.Module) -> dict[ast.Call, set[str]]:
    """Each call inside a function, with the parameter names of the function that makes it."""
    out: dict[ast.Call, set[str]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
            for call in ast.walk(fn):
                if isinstance(call, ast.Call):
                    out.setdefault(call, set()).update(names)
    return out


def loads_by_path(path: Path) -> list[tuple[int, str, Path | None]]:
    """(line, expression, file) of every load by path in ``path``; file None when it is a parameter of
    the enclosing function (a file given at run time, such as the candidate program an OpenEvolve
    evaluator imports)."""
    tree = ast.parse(path.read_text())
    env, parameters, found = _constants(tree, path), _parameters(tree), []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = getattr(call.func, "attr", None) or getattr(call.func, "id", None)
        if name not in LOADERS:
            continue
        arg = call.args[1] if name == "spec_from_file_location" else call.args[0]
        if isinstance(arg, ast.Name) and arg.id in parameters.get(call, set()):
            found.append((call.lineno, ast.unparse(arg), None))
        else:
            found.append((call.lineno, ast.unparse(arg), Path(_path(arg, env)).resolve()))
    return found


def outside_loads(root: Path) -> tuple[list[str], int]:
    """Every load by path under ``root`` (a folder of experiment folders) that reaches a file outside
    the loading file's experiment folder, and how many loads were read in all."""
    outside, seen = [], 0
    for source in sorted(root.rglob("*.py")):
        folder = root / source.relative_to(root).parts[0]
        for line, expression, target in loads_by_path(source):
            seen += 1
            if target is not None and not target.is_relative_to(folder):
                outside.append(f"{source.relative_to(root)}:{line}: {expression}")
    return outside, seen


def test_no_experiment_loads_another_experiments_file_by_path():
    outside, seen = outside_loads(EXPERIMENTS)
    assert not outside, "import shared code from the installed package (docs/tasks.md):\n" + "\n".join(
        outside
    )
    assert seen >= 10  # the walk sees the experiments' own loads at all


def test_the_walk_follows_path_expressions_and_sees_a_load_from_another_folder(tmp_path):
    probe = tmp_path / "red_team" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "from pathlib import Path\n"
        "import importlib.util\n"
        "from qd.task import load_module\n"
        "_HERE = Path(__file__).resolve().parent\n"
        "own = load_module(_HERE / 'target.py', 'x')\n"
        "other = load_module(_HERE.parent / 'agent_design' / 'seeds.py', 'y')\n"
        "up = load_module(Path(__file__).resolve().parents[1] / 'sphere' / 'task.py', 'z')\n"
        "def run(program_path):\n"
        "    return importlib.util.spec_from_file_location('p', program_path)\n"
    )
    root = tmp_path.resolve()
    assert [(line, target) for line, _, target in loads_by_path(probe)] == [
        (5, root / "red_team" / "target.py"),
        (6, root / "agent_design" / "seeds.py"),
        (7, root / "sphere" / "task.py"),
        (9, None),
    ]
    outside, seen = outside_loads(tmp_path)
    assert seen == 4 and [entry.split(":")[1] for entry in outside] == ["6", "7"]
    with pytest.raises(Unresolved):
        _path(ast.parse("some_call()").body[0].value, {})


def _sandbox_entries() -> dict[str, Path]:
    """Each experiment's sandbox entry file, as its ``task.py`` names it."""
    entries = {}
    for task in sorted(EXPERIMENTS.glob("*/task.py")):
        found = re.search(r"sandbox_entry = f\"\{_HERE / '([\w.]+\.py)'\}:", task.read_text())
        if found:
            entries[task.parent.name] = task.parent / found[1]
    return entries


def test_sandbox_entries_import_only_the_standard_library_and_their_own_folder():
    entries = _sandbox_entries()
    # (openevolve's entry is qd/sandbox/evaluator_entry.py: tests/qd/sandbox/test_worker_parts.py)
    assert set(entries) == {"agent_design", "circle_packing", "function_fit"}
    for name, entry in entries.items():
        tree = ast.parse(entry.read_text())
        imported = {
            a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        imported |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        own = {p.stem for p in entry.parent.glob("*.py")}
        assert imported <= set(sys.stdlib_module_names) | {"__future__"} | own, (name, imported)
