"""The import structure: no file circles, no upward arrows, one definition per class name.

A *unit* is a plug-in package (``operators``, ``descriptors``, ``genomes``), a subpackage
of ``qd`` (``qd.search``, ``qd.rundir``, ...) or a module at ``qd``'s top (``qd.loop``).
Each unit sits on one layer of :data:`LAYERS`, from the ground up:

0. ground: the contract every part and plug-in speaks, the archive, shared leaves;
1. plug-ins, which import only the ground;
2. engine parts: each does one job of a run (store, search, sandbox, LLM client, task);
3. the run's assembly: its state, its stages and the run directory's format;
4. drivers: the host loop and the device loop;
5. builders, readers and commands.

An arrow (an import, at module level or inside a function) is *upward* when it goes
from a unit to a unit of a higher layer. The walk forbids those, circles between files,
and circles between units (two plug-ins importing each other are a circle even when no
two files are). A new unit must be placed in a layer before the suite passes.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("operators", "descriptors", "genomes")
PACKAGES = ("qd", *PLUGINS)

LAYERS = (
    {
        "qd",
        "qd.contract",
        "qd.errors",
        "qd.extras",
        "qd.paths",
        "qd.lifeline",
        "qd.progress",
        "qd.events",
        "qd.archive",
        "qd.compile_cache",
        "qd.heap",
    },
    {"genomes", "operators", "descriptors"},
    {
        "qd.database",
        "qd.side_tables",
        "qd.store",
        "qd.search",
        "qd.sandbox",
        "qd.llm",
        "qd.memory",
        "qd.lessons",
        "qd.task",
        "qd.shipping",
        "qd.callable_tasks",
        "qd.config",
        "qd.reasoning",
    },
    {
        "qd.assembly",
        "qd.rundir",
        "qd.state",
        "qd.budget",
        "qd.stop_rules",
        "qd.evaluator",
        "qd.elite_table",
        "qd.report",
        "qd.placement",
        "qd.fronts",
        "qd.proposers",
        "qd.workbench",
    },
    {"qd.loop", "qd.device"},
    {
        "qd.plan",
        "qd.run",
        "qd.api",
        "qd.cli",
        "qd.history",
        "qd.views",
        "qd.explore",
        "qd.export",
        "qd.plot",
        "qd.heldout",
        "qd.judge_stats",
        "qd.committee",
        "qd.tables",
        "qd.design_table",
        "qd.optimizer",
        "qd.optimize_parts",
        "qd.optimize_result",
        "qd.data",
    },
)

# The sandbox worker runs alone under ``python -I``, loaded by path: nothing on the host imports it.
WORKER = "qd.sandbox.worker"


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``packages`` (a package is its ``__init__``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports, at any depth (function-level imports and
    relative ones included); ``from P import m`` is an arrow to the module ``P.m`` when there
    is one, else to ``P``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(
                    [*here[: len(here) - node.level + 1], *([node.module] if node.module else [])]
                )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imported(name, path, known) for name, path in known.items()}


def unit(name: str) -> str:
    parts = name.split(".")
    return parts[0] if parts[0] != "qd" else ".".join(parts[:2])


def units(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for a, targets in g.items():
        out[unit(a)].update(unit(b) for b in targets if unit(b) != unit(a))
    return {u: out[u] for u in {unit(a) for a in g}}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(found)


def upward(g: dict[str, set[str]], layers: tuple[set[str], ...]) -> list[tuple[str, str]]:
    layer = {u: k for k, members in enumerate(layers) for u in members}
    return sorted((a, b) for a, targets in g.items() for b in targets if layer[unit(b)] > layer[unit(a)])


@pytest.fixture(scope="module")
def house() -> dict[str, set[str]]:
    return graph(ROOT, PACKAGES)


def test_every_unit_sits_on_exactly_one_layer(house):
    placed = [u for members in LAYERS for u in members]
    assert len(placed) == len(set(placed))
    assert set(units(house)) == set(placed), "place each new unit in LAYERS (and docs/design.md)"


def test_no_file_circles(house):
    assert circles(house) == []


def test_no_unit_circles(house):
    assert circles(units(house)) == []


def test_no_upward_imports(house):
    assert upward(house, LAYERS) == []


def test_the_host_never_imports_the_sandbox_worker(house):
    importers = {a for a, targets in house.items() if WORKER in targets}
    assert not importers


def _class_names(root: Path) -> dict[str, list[str]]:
    defined = collections.defaultdict(list)
    for path in sorted((root / "qd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(path.relative_to(root).as_posix())
    return defined


def test_no_class_name_is_defined_twice_in_qd():
    twice = {n: files for n, files in _class_names(ROOT).items() if len(files) > 1}
    assert twice == {}


def test_the_walk_finds_circles_and_upward_arrows_hidden_in_functions_and_relative_imports(tmp_path):
    """A walk that missed function-level or relative imports would pass a broken house."""
    files = {
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from high.b import g\n",
        "low/c.py": "from . import a\nfrom .a import f\n",
        "high/__init__.py": "import low\n",
        "high/b.py": "from low.a import f\nimport numpy\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    g = graph(tmp_path, ("low", "high"))
    assert g == {
        "low": set(),
        "low.a": {"high.b"},
        "low.c": {"low.a"},
        "high": {"low"},
        "high.b": {"low.a"},
    }
    assert circles(g) == [["high.b", "low.a"]]
    assert upward(g, ({"low"}, {"high"})) == [("low.a", "high.b")]
    assert circles(units(g)) == [["high", "low"]]
