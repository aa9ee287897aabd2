"""The driver: an asynchronous steady-state loop, propose -> evaluate -> commit.

Up to ``in_flight`` proposals run at once (``qd.proposers``), started in *waves* of up to
``commit_group`` that read the same archive. The oldest wave, once all of it is done, is committed
in the order proposals started, as one pipeline (:meth:`Engine._commit`: one store transaction, one
insert, one events write): place (``qd.placement``; ties to a judge, ``qd.search.tiebreak``) ->
store (``qd.store``, before anything counts, so a crash never loses an evaluated candidate) ->
insert (``qd.archive``) -> record (elite table, duplicate index) -> strategy (``qd.search.step``:
credit, islands) -> report (``events.jsonl``, progress, the ``on_commit`` callback); then upkeep:
a CycleQD rotation or a describer refit rebuilds the archive from the store, and a checkpoint is
written on schedule. No generation barrier: a wave starts as soon as the oldest is done; waves are
cut by count, never by timing.

Everything random comes from the run's key, so a run is a pure function of its
seed and of what the operators and evaluator return: with the LLM response cache,
a rerun replays the same run exactly. Everything that changes is one ``qd.state.RunState``;
its checkpoint is written every ``checkpoint_every`` proposals committed, on
SIGINT/SIGTERM and at the end. On start, the loop loads it and replays every store
row newer than it, so after ``kill -9`` each evaluated candidate counts once.

A failed LLM call fails only its child; a client that is down (``qd.contract.LLMDown``)
stops the run cleanly, keeping everything evaluated.
"""

from __future__ import annotations

import asyncio
import collections
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qd import archive
from qd import state as run_state
from qd.budget import Budget, Spending
from qd.elite_table import ArchiveView, EliteTable
from qd.errors import CheckpointError
from qd.events import EventLog
from qd.llm import Ledger
from qd.placement import Placement
from qd.progress import RunProgress
from qd.proposers import Proposal, TextProposer, Ticket, VectorProposer, Wave
from qd.report import Report, commit_lines
from qd.search import islands as island_ops
from qd.search.gate import DuplicateIndex
from qd.search.scheduler import make_bandit
from qd.search.step import Move, SearchStep
from qd.search.strategy import Arm, Strategy
from qd.store import Store

__all__ = ["Budget", "Engine"]


class Engine:
    """One run: a task, an archive spec, operators, and a run directory.

    Args:
        task: initial genomes and evaluator (a numeric ``Task`` or a ``TextTask``).
        spec: archive tessellation (GridSpec / CVTSpec / NoveltySpec).
        operators: the arms, as ``qd.search.strategy.Arm``s or (operator, weight) pairs.
        evaluator: async ``evaluator(genomes) -> Evaluation``.
        run_dir: holds ``store.sqlite``, ``checkpoints/`` and ``events.jsonl``.
        llm: the run's ``qd.llm.LLMClient`` (text tasks).
        initial_population: founder children in flight at most per empty island (whole proposals).
        commit_group: proposals per wave at most (None: half of ``in_flight``); a wave
            shares one commit's cost, and all of the oldest finishes before its slots are reused.
        describer: a ``descriptors.base.Descriptor`` placing text candidates (None:
            the task's own descriptors). Its ``dim`` must match ``spec``.
        strategy: islands, selection, scheduler, meta-prompts, novelty gate, cyclic objectives and
            tie judge (``qd.search.strategy``; the default is plain MAP-Elites).
        on_commit: called with each ``commit`` event (``qd.events``) as it is written.
    """

    def __init__(
        self,
        *,
        task: Any,
        spec: Any,
        operators: list[Any],
        evaluator: Any,
        run_dir: str | Path,
        islands: int = 1,
        batch_size: int = 64,
        in_flight: int = 1,
        budget: Budget = Budget(),
        checkpoint_every: int = 10,
        seed: int = 0,
        learning_rate: float = 1.0,
        threshold_min: float = -math.inf,
        qd_offset: float = 0.0,
        progress: bool = True,
        llm: Any = None,
        initial_population: int = 8,
        describer: Any = None,
        strategy: Strategy = Strategy(),
        on_commit: Callable[[dict], Any] | None = None,
        commit_group: int | None = None,
    ):
        arms = [a if isinstance(a, Arm) else Arm(a[0], None, float(a[1])) for a in operators]
        weights = np.asarray([a.weight for a in arms], np.float64)
        if len(weights) == 0 or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError("operators.mix: need at least one operator with a positive weight")
        self.task, self.evaluator, self.llm, self.strategy, self.on_commit = (
            task,
            evaluator,
            llm,
            strategy,
            on_commit,
        )
        self.islands, self.batch_size, self.in_flight = islands, batch_size, in_flight
        self.group = max(1, commit_group or in_flight // 2)
        self.checkpoint_every, self.seed, self.learning_rate = checkpoint_every, seed, learning_rate
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir, self._closers, self._progress_enabled = self.run_dir / "checkpoints", [], progress
        self._stop_requested, self.stop_reason = False, None  # stop_reason: set when stopping on an error
        self.store = Store(self.run_dir / "store.sqlite")
        ports = self.store.ports()  # what plug-ins get of the store: never the store itself
        self.meta = strategy.meta(ports.log) if strategy.meta is not None else None
        self.gate = strategy.gate(ports.cache) if strategy.gate is not None else None
        self.tiebreak = strategy.tiebreak(llm) if strategy.tiebreak is not None else None
        if describer is not None:
            describer.attach(ports, llm)
        text, cells = task.kind != "vector", not isinstance(spec, archive.NoveltySpec)
        self.placement = Placement(
            spec,
            describer,
            strategy.cycle,
            task.kind,
            islands,
            learning_rate,
            seed,
            valid=self.store.count(valid=True, kind=task.kind),
        )
        bandits = strategy.scheduler or (make_bandit("fixed", len(arms), weights=weights),)
        self.search = SearchStep(strategy, arms, bandits, islands, learning_rate, qd_offset, self.meta)
        self.state = self._load(
            run_state.init(self.placement.spec, islands, bandits, len(arms), seed, threshold_min)
        )
        spent = Ledger.from_rows(self.store.calls.totals())  # committed LLM calls: what budgets count
        if llm is not None:
            llm.ledger.merge(spent)
        per_child = (
            1
            + self.placement.calls_per_child
            + evaluator.model_calls
            + (self.tiebreak.calls_per_item if self.tiebreak is not None else 0)
        )
        self.spending = Spending(budget, self.store.count(kind=task.kind), spent, per_child if text else 0)
        self.proposer = (
            TextProposer(
                task,
                arms,
                evaluator,
                placement=self.placement,
                spending=self.spending,
                store=self.store,
                duplicates=DuplicateIndex(ports.cache),
                gate=self.gate,
                meta=self.meta,
                batch_size=batch_size,
            )
            if text
            else VectorProposer(task, arms, evaluator)
        )
        self._founder_proposals = max(1, -(-initial_population // batch_size))
        self._founding = np.zeros(islands, np.int64)  # founder proposals in flight per island
        self.events = EventLog(self.run_dir / "events.jsonl")
        self.report = Report(islands, qd_offset, islands > 1 and cells, llm, describer, cells=cells)
        self._replay_store()
        self.elites = EliteTable.from_store(self.state.archive, self.store, None if text else task.genome_dim)
        self.report.refresh(self.state.archive)

    # ----- resume ---------------------------------------------------------------

    def _load(self, fresh: run_state.RunState) -> run_state.RunState:
        loaded = run_state.load(self.ckpt_dir, fresh)
        if loaded is None:
            return fresh
        self.placement.resume(loaded)
        if self.meta is not None and loaded.meta:
            self.meta.load_state_dict(loaded.meta)
        shape, want = loaded.archive.fitness.shape, (self.islands, self.placement.spec.num_cells)
        if shape != want:
            raise CheckpointError(
                f"checkpoint in {self.ckpt_dir} holds {shape[0]} islands x {shape[1]} cells but the config "
                f"asks for {want[0]} x {want[1]}; resume with the run's own config.yaml"
            )
        return loaded

    def _replay_store(self) -> None:
        """Inserts every store row (and migration) newer than the checkpoint."""
        c = self.state.counters
        offers = self.store.placements(c.last_id, self.placement.spec.descriptor_dim)
        if len(offers["id"]) or len(offers["reset"]):
            # Islands reset after the checkpoint restart empty; then one batched insert.
            a, isl, _ = island_ops.replay(
                self.placement.spec, self.state.archive, self.state.islands, offers, self.learning_rate
            )
            self.state = self.state._replace(archive=a, islands=isl).count(
                last_id=self.store.last_id(),
                batches=c.batches + 1,
                insertions=c.insertions + len(offers["id"]),
            )

    # ----- the loop -------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        """Candidates in the store (each evaluated exactly once)."""
        return self.spending.evaluations

    def run(self) -> dict[str, Any]:
        """Runs until a budget is spent, SIGINT/SIGTERM, or a dead LLM; returns the final summary."""
        return asyncio.run(self._run())

    def request_stop(self, reason: str | None = None) -> None:
        self._stop_requested = True
        if reason and self.stop_reason is None:
            self.stop_reason = reason

    async def _run(self) -> dict[str, Any]:
        loop, handled = asyncio.get_running_loop(), []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
                handled.append(sig)
            except (RuntimeError, ValueError):
                pass  # not the main thread: the caller handles signals
        self._started = time.monotonic() - self.state.counters.elapsed
        self.report.start_session(self.evaluations)
        self._progress = RunProgress(self.spending.budget.max_evaluations, self._progress_enabled)
        pending: collections.deque[list[tuple[asyncio.Future, Ticket]]] = collections.deque()  # waves
        try:
            if self.placement.rotation_due(self.state):
                self._rebuilt(*self.placement.rotate(self.store, self.state))  # replay crossed a phase
            while self._refill(pending) or pending:
                await asyncio.wait([f for f, _ in pending[0]])  # the whole oldest wave, in start order
                wave = pending.popleft()
                proposals = [f.result() for f, _ in wave]
                if (
                    self.in_flight > 1
                ):  # start the next while this one is written: they see the archive before it
                    self._refill(pending)
                for p in [p for p in proposals if p.fits is not None and p.fits != self.placement.fits]:
                    await self.placement.describe(p.candidates)  # described before a refit: redo
                await self._commit(proposals)
                for _, t in wave:
                    self._founding[t.island] -= t.founding  # after the commit: its elites are parents now
        finally:
            running = [f for w in pending for f, _ in w]
            for fut in running:
                fut.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            for sig in handled:
                loop.remove_signal_handler(sig)
            if self.llm is not None:
                await self.llm.aclose()
            self._checkpoint()
            summary = self.summary()
            self._progress.close(self.report.status_line(self.evaluations, "done"))
        return summary

    def _refill(self, pending: collections.deque) -> bool:
        """Starts waves until ``in_flight`` proposals run or a budget says stop; True if any is running.

        An empty island gets at most ``initial_population`` founder children in
        flight; later proposals for it wait for a commit that gives it parents.
        Arms, parents and inspirations are drawn here (``qd.proposers.Wave``: no jitted
        dispatch per proposal), synchronously, so they depend only on the seed.
        """
        while not self._should_stop() and (n := min(self.group, self.in_flight - sum(map(len, pending)))) > 0:
            view = ArchiveView(self.state.archive, self.state.curiosity, self.elites, self.strategy.selection)
            draws, wave = Wave(self.state, self.group, view, self.search, self.batch_size), []
            for row in range(n):
                size, c = self.spending.size(self.batch_size), self.state.counters
                island = c.proposals % self.islands
                founding = bool(self.report.stats.num_elites[island] == 0)
                if size == 0 or (founding and self._founding[island] >= self._founder_proposals):
                    break
                self._founding[island] += founding
                self.state = self.state.count(proposals=c.proposals + 1)
                self.spending.reserve(size)
                ticket = draws.ticket(row, c.proposals, size, founding)
                wave.append((asyncio.ensure_future(self.proposer.start(ticket, view)), ticket))
            if not wave:
                break
            pending.append(wave)
            if len(wave) < n:
                break
        return bool(pending)

    async def _commit(self, proposals: list[Proposal]) -> None:
        """place -> store -> insert -> record -> strategy -> report for one wave, then upkeep."""
        calls, batches = Ledger.merged(p.calls for p in proposals), self.state.counters.batches
        reserved, proposals = sum(p.reserved for p in proposals), [p for p in proposals if p.candidates]
        candidates = [c for p in proposals for c in p.candidates]
        if not candidates:
            return self.spending.commit(0, reserved, calls)
        offers = self.placement.offers(candidates, self.state)
        if self.tiebreak is not None:  # before storing: a win is part of the candidate's record
            await self.spending.counted(
                self.tiebreak.settle(
                    candidates, offers, self.placement.spec, self.state.archive.fitness, self.elites
                ),
                self.store,
            )
        # Stored before it counts; SQLite releases the GIL, so proposals in flight run meanwhile.
        ids = np.asarray(await asyncio.to_thread(self.store.add, candidates, calls.rows()))
        self.spending.commit(len(ids), reserved, calls)
        a, result = archive.insert(
            self.placement.spec,
            self.state.archive,
            offers.island,
            offers.descriptor,
            offers.fitness,
            ids,
            offers.valid,
            self.learning_rate,
        )
        self.elites.enter(offers.island, result, candidates)
        self.proposer.committed(candidates)
        c = self.state.counters
        self.state = self.state._replace(archive=a).count(
            last_id=int(ids[-1]), batches=c.batches + len(proposals), insertions=c.insertions + len(ids)
        )
        self.state, credits, moves = self.search.after_insert(
            self.state, self.placement.spec, proposals, offers.island, result, offers.fitness
        )
        self._record_moves(moves)
        self.report.inserted(self.state.archive, offers.island, offers.fitness, result, moved=bool(moves))
        events = self.events.write(
            "commit",
            commit_lines(proposals, result, credits, batches, self.evaluations),
            {**self.summary(wave=True), "evals_per_s": round(self.report.rate(self.evaluations), 2)},
        )
        if self._progress_enabled:
            self._progress.update(self.evaluations, self.report.status_line(self.evaluations))
        await self._upkeep(batches)
        for event in events if self.on_commit is not None else ():
            self.on_commit(event)

    def _record_moves(self, moves: list[Move]) -> None:
        """Migrations and resets into the store's history and the elite table."""
        for m in moves:
            last, valid = self.state.counters.last_id, np.asarray(m.migrants.valid)
            if m.reset is not None:
                self.store.add_reset(last, np.flatnonzero(m.reset))
                self.elites.clear(m.reset)
            self.store.add_migrations(
                last, np.asarray(m.migrants.genome_id)[valid], np.asarray(m.migrants.island)[valid]
            )
            self.elites.copy(m.migrants, m.result)
            if m.reset is not None:
                self.events.write(
                    "reset",
                    {
                        "islands": np.flatnonzero(m.reset).tolist(),
                        "reseeded_from": np.asarray(m.migrants.source_island)[valid].tolist(),
                    },
                )
                self._checkpoint()

    async def _upkeep(self, before: int) -> None:
        """A rotation or refit (each rebuilds and checkpoints), else a scheduled checkpoint (every
        ``checkpoint_every`` proposals committed; ``before`` were before this wave); meta evolution."""
        if self.placement.rotation_due(self.state):
            self._rebuilt(*self.placement.rotate(self.store, self.state))
        elif self.placement.refit_due():
            self._rebuilt(
                *await self.spending.counted(self.placement.refit(self.store, self.state), self.store)
            )
        elif self.state.counters.batches // self.checkpoint_every > before // self.checkpoint_every:
            self._checkpoint()
        if (
            self.meta is not None
            and self.meta.due()
            and not self._should_stop()
            and self.spending.calls_left() >= 2
        ):
            try:  # (2: a hyper-mutation turn makes two calls)
                event = await self.spending.counted(
                    self.search.evolve_instructions(self.llm, self.state.counters.batches, self.seed),
                    self.store,
                )
            finally:
                self.state = self.state.count(
                    last_id=self.store.last_id()
                )  # the pool's rows are not placements
            self.events.write("meta", event)

    def _rebuilt(self, state: run_state.RunState, event: dict[str, Any]) -> None:
        self.state = state
        self.elites = EliteTable.from_store(state.archive, self.store, self.elites.genome_dim)
        self.report.refresh(state.archive)
        kind = event.pop("event")
        self.events.write(kind, {**event, "elites": int(self.report.stats.num_elites[-1])})
        self._checkpoint()

    def _checkpoint(self) -> None:
        p = self.placement
        self.state = self.state.count(elapsed=self._elapsed())._replace(
            meta=self.meta.state_dict() if self.meta is not None else None,
            describer=p.describer.state_dict() if p.fitted and p.fits else None,
        )
        run_state.save(self.ckpt_dir, self.state)

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _should_stop(self) -> bool:
        if not self._stop_requested and self.llm is not None and self.llm.down is not None:
            self.request_stop(self.llm.down)
        stop = self._stop_requested or self.spending.exhausted(
            self._elapsed(), self.llm.ledger if self.llm is not None else None
        )
        self.spending.stopping = stop
        return stop

    def summary(self, wave: bool = False) -> dict[str, Any]:
        """The run so far (``wave``: without the counts each commit line has its own of)."""
        c = self.state.counters
        return self.report.summary(
            self.evaluations, c.batches, self._elapsed(), c.fits, self.stop_reason, not wave
        )

    def on_close(self, fn: Callable[[], Any]) -> None:
        """Registers ``fn()`` to run at ``close`` (e.g. stopping the embedded LLM server)."""
        self._closers.append(fn)

    def close(self) -> None:
        """Closes the store and the evaluator, then the ``on_close`` callbacks."""
        self.events.close()
        self.store.close()
        close = getattr(self.evaluator, "close", None)
        if close:
            close()
        for fn in self._closers:
            fn()
