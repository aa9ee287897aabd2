"""``qd export RUN_DIR --kind K [--format F] [--out PATH] [--option key=value ...]``: a run as a dataset.

Prints the path written and the row count; on a terminal, a progress bar on stderr
(a large store takes a while). Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from qd import export
from qd.export.formats import FORMATS
from qd.views import render

PROG = "qd export"


def main(argv: list[str]) -> None:
    ap = render.parser(PROG, "Export a run as a dataset (docs/export.md).")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--kind", required=True, help=f"what each row is: {', '.join(export.KINDS)}")
    ap.add_argument("--format", default="jsonl", dest="fmt", help=f"{', '.join(FORMATS)} (default jsonl)")
    ap.add_argument("--out", type=Path, help="where to write (default ./qd-export/<run>.<kind>.<ext>)")
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a kind's option (repeatable); the value is read as JSON when it parses, else as text",
    )
    args = ap.parse_args(argv)
    options = dict(_option(text) for text in args.option)
    render.open_run(PROG, args.run_dir).close()  # the one-line error for a path that is not a run
    bar = Bar(sys.stderr) if sys.stderr.isatty() else None
    try:
        out, count = export.write(args.run_dir, args.kind, args.fmt, args.out, options, bar)
    except ValueError as e:
        render.fail(PROG, str(e))
    if bar is not None:
        bar.done()
    print(f"{out}  {count} rows")


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        render.fail(PROG, f"--option {text!r}: write it as KEY=VALUE, e.g. --option min_fitness=0.5")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


class Bar:
    """The progress line on a terminal: how much of the store the export has read (a bar, when
    the kind scans the store), the rows written, and the time so far; redrawn at most 10
    times a second."""

    WIDTH = 24

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.stream, self.clock = stream, clock
        self.started = self.drawn = clock()
        self.done_read = self.stored = self.written = 0

    def read(self, candidates: int, stored: int) -> None:
        self.done_read, self.stored = candidates, stored
        self._draw()

    def rows(self, n: int) -> None:
        self.written = n
        self._draw()

    def line(self) -> str:
        elapsed = f"{self.clock() - self.started:.0f} s"
        if not self.stored:
            return f"{PROG}: {self.written:,} rows, {elapsed}"
        part = min(self.done_read / self.stored, 1.0)
        full = int(part * self.WIDTH)
        bar = f"[{'#' * full}{'.' * (self.WIDTH - full)}]"
        return (
            f"{PROG}: {bar} {part:4.0%} of {self.stored:,} candidates read, {self.written:,} rows, {elapsed}"
        )

    def _draw(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.drawn >= 0.1:
            self.drawn = now
            print(f"\r{self.line()}\x1b[K", end="", file=self.stream, flush=True)

    def done(self) -> None:
        self._draw(force=True)
        print(file=self.stream)
