"""How the terminal views write: a rich table on a terminal, aligned plain text in a
pipe or a file (so ``grep`` and ``less`` see whole values), JSON with ``--json``; and
the one-line errors every command gives for bad input.

The views build plain values (numbers, strings, lists) and hand them here, so one
formatting rule holds for every command and the JSON carries the raw values.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from qd.rundir import RunDir, RunDirError


def fail(prog: str, message: str) -> NoReturn:
    """Bad input: one line on stderr naming the argument and the fix, exit code 2 (no traceback)."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: argparse's own print the whole usage first."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} ({self.prog} --help)")


def parser(prog: str, description: str) -> Parser:
    return Parser(prog=prog, description=description)


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def open_run(prog: str, path: str | Path) -> RunDir:
    try:
        return RunDir(path)
    except RunDirError as e:
        fail(prog, f"RUN_DIR {e}")


def in_range(prog: str, flag: str, value: int | None, count: int, what: str) -> None:
    """Fails unless ``value`` (when given) is in [0, count)."""
    if value is not None and not 0 <= value < count:
        fail(prog, f"{flag} {value}: the run has {count} {what}; pass 0 to {count - 1}")


def no_candidate(prog: str, flag: str, candidate_id: int, run: RunDir) -> NoReturn:
    """Fails for an id the store does not hold, saying which ids it does."""
    held = (
        f"this run stored only its elites (runner.store=elites), which qd show {run.path} lists"
        if not run.store.keeps_every_candidate()
        else f"its ids go from 0 to {run.store.last_id()}"
    )
    fail(prog, f"{flag} {candidate_id}: no such candidate in {run.path}; {held}")


# ----- values -----------------------------------------------------------------------


def fmt(x: Any) -> str:
    """A value as the tables print it: 6 significant digits, ``-`` for none, lists in brackets."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (float, np.floating)):
        return f"{float(x) + 0.0:.6g}"  # + 0.0: -0.0 prints as 0
    if isinstance(x, (list, tuple, np.ndarray)):
        return (
            "["
            + ", ".join(f"{float(v):.4g}" if isinstance(v, (float, np.floating)) else str(v) for v in x)
            + "]"
        )
    return str(x)


def seconds(s: float | None) -> str:
    """A duration as ``42.1s``, ``3m07s`` or ``2h05m``."""
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(round(s)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def plain(x: Any) -> Any:
    """JSON-safe: numpy to Python, NaN and infinities to null, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


# ----- output -----------------------------------------------------------------------


def dump(obj: Any) -> None:
    """``--json``: the whole answer as one JSON document."""
    print(json.dumps(plain(obj), indent=1))


def _console() -> Any:
    """A rich console when stdout is a terminal, else None (plain text)."""
    if not sys.stdout.isatty():
        return None
    from rich.console import Console

    return Console()


def line(text: str) -> None:
    print(text)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows of values under ``columns`` (numbers right-aligned); nothing is truncated in plain text."""
    cells = [[fmt(v) for v in row] for row in rows]
    numeric = [
        bool(rows)
        and all(
            row[j] is None
            or isinstance(row[j], (int, float, np.number))
            and not isinstance(row[j], (bool, np.bool_))
            for row in rows
        )
        for j in range(len(columns))
    ]
    console = _console()
    if console is not None:
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, title_justify="left")
        for name, right in zip(columns, numeric):
            t.add_column(name, justify="right" if right else "left", overflow="fold")
        for row in cells:
            t.add_row(*map(Text, row))  # Text: brackets in values are not rich markup
        console.print(t)
        console.print()
        return
    if title:
        print(title)
    widths = [max([len(c)] + [len(row[j].split("\n")[0]) for row in cells]) for j, c in enumerate(columns)]
    for row in [list(columns), *cells]:
        print(
            "  ".join(
                (v.rjust(w) if right else v.ljust(w)) for v, w, right in zip(row, widths, numeric)
            ).rstrip()
        )
    print()


def block(title: str, body: str, syntax: str | None = None) -> None:
    """A titled piece of text (a genome, a diff, a prompt), whole; coloured by ``syntax`` on a terminal."""
    console = _console()
    if console is not None:
        from rich.rule import Rule
        from rich.syntax import Syntax

        console.print(Rule(title, align="left"))
        console.print(Syntax(body, syntax) if syntax else body, markup=False, highlight=False)
        return
    print(f"--- {title}")
    print(body if body.endswith("\n") or not body else body + "\n", end="")
    print()
