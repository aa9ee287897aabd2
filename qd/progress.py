"""Live progress: a bar against the budget that binds on a terminal, a plain status line every few
seconds otherwise (for logs).

Both go to stderr, so stdout holds only what a run ends with (its summary, or ``qd-run --json``'s
one JSON line). The bar's line is fitted to the terminal's width: fields are dropped whole, least
important first, so a narrow terminal shows fewer fields and never a word cut in half.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

SEPARATOR = " · "
BAR_WIDTH = (10, 30)  # the bar's least and greatest width, in cells: a fifth of the terminal's


@dataclasses.dataclass(frozen=True)
class Gauge:
    """One budget: how much of it is spent, its limit (None: no limit) and when it runs out.

    Attributes:
        unit: ``evaluations``, ``LLM calls``, ``tokens``, ``cost`` (dollars) or ``seconds``.
        done: spent so far (a resumed run's earlier sessions included).
        total: the limit, or None.
        eta_s: seconds until ``done`` reaches ``total`` at this session's pace (None: unknown).
    """

    unit: str
    done: float
    total: float | None = None
    eta_s: float | None = None

    @property
    def fraction(self) -> float:
        """The spent share of the limit (0 without one)."""
        return min(1.0, self.done / self.total) if self.total else 0.0

    def count(self) -> str:
        """``12/20 LLM calls``, ``$0.12/$1.00``, ``1:05/5:00`` (or the count alone without a limit)."""
        show = {"cost": lambda v: f"${v:.4g}", "seconds": clock}.get(self.unit, lambda v: f"{int(v)}")
        text = show(self.done) + ("" if self.total is None else f"/{show(self.total)}")
        return text if self.unit in ("cost", "seconds") else f"{text} {self.unit}"  # $ and m:ss say it


def binding(gauges: list[Gauge]) -> Gauge:
    """The budget that binds: of the limited ones, the largest spent share (the first on a tie);
    without any limit, the first gauge (evaluations)."""
    limited = [g for g in gauges if g.total]
    return max(limited, key=lambda g: g.fraction) if limited else gauges[0]


def eta(done: float, total: float | None, done_then: float, seconds: float) -> float | None:
    """Seconds until ``done`` reaches ``total``, at the pace from ``done_then`` over ``seconds``."""
    if total is None or seconds <= 0 or done <= done_then:
        return None
    return max(0.0, (total - done) * seconds / (done - done_then))


def clock(seconds: float) -> str:
    """``42s``, ``3:07``, ``1:02:03``: a duration as a person reads it."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


@dataclasses.dataclass(frozen=True)
class Status:
    """What the progress shows after a commit.

    Attributes:
        gauge: the budget that binds (:func:`binding`).
        fields: the rest, most important first (best so far, coverage, QD score, ...).
        line: the plain status line, for logs.
    """

    gauge: Gauge
    fields: tuple[str, ...]
    line: str


def fit(status: Status, width: int) -> str:
    """The bar's line in at most ``width`` cells: the bar, ``N/TOTAL unit``, the ETA, then
    ``status.fields``. Whole fields are dropped, last first, until it fits; the bar goes before
    the count, the ETA and the first field (best so far) do, and the count's words last, on a
    terminal too narrow for it. The bar's width depends on the terminal's alone, so it holds still."""
    g = status.gauge
    head = [g.count(), *(["ETA " + clock(g.eta_s)] if g.eta_s is not None else [])]
    parts, bar = [*head, *status.fields], bool(g.total)
    cells = min(BAR_WIDTH[1], max(BAR_WIDTH[0], width // 5))
    while parts and len(SEPARATOR.join(parts)) + (cells + 1 if bar else 0) > width:
        if bar and len(parts) <= len(head) + 1:
            bar = False
        else:
            parts.pop()
    if not parts:  # not even the count: as many of its words as fit
        words = g.count().split()
        while words and len(" ".join(words)) > width:
            words.pop()
        return " ".join(words)
    line = SEPARATOR.join(parts)
    if bar:
        done = int(round(g.fraction * cells))
        line = "━" * done + "─" * (cells - done) + " " + line
    return line


class RunProgress:
    """Draws a run's :class:`Status` after each commit: the fitted bar on a terminal (stderr),
    else the plain line every ``every_s`` seconds; :meth:`close` prints the last plain line."""

    def __init__(self, enabled: bool = True, every_s: float = 5.0):
        self.enabled, self.every_s = enabled, every_s
        self._last_line = 0.0
        self._live: Live | None = None
        if enabled and sys.stderr.isatty():
            self._console = Console(stderr=True)
            self._live = Live(Text(""), console=self._console, auto_refresh=False, transient=True)
            self._live.start()

    def update(self, status: Status) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(Text(fit(status, self._console.width - 1), no_wrap=True), refresh=True)
        elif time.monotonic() - self._last_line >= self.every_s:
            self._last_line = time.monotonic()
            print(status.line, file=sys.stderr, flush=True)

    def close(self, status: Status) -> None:
        if self._live is not None:
            self._live.stop()
        if self.enabled:
            print(status.line, file=sys.stderr, flush=True)
