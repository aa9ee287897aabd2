"""Stop rules beside the budgets: a target fitness, patience, and the broken-evaluator guard; and
what stops a run besides (:func:`should_stop`, SIGINT and SIGTERM: :func:`stopped_by_signals`).

The rules read only ``RunState.watch`` (``qd.search.state.Watch``) and the count of valid
candidates, so :func:`should_stop` stays a pure predicate of the state, and a resumed
run (the watch is checkpointed) keeps its patience and its guard's counts. :func:`watched`
is the one place the watch is updated, once per commit.

The guard exists because a run whose every evaluation fails would otherwise never stop:
while the archive is empty, founders are proposed again and again without any model call,
so no LLM budget binds. It tells a broken harness from a weak model by where each failure was
raised (``qd.sandbox.protocol.raised_by_candidate``; an error starting with ``harness: `` is
the harness's): children that fail for their own reasons (a syntax error, an exception in
their code, a malformed answer) never count towards it. A founder (one of the task's own
initial genomes, no parent) that fails counts as the harness's: the task ships it. With
``guard_after`` N it stops the run when

(a) no candidate stored is valid and N candidates have failed so (not for their own reasons), or
(b) the latest N candidates all failed so with the same error

and names the three most common errors of the failed candidates, with their counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from qd.sandbox.protocol import harness_failure
from qd.search.state import RunState, Watch

if TYPE_CHECKING:
    from qd.budget import Spending


@dataclasses.dataclass(frozen=True)
class StopRules:
    """The run's stop rules (None: off).

    Attributes:
        target_fitness: stop once the best fitness committed reaches it.
        patience: stop after this many proposals committed without a new best fitness.
        guard_after: the broken-evaluator guard's N (see the module doc; None or 0: off).
    """

    target_fitness: float | None = None
    patience: int | None = None
    guard_after: int | None = 50

    def reached(self, state: RunState) -> str | None:
        """The rule the run has met (a target fitness, its patience), or None."""
        w = state.watch
        if self.target_fitness is not None and w.best >= self.target_fitness:
            return f"target fitness {self.target_fitness:g} reached (best {w.best:.6g})"
        if self.patience and w.stale >= self.patience:
            return f"no new best fitness in {w.stale} proposals (runner.patience={self.patience})"
        return None

    def broken(self, state: RunState) -> str | None:
        """Why the guard finds the evaluator broken, or None (its errors are named by :func:`guard_line`)."""
        w, n = state.watch, self.guard_after
        if not n:
            return None
        if state.counters.valid == 0 and w.harness >= n:
            return f"no valid candidate after {w.harness} failures outside the children's own code"
        if w.streak >= n:
            return f"the last {w.streak} candidates failed outside the children's own code with one error"
        return None


def watched(watch: Watch, candidates: Sequence[Any], fitness: np.ndarray, proposals: int) -> Watch:
    """``watch`` after a commit of ``proposals`` proposals: these ``candidates``, inserted with
    this ``fitness`` (the archive's objective: CycleQD's phase's)."""
    valid = np.asarray([c.valid for c in candidates], bool)
    best = float(np.max(np.asarray(fitness)[valid])) if valid.any() else -np.inf
    improved = best > watch.best
    harness, streak, error = watch.harness, watch.streak, watch.streak_error
    for c in candidates:
        if harness_failure(c.error) or (not c.valid and len(c.parent_ids) == 0):
            harness += 1
            streak, error = (streak + 1, error) if c.error == error else (1, c.error)
        else:
            streak, error = 0, ""
    return Watch(
        best=best if improved else watch.best,
        stale=0 if improved else watch.stale + proposals,
        harness=harness,
        streak=streak,
        streak_error=error,
    )


def applied(
    state: RunState, rules: StopRules, errors: Callable[[int], list[tuple[str, int]]]
) -> tuple[RunState, dict[str, str] | None]:
    """``state`` with the first stop rule met kept as the run's, and the event naming it (None: no
    new stop). A target or patience is ``state.done`` (a stop, not an error); the guard's line
    (:func:`guard_line`, the commonest errors from ``errors(3)``) is ``state.stop``, the run's
    error. Kept, so a new best from the waves still in flight cannot undo it."""
    if state.stop is not None or state.done is not None:
        return state, None
    if why := rules.broken(state):
        line = guard_line(why, errors(3))
        return state._replace(stop=line), {"guard": line}
    if done := rules.reached(state):
        return state._replace(done=done), {"rule": done}
    return state, None


def guard_line(why: str, errors: Sequence[tuple[str, int]]) -> str:
    """The guard's one line: why it stopped the run and the commonest errors with their counts."""
    common = "; ".join(f"{count} x {error}" for error, count in errors)
    return f"broken evaluator: {why} (runner.guard_after); most common errors: {common}"


def should_stop(
    state: RunState, spending: Spending, elapsed: float, llm: Any, rules: StopRules = StopRules()
) -> bool:
    """Whether the run stops now: asked to (``state.stop``: a signal), a dead client, a spent budget,
    or a stop rule met (a target, patience, a broken evaluator). The driver (``qd.loop``) asks
    before each proposal it starts."""
    down = llm is not None and llm.down is not None
    asked = state.stop is not None or state.done is not None
    ruled = rules.reached(state) is not None or rules.broken(state) is not None
    return asked or down or ruled or spending.exhausted(elapsed, llm.ledger if llm is not None else None)


@contextlib.contextmanager
def stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``stop`` while the block runs on the main thread's event loop (off
    it, the caller handles signals): a run asked to stop finishes its proposals in flight."""
    loop, handled = asyncio.get_running_loop(), []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop)
            handled.append(sig)
    try:
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
