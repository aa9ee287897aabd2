"""The driver: an asynchronous steady-state loop, propose -> evaluate -> commit.

Up to ``in_flight`` proposals run at once (``qd.proposers``), formed in *waves* of up to
``commit_group`` that read the same archive (with a model, one wave ahead: its proposals run as
others finish, so a wave waiting on its slowest member holds no slot). The oldest wave, once all
of it is done, is committed in the order proposals started, as one pipeline
(:meth:`Engine._commit`: one store transaction, one insert, one events write): place
(``qd.placement``; ties to a judge, ``qd.search.tiebreak``) -> store (``qd.store``, before
anything counts, so a crash never loses an evaluated candidate) -> insert (``qd.archive``) ->
record (elite table, duplicate index) -> strategy (``qd.search.step``: credit, islands) -> report
(``events.jsonl``, progress, the ``on_commit`` callback); then upkeep: a CycleQD rotation or a
describer refit rebuilds the archive from the store, and a checkpoint is written on schedule. No
generation barrier: a wave is formed as soon as the oldest is done; waves are cut by count, never
by timing.

Everything random comes from the run's key, so a run is a pure function of its
seed and of what the operators and evaluator return: with the LLM response cache,
a rerun replays the same run exactly. Everything that changes is one ``qd.state.RunState``;
its checkpoint is written every ``checkpoint_every`` proposals committed, on
SIGINT/SIGTERM and at the end. On start, the loop loads it and replays every store
row newer than it, so after ``kill -9`` each evaluated candidate counts once.

A failed LLM call fails only its child; a client that is down (``qd.contract.LLMDown``)
stops the run cleanly, keeping everything evaluated.
Beside the budgets, the stop rules (``qd.stop_rules``: a target fitness, patience, the
broken-evaluator guard) stop it the same way.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np

from qd import archive
from qd import state as run_state
from qd.assembly import Parts
from qd.budget import Budget
from qd.elite_table import ArchiveView, EliteTable
from qd.heap import frozen_heap
from qd.llm import Ledger
from qd.progress import RunProgress
from qd.proposers import Proposal, Ticket, Wave
from qd.report import commit_lines
from qd.search.step import Move
from qd.stop_rules import applied, should_stop, stopped_by_signals, watched

__all__ = ["Budget", "Engine", "should_stop"]


def due_turns(parts: Parts, batches: int) -> list[tuple[str, int, Callable[[], Awaitable[dict]]]]:
    """The LLM turns outside any proposal due after ``batches`` commits, as (event kind, calls
    it may make, work): a meta evolution (two calls: a hyper-mutation turn makes two), a
    lessons note (``qd.lessons``)."""
    meta, lessons, llm = parts.meta, parts.lessons, parts.llm
    turns: list[tuple[str, int, Callable[[], Awaitable[dict]]]] = []
    if meta is not None and meta.due():
        turns.append(("meta", 2, lambda: parts.search.evolve_instructions(llm, batches, parts.settings.seed)))
    if lessons is not None and lessons.due(batches):
        turns.append(("lessons", 1, lambda: lessons.write(llm, batches)))
    return turns


def record_moves(
    moves: list[Move], state: run_state.RunState, store: Any, elites: EliteTable, events: Any
) -> bool:
    """Migrations and resets (after ``state``'s last candidate) into the store's history, the
    elite table (which reads ``state``'s archive after them) and the events; True if an island
    was reset."""
    last_id = state.counters.last_id
    if moves:
        elites.enter(state.archive)
    for m in moves:
        valid = np.asarray(m.migrants.valid)
        if m.reset is not None:
            store.add_reset(last_id, np.flatnonzero(m.reset))
        store.add_migrations(
            last_id, np.asarray(m.migrants.genome_id)[valid], np.asarray(m.migrants.island)[valid]
        )
        if m.reset is not None:
            islands, sources = np.flatnonzero(m.reset), np.asarray(m.migrants.source_island)[valid]
            events.write("reset", {"islands": islands.tolist(), "reseeded_from": sources.tolist()})
    return any(m.reset is not None for m in moves)


class Engine:
    """Runs built parts (``qd.assembly.Parts``): proposals in flight, commits in start order, upkeep.

    It opens and builds nothing: ``qd.assembly.assemble`` made every part, and ``close`` closes what
    the parts hold. ``state`` is the latest ``qd.state.RunState``; the parts take it and return
    a new one, so a candidate's path through :meth:`_commit` can be read from the calls alone.
    """

    def __init__(self, parts: Parts):
        self.parts, self.state = parts, parts.state
        self.settings, self.store, self.llm = parts.settings, parts.store, parts.llm
        self.placement, self.search, self.spending = parts.placement, parts.search, parts.spending
        self.proposer, self.events, self.report, self.elites = (
            parts.proposer,
            parts.events,
            parts.report,
            parts.elites,
        )
        self._closers: list[Callable[[], Any]] = []

    # ----- the loop -------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        """Candidates in the store (each evaluated exactly once)."""
        return self.spending.evaluations

    def run(self) -> dict[str, Any]:
        """Runs until a budget is spent, a stop rule is met, SIGINT/SIGTERM, or a dead LLM; returns
        the final summary."""
        return asyncio.run(self._run())

    def request_stop(self, reason: str = "") -> None:
        """Asks the run to stop (a signal, or a reason such as a dead client's); the first reason stays."""
        if not self.state.stop:
            self.state = self.state._replace(stop=reason)

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped on an error (None: it did not)."""
        return self.state.stop or None

    async def _run(self) -> dict[str, Any]:
        with stopped_by_signals(self.request_stop), frozen_heap():
            return await self._session()

    async def _session(self) -> dict[str, Any]:
        self._started = time.monotonic() - self.state.counters.elapsed
        self._slots = asyncio.Semaphore(self.settings.in_flight)
        self.report.start_session(self.evaluations)
        self._progress = RunProgress(self.settings.progress)
        pending: collections.deque[list[tuple[asyncio.Future, Ticket]]] = collections.deque()  # waves
        try:
            if self.placement.rotation_due(self.state):
                self._rebuilt(*self.placement.rotate(self.store, self.state))  # replay crossed a phase
            while self._refill(pending) or pending:
                await asyncio.wait([f for f, _ in pending[0]])  # the whole oldest wave, in start order
                wave = pending.popleft()
                proposals = [f.result() for f, _ in wave]
                if self.settings.in_flight > 1:  # the next wave starts on the archive before this one
                    self._refill(pending)
                fits = self.state.counters.fits
                for p in [p for p in proposals if p.fits is not None and p.fits != fits]:
                    await self.placement.describe(p.candidates)  # described before a refit: redo
                await self._commit(proposals)
                for _, t in wave:  # its founders are no longer in flight: their elites are parents now
                    self.state = self.state.found(t.island, -int(t.founding))
        finally:
            running = [f for w in pending for f, _ in w]
            for fut in running:
                fut.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if self.llm is not None:
                await self.llm.aclose()
            self._checkpoint()
            summary = self.summary()
            self._progress.close(self.report.status(self.evaluations, self._elapsed(), "done"))
        return summary

    def _refill(self, pending: collections.deque) -> bool:
        """Starts waves until ``in_flight`` proposals run or a budget says stop; True if any is running.

        An empty island gets at most ``initial_population`` founder children in
        flight; later proposals for it wait for a commit that gives it parents.
        Arms, parents and inspirations are drawn here (``qd.proposers.Wave``: no jitted
        dispatch per proposal), synchronously, so they depend only on the seed. With a model,
        one wave more is formed ahead: its proposals take the slots (``_running``) that finished
        proposals free, so no slot idles while a wave waits on its slowest member.
        """
        s = self.settings
        formed = s.in_flight + (s.group if self.llm is not None and s.in_flight > 1 else 0)
        while not self._stopping() and (n := min(s.group, formed - sum(map(len, pending)))) > 0:
            view = ArchiveView(
                self.state.archive, self.state.curiosity, self.elites, self.parts.strategy.selection
            )
            draws, wave = Wave(self.state, s.group, view, self.search, s.batch_size), []
            for row in range(n):
                size, c = self.spending.size(s.batch_size), self.state.counters
                island = c.proposals % s.islands
                founding = bool(self.report.stats.num_elites[island] == 0)
                if size == 0 or (founding and self.state.founding[island] >= s.founder_proposals):
                    break
                self.state = self.state.found(island, int(founding)).count(proposals=c.proposals + 1)
                self.spending.reserve(size)
                ticket = draws.ticket(row, c.proposals, size, founding)
                wave.append(
                    (asyncio.ensure_future(self._running(ticket, self.proposer.start(ticket, view))), ticket)
                )
            if not wave:
                break
            pending.append(wave)
            if len(wave) < n:
                break
        return bool(pending)

    async def _running(self, ticket: Ticket, proposal: Coroutine[Any, Any, Proposal]) -> Proposal:
        """A formed proposal (it has read the archive) runs once one of the ``in_flight`` slots is
        free; its slot frees as it finishes, not as its wave commits. One that waited for its slot
        (formed ahead) and gets it once the run is stopping never runs (its wave commits it empty,
        releasing its reservation): a stop waits only for proposals that had started."""
        try:
            waited = self._slots.locked()
            async with self._slots:
                if waited and self._stopping():
                    return Proposal([], None, np.zeros((0, 2), np.int64), [], ticket.size)
                return await proposal
        finally:
            proposal.close()  # (not run: never awaited, and no warning says so)

    async def _commit(self, proposals: list[Proposal]) -> None:
        """place -> store -> insert -> record -> strategy -> report for one wave, then upkeep."""
        calls, batches = Ledger.merged(p.calls for p in proposals), self.state.counters.batches
        reserved, trials = sum(p.reserved for p in proposals), sum(p.trials for p in proposals)
        proposals = [p for p in proposals if p.candidates]
        candidates = [c for p in proposals for c in p.candidates]
        if not candidates:
            return self.spending.commit(0, reserved, calls, trials)
        self.state, offers = self.placement.offers(candidates, self.state)
        spec, tiebreak = self.placement.spec(self.state), self.parts.tiebreak
        if tiebreak is not None:  # before storing: a win is part of the candidate's record
            settled = tiebreak.settle(candidates, offers, spec, self.state.archive.fitness, self.elites)
            await self.spending.counted(settled, self.store)
        # Stored before it counts; SQLite releases the GIL, so proposals in flight run meanwhile.
        # With the rows, the proposals started: a resume that replays them draws no number twice.
        clock = {run_state.PROPOSALS_STARTED: self.state.counters.proposals}
        ids = np.asarray(await asyncio.to_thread(self.store.add, candidates, calls.rows(), facts=clock))
        self.spending.commit(len(ids), reserved, calls, trials)
        a, result = archive.insert(spec, self.state.archive, *offers.columns(ids))
        self.elites.enter(a, candidates)
        self.proposer.committed(candidates, result)
        c, watch = self.state.counters, watched(self.state.watch, candidates, offers.fitness, len(proposals))
        self.state = self.state._replace(archive=a, watch=watch).count(
            last_id=int(ids[-1]), batches=c.batches + len(proposals), insertions=c.insertions + len(ids)
        )
        self.state, credits, moves = self.search.after_insert(
            self.state, spec, proposals, offers.island, result, offers.fitness
        )
        if record_moves(moves, self.state, self.store, self.elites, self.events):
            self._checkpoint()  # a reset is checkpointed at once
        self.report.inserted(self.state.archive, offers.island, offers.fitness, result, moved=bool(moves))
        lines = commit_lines(proposals, result, credits, batches, self.evaluations)
        rate = {"evals_per_s": round(self.report.rate(self.evaluations), 2)}
        events = self.events.write("commit", lines, {**self.summary(wave=True), **rate})
        if self.settings.progress:
            self._progress.update(self.report.status(self.evaluations, self._elapsed()))
        await self._upkeep(batches)
        for event in events if self.parts.on_commit is not None else ():
            self.parts.on_commit(event)

    async def _upkeep(self, before: int) -> None:
        """A rotation or refit (each rebuilds and checkpoints), else a scheduled checkpoint (every
        ``checkpoint_every`` proposals committed; ``before`` were before this wave); ``due_turns``."""
        if self.placement.rotation_due(self.state):
            self._rebuilt(*self.placement.rotate(self.store, self.state))
        elif self.placement.refit_due(self.state):
            self._rebuilt(
                *await self.spending.counted(self.placement.refit(self.store, self.state), self.store)
            )
        elif self.state.counters.batches // (every := self.settings.checkpoint_every) > before // every:
            self._checkpoint()
        for kind, calls, work in due_turns(self.parts, self.state.counters.batches):
            await self._turn(kind, calls, work)

    async def _turn(self, kind: str, calls: int, work: Callable[[], Awaitable[dict]]) -> None:
        """A turn of :func:`due_turns` if the budget leaves its calls; its rows are not placements."""
        if self._stopping() or self.spending.calls_left() < calls:
            return
        try:
            event = await self.spending.counted(work(), self.store)
        finally:
            self.state = self.state.count(last_id=self.store.last_id())
        self.events.write(kind, event)

    def _rebuilt(self, state: run_state.RunState, event: dict[str, Any]) -> None:
        self.state = state._replace(stop=self.state.stop, done=self.state.done)  # (asked while it ran)
        self.elites = EliteTable.from_store(state.archive, self.store, self.elites.genome_dim)
        self.report.refresh(state.archive)
        kind = event.pop("event")
        self.events.write(kind, {**event, "elites": int(self.report.stats.num_elites[-1])})
        self._checkpoint()

    def _checkpoint(self) -> None:
        p, meta = self.placement, self.parts.meta
        self.state = self.state.count(elapsed=self._elapsed())._replace(
            meta=meta.state_dict() if meta is not None else None,
            describer=p.describer.state_dict() if p.fitted and self.state.counters.fits else None,
        )
        run_state.save(self.parts.checkpoints, self.state)

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _stopping(self) -> bool:
        """:func:`should_stop`, with a dead client's reason kept as the run's; once stopping, the
        budget reserves nothing more (gate resamples in flight get no new calls)."""
        if self.llm is not None and self.llm.down is not None:
            self.request_stop(self.llm.down)
        if self.parts.evaluator.down is not None:  # e.g. a Ray cluster with no node left
            self.request_stop(self.parts.evaluator.down)
        self.state, event = applied(self.state, self.settings.stop, self.store.common_errors)
        if event is not None:
            self.events.write("stop", event)
        stop = should_stop(self.state, self.spending, self._elapsed(), self.llm, self.settings.stop)
        if stop:
            self.spending.stop()
        return stop

    def summary(self, wave: bool = False) -> dict[str, Any]:
        """The run so far (``wave``: without the counts each commit line has its own of); ``stop``:
        the stop rule it met."""
        c = self.state.counters
        out = self.report.summary(
            self.evaluations, c.batches, self._elapsed(), c.fits, self.stop_reason, not wave
        )
        return out | ({"stop": self.state.done} if self.state.done and not wave else {})

    def on_close(self, fn: Callable[[], Any]) -> None:
        """Registers ``fn()`` to run at ``close`` (e.g. stopping the embedded LLM server)."""
        self._closers.append(fn)

    def close(self) -> None:
        """Closes the store and the evaluator, then the ``on_close`` callbacks."""
        self.events.close()
        self.store.close()
        self.parts.evaluator.close()
        for fn in self._closers:
            fn()
