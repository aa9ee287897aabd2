"""The asynchronous steady-state loop: parents -> operator -> evaluate -> store -> insert.

Up to ``in_flight`` proposals run at once; each finished one is written to the
store (committed) and only then inserted into the archive, so a crash never
loses an evaluated candidate. No generation barrier: proposal k+in_flight starts
as soon as proposal k is done.

Proposals are committed in the order they started, and each samples its parents
from the archive as it was after the commits before it. So a run is a pure
function of its seed and of what the operators and evaluator return: with the
LLM response cache, a rerun replays the same run exactly.

Text tasks (programs, prompts) use LLM operators and are evaluated in the
sandbox (``qd.proposal``). A failed LLM call fails only its child (stored
invalid with the reason); a client that is down (``qd.llm.LLMDown``: a refused
key, or no answer for ``llm.give_up_after_s``) stops the run cleanly, keeping
everything already evaluated. Every proposal counts its calls in its own ledger
(``qd.llm.tally``), committed with its candidates, so the LLM budget is what the
store holds, whatever made the calls (operators, judges, meta mutations).

How the search moves is a ``qd.search.strategy.Strategy``: each proposal pulls an arm
(operator, model) chosen by the scheduler; parents come from ``qd.search.select``;
after each commit the arm, the parents' curiosity and the meta instructions are
paid in archive improvement, islands migrate or reset (``qd.search.islands``), and a
CycleQD rotation rebuilds the archive from the store. A ``describer`` (see ``descriptors.base``) may
place text candidates instead of the task's own descriptors; a fitted one is
refit on its schedule, after which every stored candidate is re-described and
re-inserted into a fresh archive in one batched call, and a checkpoint written.

Durability: every ``checkpoint_every`` insert batches (and on SIGINT/SIGTERM and
at the end) the archive, RNG key and counters are checkpointed atomically. On
start, the loop loads the last checkpoint and replays every store row newer
than it, so after ``kill -9`` each evaluated candidate counts exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from descriptors.base import Item, is_fitted_kind
from qd import archive, checkpoint
from qd.search import select
from qd.search import islands as island_ops
from qd.errors import CheckpointError
from qd.search.gate import DuplicateIndex
from qd.llm import Ledger, tally
from qd.progress import RunProgress
from qd.proposal import Proposal, TextProposals
from qd.search.scheduler import make_bandit
from qd.search.scheduler import state_dict as bandit_arrays
from qd.store import Candidate, Store
from qd.search.strategy import Arm, Strategy
from qd.strategy_steps import StrategySteps


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Budget:
    """The run stops cleanly at the first limit reached (None = no limit).

    Evaluations and LLM calls are never exceeded (a proposal is sized to what is
    left); tokens and cost are known only when a call returns, so calls already
    in flight may overshoot those two.
    """

    max_evaluations: int | None = None
    max_seconds: float | None = None
    max_llm_calls: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None


@jax.jit
def _proposal_keys(key: jax.Array) -> tuple[jax.Array, ...]:
    """One dispatch for all of a proposal's randomness: next key, arm choice, a seed
    for the task's initial genomes and the prompts, and keys for parents,
    inspirations and the operator."""
    key, arm_key, seed_key, parent_key, inspire_key, op_key = jax.random.split(key, 6)
    seed = jax.random.randint(seed_key, (), 0, 2**31 - 1)
    return key, arm_key, seed, parent_key, inspire_key, op_key


def _open_events(path: Path):
    """Opens events.jsonl for appending, dropping a line torn by a crash."""
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])
    return open(path, "a")


class Engine(TextProposals, StrategySteps):
    """One run: a task, an archive spec, operators, and a run directory.

    Args:
        task: initial genomes and evaluator (a numeric ``Task`` or a ``TextTask``).
        spec: archive tessellation (GridSpec / CVTSpec).
        operators: the arms, as ``qd.search.strategy.Arm``s or (operator, weight) pairs. A
            numeric operator is an async callable ``op(key, parents f32[B, k, n],
            context) -> f32[B, n]``; an LLM operator is ``op(parents, inspirations,
            context) -> list[Child]``. Both have ``name`` and ``num_parents``; LLM
            ones also ``num_inspirations``.
        evaluator: async ``evaluator(genomes) -> Evaluation``.
        run_dir: holds ``store.sqlite``, ``checkpoints/`` and ``events.jsonl``.
        llm: the run's ``qd.llm.LLMClient`` (text tasks); its ledger feeds the
            LLM budgets and the progress line and is checkpointed.
        initial_population: seed children in flight at most per empty island
            (rounded up to whole proposals of ``batch_size``).
        describer: a ``descriptors.base.Descriptor`` placing text candidates (None:
            the task's own descriptors). Its ``dim`` must match ``spec``.
        strategy: islands, selection, scheduler, meta-prompts, novelty gate and
            cyclic objectives (``qd.search.strategy``; the default is plain MAP-Elites).
    """

    def __init__(
        self,
        *,
        task: Any,
        spec: archive.GridSpec,
        operators: list[tuple[Any, float]],
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
    ):
        self.task, self.spec, self.evaluator, self.llm = task, spec, evaluator, llm
        self.describer, self.seed = describer, seed
        self._fitted = describer is not None and is_fitted_kind(describer)
        self._calls_per_child = 1 + getattr(describer, "calls_per_item", 0)
        self._closers: list[Any] = []
        self._seed_proposals = max(1, -(-initial_population // batch_size))
        self._seeding = np.zeros(islands, np.int64)  # seed proposals in flight per island
        self.arms = [a if isinstance(a, Arm) else Arm(a[0], None, float(a[1])) for a in operators]
        weights = np.asarray([a.weight for a in self.arms], np.float64)
        if len(weights) == 0 or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError("operators.mix: need at least one operator with a positive weight")
        self.strategy = strategy
        self._bandits = strategy.scheduler or (make_bandit("fixed", len(self.arms), weights=weights),)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.islands, self.batch_size, self.in_flight = islands, batch_size, in_flight
        self.budget, self.checkpoint_every = budget, checkpoint_every
        self.learning_rate, self.qd_offset = learning_rate, qd_offset
        self.store = Store(self.run_dir / "store.sqlite")
        self._duplicates = DuplicateIndex(self.store)
        self.meta = strategy.meta(self.store) if strategy.meta is not None else None
        self.gate = strategy.gate(self.store) if strategy.gate is not None else None
        if callable(getattr(describer, "attach", None)):
            describer.attach(self.store, llm)
        self._events = _open_events(self.run_dir / "events.jsonl")
        self._ckpt_dir = self.run_dir / "checkpoints"
        self._progress_enabled = progress
        self._stop_requested = False
        self.stop_reason: str | None = None  # set when the run stops on an error

        loaded = checkpoint.load(self._ckpt_dir)
        saved: dict[str, np.ndarray] = {}
        if loaded is None:
            if strategy.cycle is not None:
                self.spec = strategy.cycle.spec(0)
            self.state = archive.init(self.spec, islands, self.spec.descriptor_dim, threshold_min)
            self.key = jax.random.key(seed)
            self.counters = {
                "batches": 0, "last_id": -1, "elapsed": 0.0, "proposals": 0, "fits": 0, "insertions": 0,
            }
        else:
            self.state, self.key, self.counters = loaded
            for name in ("proposals", "fits", "insertions"):
                self.counters.setdefault(name, 0)
            saved = checkpoint.load_arrays(self._ckpt_dir)
            if self._fitted and self.counters["fits"]:
                describer.load_state_dict(checkpoint.part(saved, "describer."))
                self._use_describer_cells()
            if strategy.cycle is not None:
                self.spec = strategy.cycle.spec(self._phase())
            if self.state.fitness.shape != (islands, self.spec.num_cells):
                raise CheckpointError(
                    f"checkpoint in {self._ckpt_dir} holds {self.state.fitness.shape[0]} islands x "
                    f"{self.state.fitness.shape[1]} cells but the config asks for {islands} x "
                    f"{self.spec.num_cells}; resume with the run's own config.yaml"
                )
        self._restore_strategy(saved)
        self._count = self.store.count(kind=task.kind)
        self._valid_count = self.store.count(valid=True, kind=task.kind)
        self.spent = Ledger.from_rows(self.store.llm_calls())  # committed LLM calls: what budgets count
        if self.llm is not None:
            self.llm.ledger.merge(self.spent)
        self._genomes = self._empty_genome_table()
        self._replay_store()
        self._fill_genome_table()
        self._update_stats()

    # ----- resume -------------------------------------------------------------

    def _replay_store(self) -> None:
        """Inserts every store row (and migration) newer than the checkpoint."""
        after = self.counters["last_id"]
        offers = self.store.placements(after, self.spec.descriptor_dim)
        if len(offers["id"]) or len(offers["reset"]):
            # Islands reset after the checkpoint restart empty; then one batched insert.
            self.state, self.istate, _ = island_ops.replay(
                self.spec, self.state, self.istate, offers, self.learning_rate)
            self.counters["last_id"] = self.store.last_id()
            self.counters["batches"] += 1
            self.counters["insertions"] += len(offers["id"])

    def _empty_genome_table(self) -> np.ndarray:
        """Host table of each elite: [I, C, n] floats, or [I, C] store Candidates (text)."""
        shape = (self.islands, self.spec.num_cells)
        if self.task.kind == "vector":
            return np.zeros((*shape, self.task.genome_dim), np.float32)
        return np.empty(shape, object)

    def _elite_entry(self, candidate: Candidate) -> Any:
        return candidate.vector if self.task.kind == "vector" else candidate

    def _fill_genome_table(self) -> None:
        ids = np.asarray(self.state.genome_id)
        island, cell = np.nonzero(ids >= 0)
        if len(island):
            for i, c, cand in zip(island, cell, self.store.get(ids[island, cell])):
                self._genomes[i, c] = self._elite_entry(cand)

    def _use_describer_cells(self) -> None:
        """Takes the describer's own tessellation (CVT centroids fitted in embedding space)."""
        cell_spec = getattr(self.describer, "cell_spec", None)
        spec = cell_spec() if callable(cell_spec) else None
        if spec is not None:
            self.spec = spec

    # ----- descriptors ----------------------------------------------------------

    async def _describe(self, candidates: list[Candidate]) -> None:
        """Places each evaluated, valid text candidate with the describer (in place).

        A describer failure makes the candidate invalid with its reason; an
        unfitted describer leaves NaN descriptors (stored, placed after the fit).
        """
        todo = [c for c in candidates if c.valid and c.text is not None]
        if not todo:
            return
        out = await self.describer.describe([Item(c.text, c.fitness, c.metrics, c.id) for c in todo])
        for c, values, ok, error in zip(todo, np.asarray(out.values, np.float32), out.valid, out.error):
            c.descriptor = values
            if not ok:
                c.valid, c.error = False, f"descriptor: {error}"

    async def refit(self) -> None:
        """Fits the describer on every valid stored candidate, then re-places them all.

        Every placement in the store's history (candidates and migrations) is
        re-described and inserted into a fresh archive in one batched call, so no
        stored candidate is lost; then a checkpoint holds the new fitted state.
        """
        started = time.monotonic()
        stored = [c for c in self.store.iter() if c.valid and c.kind == "text"]
        items = [Item(c.text, c.fitness, c.metrics, c.id) for c in stored]
        await self.describer.fit(items, np.random.default_rng([self.seed, self.counters["fits"]]))
        self.counters["fits"] += 1
        self._use_describer_cells()
        out = await self.describer.describe(items)
        fitness = np.asarray([c.fitness for c in stored], np.float32)
        placed = self._rebuild([c.id for c in stored], fitness, out.values, out.valid)
        self._log({"event": "refit", "fits": self.counters["fits"], "candidates": len(items), "placed": placed,
                   "elites": int(self._stats.num_elites[-1]), "seconds": round(time.monotonic() - started, 3)})

    def _rebuild(self, ids: list[int], fitness: Any, descriptor: Any, valid: Any) -> int:
        """A fresh archive from every placement in the store's history (candidates,
        migrations, resets) with these per-candidate values, in one batched insert;
        then a checkpoint. Returns how many placements were valid."""
        row = {int(i): j for j, i in enumerate(ids)}
        offers = self.store.placements(-1, self.spec.descriptor_dim)
        dim, n = self.spec.descriptor_dim, len(ids)
        # Row n is a placeholder for offers of candidates not among ``ids``: never placed.
        take = np.asarray([row.get(int(i), n) for i in offers["id"]], np.int64)
        offered = np.vstack([np.asarray(descriptor, np.float32).reshape(n, dim), np.full((1, dim), np.nan)])[take]
        score = np.append(np.asarray(fitness, np.float32).reshape(-1), np.nan)[take].astype(np.float32)
        ok = offers["valid"] & np.append(np.asarray(valid, bool).reshape(-1), False)[take]
        self.state = archive.rebuild(
            self.spec, self.islands, offers["island"], offered, score, offers["id"],
            ok, float(self.state.threshold_min), self.learning_rate,
        )
        self._genomes = self._empty_genome_table()
        self._fill_genome_table()
        shape = (self.islands, self.spec.num_cells)
        self.istate = island_ops.init(*shape)._replace(migrant=jnp.asarray(self._migrant_cells(offers)))
        self.curiosity = select.curiosity_init(*shape)  # cells mean something else now
        self._update_stats()
        self._checkpoint()
        return int(np.sum(np.isfinite(offered).all(1) & ok))

    async def counted(self, work: Awaitable[T]) -> T:
        """Awaits ``work`` (a refit, a meta mutation: LLM calls outside any proposal) and
        records the calls it made in the store and the budget, even when it fails."""
        with tally() as calls:
            try:
                return await work
            finally:
                if calls.cells:
                    self.store.add_calls(calls.rows())
                    self.spent.merge(calls)

    def _log(self, event: dict[str, Any]) -> None:
        self._events.write(json.dumps({**event, "time": time.time()}) + "\n")
        self._events.flush()

    # ----- the loop -----------------------------------------------------------

    @property
    def evaluations(self) -> int:
        """Candidates in the store (each evaluated exactly once)."""
        return self._count

    def run(self) -> dict[str, Any]:
        """Runs until a budget is spent, SIGINT/SIGTERM, or a dead LLM; returns the final stats."""
        return asyncio.run(self._run())

    def request_stop(self, reason: str | None = None) -> None:
        self._stop_requested = True
        if reason and self.stop_reason is None:
            self.stop_reason = reason

    async def _run(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
                handled.append(sig)
            except (RuntimeError, ValueError):
                pass  # not the main thread: the caller handles signals
        self._started = time.monotonic() - self.counters["elapsed"]
        self._session_start, self._session_evals = time.monotonic(), self.evaluations
        self._progress = RunProgress(self.budget.max_evaluations, self._progress_enabled)
        self._extra_calls = 0  # gate resamples started and not yet committed
        pending: collections.deque[tuple[asyncio.Future, int, int, bool]] = collections.deque()
        self._pending = pending
        try:
            if self.strategy.cycle is not None and self.strategy.cycle.spec(self._phase()) != self.spec:
                self._rotate()  # replayed insertions after the checkpoint crossed a phase
            while True:
                self._refill(pending)
                if not pending:
                    break
                head, _, island, seeding = pending[0]
                await asyncio.wait([head])
                pending.popleft()
                proposal = head.result()
                if self.in_flight > 1:
                    # Refill first: new proposals run while this one is written (they
                    # sample the archive as it was before it, in every run alike).
                    self._refill(pending, writing=len(proposal.candidates))
                if proposal.fits is not None and proposal.fits != self.counters["fits"]:
                    await self._describe(proposal.candidates)  # described before a refit: redo
                await self._commit(proposal)
                self._seeding[island] -= seeding  # after the commit: its elites are parents now
        finally:
            for fut, *_ in pending:
                fut.cancel()
            if pending:
                await asyncio.gather(*(f for f, *_ in pending), return_exceptions=True)
            for sig in handled:
                loop.remove_signal_handler(sig)
            if self.llm is not None:
                await self.llm.aclose()
            self._checkpoint()
            summary = self.summary()
            self._progress.close(self._status_line("done"))
        return summary

    def _refill(self, pending: collections.deque, writing: int = 0) -> None:
        """Starts proposals until ``in_flight`` run or a budget says stop.

        An empty island gets at most ``initial_population`` seed children in
        flight; later proposals for it wait for a commit that gives it parents
        (so a wide ``in_flight`` does not turn into hundreds of seeds).
        ``writing`` counts finished candidates not yet in the store. The arm is
        chosen here, synchronously, so the choice sequence depends only on the seed.
        """
        while not self._should_stop() and len(pending) < self.in_flight:
            size = self._next_size(self._uncommitted(writing))
            seq = self.counters["proposals"]
            island = seq % self.islands
            seeding = bool(self._stats.num_elites[island] == 0)
            if size == 0 or (seeding and self._seeding[island] >= self._seed_proposals):
                break
            self._seeding[island] += seeding
            self.counters["proposals"] += 1
            self.key, arm_key, seed, *keys = _proposal_keys(self.key)
            b = self._bandit_of(island)
            arm = int(self._bandits[b].choose(self._bandit_states[b], arm_key))
            fut = asyncio.ensure_future(self._propose(island, size, seq, seeding, arm, int(seed), *keys))
            pending.append((fut, size, island, seeding))

    def _uncommitted(self, writing: int = 0) -> int:
        """Candidates started or finished but not yet in the store (budget reservations)."""
        return sum(p[1] for p in self._pending) + writing + self._extra_calls

    def _bandit_of(self, island: int) -> int:
        return island if len(self._bandits) > 1 else 0

    def on_close(self, fn: Any) -> None:
        """Registers ``fn()`` to run at ``close`` (e.g. stopping the embedded LLM server)."""
        self._closers.append(fn)

    def close(self) -> None:
        """Closes the store and the evaluator, then the ``on_close`` callbacks."""
        self._events.close()
        self.store.close()
        close = getattr(self.evaluator, "close", None)
        if close:
            close()
        for fn in self._closers:
            fn()

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _should_stop(self) -> bool:
        b = self.budget
        if self._stop_requested:
            return True
        if self.llm is not None and self.llm.down is not None:
            self.request_stop(self.llm.down)
            return True
        if b.max_seconds is not None and self._elapsed() >= b.max_seconds:
            return True
        if self.llm is not None:
            ledger = self.llm.ledger
            if b.max_tokens is not None and ledger.tokens >= b.max_tokens:
                return True
            if b.max_cost is not None and ledger.cost >= b.max_cost:
                return True
        return False

    def _next_size(self, in_flight_candidates: int) -> int:
        """Children for the next proposal: the batch size, cut to what the budgets leave."""
        size = self.batch_size
        if self.budget.max_evaluations is not None:
            size = min(size, self.budget.max_evaluations - self.evaluations - in_flight_candidates)
        if self.task.kind != "vector":
            size = min(size, self._llm_calls_left(in_flight_candidates) // self._calls_per_child)
        return max(0, size)

    def _llm_calls_left(self, in_flight_candidates: int) -> float:
        """Calls the budget leaves after the committed ones and those reserved for children
        in flight (each child: its operator call, plus a judge call per AI-feedback axis;
        a diff's rewrite fallback is a second child, a refit's judgments count on return)."""
        if self.budget.max_llm_calls is None:
            return math.inf
        return self.budget.max_llm_calls - self.spent.calls - in_flight_candidates * self._calls_per_child

    def _split(self) -> jax.Array:
        self.key, sub = jax.random.split(self.key)
        return sub

    def _parents(self, key: jax.Array, island: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """genome ids i64[n] and cells i64[n] of ``n`` parents drawn by the selection rule."""
        s = self.strategy.selection
        ids, cells = select.parents(self.state, key, island, n, s.parents, curiosity=self.curiosity,
                                    temperature=s.temperature, k=s.k)
        return np.asarray(ids, np.int64), np.asarray(cells, np.int64)

    async def _propose(
        self, island: int, size: int, seq: int, seeding: bool, arm: int, seed: int,
        parent_key: jax.Array, inspire_key: jax.Array, op_key: jax.Array,
    ) -> Proposal:
        """Children of one proposal, evaluated (and described)."""
        op = self.arms[arm].operator
        if self.task.kind != "vector":
            with tally() as calls:
                proposal = await self._propose_text(arm, island, size, seq, seeding, seed, parent_key, inspire_key)
            proposal.calls = calls
            return proposal
        parents = np.full((size, 2), -1, np.int64)
        if seeding:
            # An empty island starts from the task's initial genomes, varied once
            # (as pyribs's emitters start from x0 plus noise).
            initial = self.task.initial(np.random.default_rng(seed), size)
            parent_ids = np.zeros((size, 0), np.int64)
            genomes = np.repeat(np.asarray(initial)[:, None], op.num_parents, axis=1)
            genomes, name = await op(op_key, genomes, {"island": island}), f"init+{op.name}"
        else:
            ids, cells = self._parents(parent_key, island, size * op.num_parents)
            cells, parent_ids = cells.reshape(size, op.num_parents), ids.reshape(size, op.num_parents)
            parents[:] = np.stack([np.full(size, island), cells[:, 0]], 1)
            genomes = await op(op_key, self._genomes[island, cells], {"island": island})
            name = op.name
        ev = await self.evaluator(genomes)
        candidates = [
            Candidate(
                kind="vector", island=island, fitness=float(ev.fitness[j]),
                descriptor=ev.descriptor[j], valid=bool(ev.valid[j]), vector=genomes[j],
                parent_ids=parent_ids[j], operator=name,
                metrics=ev.metrics[j] if ev.metrics else None,
                error=ev.error[j] if ev.error else None,
            )
            for j in range(len(ev.fitness))
        ]
        return Proposal(candidates, None, None if seeding else arm, parents, [None] * len(candidates))

    async def _commit(self, proposal: Proposal) -> None:
        candidates = proposal.candidates
        if not candidates:
            return
        if self.strategy.cycle is not None:
            self._score_cycle(candidates)
        # Committed before it counts; SQLite releases the GIL, so proposals in flight
        # keep running while the batch is written.
        ids = np.asarray(await asyncio.to_thread(self.store.add, candidates, proposal.calls.rows()))
        self._duplicates.remember(candidates)
        self._count += len(ids)
        self._valid_count += sum(c.valid for c in candidates)
        self.spent.merge(proposal.calls)
        self._extra_calls -= proposal.resamples
        island = np.asarray([c.island for c in candidates], np.int32)
        fitness = np.asarray([c.fitness for c in candidates], np.float32)
        valid = np.asarray([c.valid for c in candidates])
        descriptor = np.stack([
            c.descriptor if c.descriptor is not None else np.full(self.spec.descriptor_dim, np.nan, np.float32)
            for c in candidates
        ])
        self.state, result = archive.insert(
            self.spec, self.state, island, descriptor, fitness, ids, valid, self.learning_rate,
        )
        won = np.flatnonzero(np.asarray(result.is_elite))
        cells = np.asarray(result.cell)
        for j in won:
            self._genomes[island[j], cells[j]] = self._elite_entry(candidates[j])
        self.counters["last_id"] = int(ids[-1])
        self.counters["batches"] += 1
        phase = self._phase() if self.strategy.cycle is not None else None
        self.counters["insertions"] += len(candidates)
        credit = self._credit(proposal, result, fitness)
        if self.islands > 1:
            self._record(island, result)
            self._island_dynamics()
        self._update_stats()
        self._write_event(len(candidates), result, credit)
        if phase is not None and self._phase() != phase:
            self._rotate()  # checkpoints
        elif self._fitted and self.describer.needs_fit(self._valid_count):
            await self.counted(self.refit())  # checkpoints
        elif self.counters["batches"] % self.checkpoint_every == 0:
            self._checkpoint()
        if self.meta is not None and self.meta.due() and not self._should_stop() \
                and self._llm_calls_left(self._uncommitted()) >= 2:
            await self._evolve_instructions()  # (2: a hyper-mutation turn makes two calls)

    def _checkpoint(self) -> None:
        self.counters["elapsed"] = self._elapsed()
        if self.meta is not None:
            self.counters["meta"] = self.meta.state_dict()
        arrays = {}
        if self._fitted and self.counters["fits"]:
            arrays.update({f"describer.{k}": v for k, v in self.describer.state_dict().items()})
        for j, state in enumerate(self._bandit_states):
            arrays.update({f"bandit.{j}.{k}": v for k, v in bandit_arrays(state).items()})
        arrays.update({f"islands.{k}": np.asarray(v) for k, v in self.istate._asdict().items()})
        arrays["curiosity.score"] = np.asarray(self.curiosity.score)
        checkpoint.save(self._ckpt_dir, self.state, self.key, self.counters, arrays)

    # ----- reporting ------------------------------------------------------------

    def _update_stats(self) -> None:
        self._stats = jax.device_get(archive.stats(self.state, self.qd_offset))
        if self._union_applies():
            self._union = jax.device_get(archive.union_stats(self.state, self.qd_offset))

    def _union_applies(self) -> bool:
        """Several islands of a cell archive: a cell is the same niche on each."""
        return self.islands > 1 and not isinstance(self.spec, archive.NoveltySpec)

    def summary(self) -> dict[str, Any]:
        s = self._stats
        per_island = [
            {f: float(getattr(s, f)[i]) for f in archive.ArchiveStats._fields}
            for i in range(self.islands)
        ]
        out = {
            "evaluations": self.evaluations,
            "batches": self.counters["batches"],
            "elapsed_s": round(self._elapsed(), 3),
            "global": {f: float(getattr(s, f)[-1]) for f in archive.ArchiveStats._fields},
            "islands": per_island,
        }
        if self._union_applies():  # "global" counts a cell once per island holding it
            out["union"] = {f: float(getattr(self._union, f)[0]) for f in archive.ArchiveStats._fields}
        if self.llm is not None:
            out["llm"] = self.llm.ledger.as_dict()
        if self.describer is not None:
            out["descriptor"] = {"name": self.describer.name, "dim": self.describer.dim, "fits": self.counters["fits"]}
        if self.stop_reason:
            out["stop_reason"] = self.stop_reason
        return out

    def _rate(self) -> float:
        spent = time.monotonic() - self._session_start
        return (self.evaluations - self._session_evals) / spent if spent > 0 else 0.0

    def _status_line(self, prefix: str = "") -> str:
        g = self._stats
        return (
            f"{prefix} evals={self.evaluations} evals/s={self._rate():.3g} "
            f"qd_score={float(g.qd_score[-1]):.4g} coverage={float(g.coverage[-1]):.3f} "
            f"best={float(g.max_fitness[-1]):.4g}{self._llm_status()}"
        ).strip()

    def _llm_status(self) -> str:
        if self.llm is None:
            return ""
        ledger = self.llm.ledger
        t = ledger.total()
        roles = ledger.split("role")
        split = "" if len(roles) < 2 else " (" + " ".join(f"{r}={u.calls}" for r, u in roles.items()) + ")"
        return (
            f" llm_calls={t.calls}{split} failed={t.failed} in_flight={ledger.in_flight} "
            f"tokens={t.tokens_in + t.tokens_out} cost=${t.cost:.4f}"
        )

    def _write_event(self, batch: int, result: archive.InsertResult, credit: dict[str, Any] | None) -> None:
        event = {
            "step": self.counters["batches"],
            "time": time.time(),
            **self.summary(),
            "batch": batch,
            "added": int(np.sum(np.asarray(result.status) > 0)),
            "evals_per_s": round(self._rate(), 2),
            **(credit or {}),
        }
        self._events.write(json.dumps(event) + "\n")
        self._events.flush()
        if self._progress_enabled:
            self._progress.update(self.evaluations, self._status_line())
