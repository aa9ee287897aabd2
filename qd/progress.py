"""Live progress: a rich bar on a terminal, a plain status line every few seconds otherwise."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunProgress:
    """Shows evaluations/s, QD score, coverage and best fitness while a run goes on."""

    def __init__(self, total: int | None, enabled: bool = True, every_s: float = 5.0):
        self.enabled = enabled
        self.every_s = every_s
        self._last_line = 0.0
        self._live = enabled and sys.stdout.isatty()
        self._bar: Progress | None = None
        if self._live:
            self._bar = Progress(
                TextColumn("[bold]qd"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=Console(),
            )
            self._task = self._bar.add_task("run", total=total, info="")
            self._bar.start()

    def update(self, evaluations: int, line: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=evaluations, info=line)
        elif time.monotonic() - self._last_line >= self.every_s:
            self._last_line = time.monotonic()
            print(line, flush=True)

    def close(self, line: str) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self.enabled:
            print(line, flush=True)
