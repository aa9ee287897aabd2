"""Code metrics from the AST: cheap, deterministic descriptors for programs.

Parsing never runs the code, so this is safe on the host. A program that does
not parse gives None (the caller marks the candidate invalid), never an error.
"""

from __future__ import annotations

import ast
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
_NESTING = (
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
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.comprehension)

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


def code_metrics(source: str) -> dict[str, int] | None:
    """The metrics named in ``METRICS`` for ``source``, or None if it does not parse.

    cyclomatic is McCabe's: 1 + branches + extra boolean operands; nesting is the
    deepest chain of blocks (def, class, if, loops, with, try, match).
    """
    try:
        tree = ast.parse(source)
        tokens = sum(
            1
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type
            not in (
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.COMMENT,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            )
        )
    except (SyntaxError, ValueError, tokenize.TokenError, RecursionError, MemoryError):
        return None
    nodes = list(ast.walk(tree))
    return {
        "lines": sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#")),
        "tokens": tokens,
        "nodes": len(nodes),
        "cyclomatic": 1
        + sum(isinstance(n, _BRANCHES) for n in nodes)
        + sum(len(n.values) - 1 for n in nodes if isinstance(n, ast.BoolOp)),
        "nesting": _depth(tree),
        "functions": sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for n in nodes),
        "loops": sum(isinstance(n, _LOOPS) for n in nodes),
        "calls": sum(isinstance(n, ast.Call) for n in nodes),
        "imports": sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in nodes),
        "constants": sum(
            isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float, complex))
            and not isinstance(n.value, bool)
            for n in nodes
        ),
    }


def _depth(node: ast.AST) -> int:
    """Deepest nesting of block statements below ``node`` (iterative: no recursion limit)."""
    deepest, stack = 0, [(node, 0)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        for child in ast.iter_child_nodes(n):
            stack.append((child, d + isinstance(child, _NESTING)))
    return deepest


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
            m = code_metrics(item.text or "")
            if m is None:
                valid[j], error[j] = False, "code_metrics: the program does not parse"
            else:
                values[j] = [m[name] for name in self.metrics]
        return Described(values, valid, error)
