"""``qd export RUN_DIR --kind K [--format F] [--out PATH] [--option key=value ...]``: a run as a dataset.

Prints the path written and the row count; on a terminal, a progress line on stderr
as rows are written (a large store takes a while). Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from qd import export
from qd.export.formats import FORMATS
from qd.views import render

PROG = "qd export"
PROGRESS_EVERY = 1000  # rows between progress lines


def main(argv: list[str]) -> None:
    ap = render.parser(PROG, "Export a run as a dataset (docs/export.md).")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--kind", required=True, help=f"what each row is: {', '.join(export.KINDS)}")
    ap.add_argument("--format", default="jsonl", dest="fmt", help=f"{', '.join(FORMATS)} (default jsonl)")
    ap.add_argument("--out", type=Path, help="where to write (default ./qd-export/<run>.<kind>.<ext>)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a kind's option (repeatable); the value is read as JSON when it parses, else as text")
    args = ap.parse_args(argv)
    options = dict(_option(text) for text in args.option)
    render.open_run(PROG, args.run_dir).close()  # the one-line error for a path that is not a run
    try:
        out, count = export.write(args.run_dir, args.kind, args.fmt, args.out, options,
                                  _progress if sys.stderr.isatty() else None)
    except ValueError as e:
        render.fail(PROG, str(e))
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"{out}  {count} rows")


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        render.fail(PROG, f"--option {text!r}: write it as KEY=VALUE, e.g. --option min_fitness=0.5")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _progress(rows: int) -> None:
    if rows % PROGRESS_EVERY == 0:
        print(f"\r{PROG}: {rows} rows", end="", file=sys.stderr, flush=True)
