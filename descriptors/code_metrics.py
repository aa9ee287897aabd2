"""Code metrics from the AST: cheap, deterministic descriptors for programs.

Parsing never runs the code, so this is safe on the host. A program that does
not parse gives None (the caller marks the candidate invalid), never an error.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections.abc import Sequence

import numpy as np

from descriptors.base import Described, Item
from qd.contract import ConfigError, Descriptor

_BRANCHES = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.IfExp,
    ast.ExceptHandler,
    ast.With,
    ast.AsyncWith,
    ast.Assert,
    ast.comprehension,
    ast.match_case,
)
_NESTING = frozenset(
    (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.If,
        ast.For,
        ast.AsyncFor,
        ast.While,
        ast.With,
        ast.AsyncWith,
        ast.Try,
        ast.Match,
    )
)
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.comprehension)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_IMPORTS = (ast.Import, ast.ImportFrom)
# The counts each node class adds to (parse makes only these exact classes, so a type lookup
# stands for isinstance); numeric constants and boolean operands are counted apart.
_COUNTED = ("branches", "functions", "loops", "calls", "imports", "constants")
_KINDS: dict[type, tuple[str, ...]] = {}
for _name, _classes in (
    ("branches", _BRANCHES),
    ("functions", _FUNCTIONS),
    ("loops", _LOOPS),
    ("calls", (ast.Call,)),
    ("imports", _IMPORTS),
):
    for _cls in _classes:
        _KINDS[_cls] = (*_KINDS.get(_cls, ()), _name)
_NOT_TOKENS = frozenset(
    (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
)

METRICS = (
    "lines",
    "tokens",
    "nodes",
    "cyclomatic",
    "nesting",
    "functions",
    "loops",
    "calls",
    "imports",
    "constants",
)
# What each metric measures, as an axis label (``qd plot``, ``qd explore``, ``qd show``).
AXIS_NAMES = {
    "lines": "lines",
    "tokens": "tokens",
    "nodes": "AST nodes",
    "cyclomatic": "cyclomatic complexity",
    "nesting": "nesting depth",
    "functions": "functions",
    "loops": "loops",
    "calls": "calls",
    "imports": "imports",
    "constants": "numeric constants",
}


_TREE_METRICS = tuple(name for name in METRICS if name != "tokens")  # one walk of the tree gives these


def code_metrics(source: str, names: Sequence[str] = METRICS) -> dict[str, int] | None:
    """The metrics ``names`` (default: all of ``METRICS``) for ``source``, or None if it does not parse.

    cyclomatic is McCabe's: 1 + branches + extra boolean operands; nesting is the
    deepest chain of blocks (def, class, if, loops, with, try, match). ``tokens`` is
    the one metric that needs a tokenization as well as the parse: a caller that does
    not ask for it does not pay for it (a third of the cost).
    """
    tree = _tree_metrics(source)
    if tree is None:
        return None
    metrics = dict(zip(_TREE_METRICS, tree))
    if "tokens" in names:
        if (tokens := _token_count(source)) is None:
            return None
        metrics["tokens"] = tokens
    return {name: metrics[name] for name in names}


# A cascade scores one text once per stage, and a task may read it for its descriptor and its
# size: each parse after the first is a lookup (a fresh dict each time, so callers may change it).
@functools.lru_cache(maxsize=1024)
def _tree_metrics(source: str) -> tuple[int, ...] | None:
    """``_TREE_METRICS``' values in order; one parse, one walk of the tree."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    counts = dict.fromkeys(_COUNTED, 0)
    nodes = extra = deepest = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]  # iterative: no recursion limit
    while stack:
        node, depth = stack.pop()
        nodes, deepest, kind = nodes + 1, max(deepest, depth), type(node)
        for name in _KINDS.get(kind, ()):
            counts[name] += 1
        if kind is ast.BoolOp:
            extra += len(node.values) - 1
        elif kind is ast.Constant and type(node.value) in (int, float, complex):
            counts["constants"] += 1
        for child in ast.iter_child_nodes(node):
            stack.append((child, depth + (type(child) in _NESTING)))
    lines = sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))
    values = {"lines": lines, "nodes": nodes, "nesting": deepest, **counts}
    values["cyclomatic"] = 1 + counts.pop("branches") + extra
    return tuple(values[name] for name in _TREE_METRICS)


@functools.lru_cache(maxsize=1024)
def _token_count(source: str) -> int | None:
    """The tokens of ``source`` that carry code (no layout, comments or end marker); None if it
    does not tokenize."""
    try:
        return sum(
            1 for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in _NOT_TOKENS
        )
    except (SyntaxError, ValueError, tokenize.TokenError, RecursionError, MemoryError):
        return None


class CodeMetricsDescriptor(Descriptor):
    """Chosen code metrics as archive axes; a program that does not parse is invalid.

    Args:
        metrics: names from ``METRICS``, one per axis.
        lower, upper: (D,) axis bounds (values outside are clipped into the edge cells).
    """

    name = "code_metrics"

    def __init__(self, metrics: Sequence[str], lower: Sequence[float], upper: Sequence[float]):
        unknown = [m for m in metrics if m not in METRICS]
        if not metrics or unknown:
            raise ConfigError(
                "metrics", f"unknown or empty {unknown or list(metrics)}", f"use some of {list(METRICS)}"
            )
        if not (len(lower) == len(upper) == len(metrics)):
            raise ConfigError("lower", f"lower and upper need one bound per metric ({len(metrics)})")
        self.metrics = tuple(metrics)
        self.dim = len(self.metrics)
        self.lower, self.upper = tuple(map(float, lower)), tuple(map(float, upper))

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(AXIS_NAMES[m] for m in self.metrics)

    async def describe(self, items: Sequence[Item]) -> Described:
        values = np.full((len(items), self.dim), np.nan, np.float32)
        valid = np.ones(len(items), bool)
        error: list[str | None] = [None] * len(items)
        for j, item in enumerate(items):
            m = code_metrics(item.text or "", self.metrics)
            if m is None:
                valid[j], error[j] = False, "code_metrics: the program does not parse"
            else:
                values[j] = [m[name] for name in self.metrics]
        return Described(values, valid, error)
