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
sandbox; a dead LLM (``LLMError`` after retries) stops the run cleanly, keeping
everything already evaluated. A ``describer`` (see ``descriptors.base``) may
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
from pathlib import Path
from typing import Any

import jax
import numpy as np

from descriptors.base import Item, is_fitted_kind
from qd import archive, checkpoint
from qd.errors import CheckpointError
from qd.llm import LLMError
from qd.progress import RunProgress
from qd.store import Candidate, Store


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


@dataclasses.dataclass(frozen=True)
class Migration:
    every: int = 0  # insert batches between migrations; 0 = never
    topology: str = "ring"
    migrants: int = 1


@jax.jit
def _proposal_keys(key: jax.Array, log_weights: jax.Array) -> tuple[jax.Array, ...]:
    """One dispatch for all of a proposal's randomness: next key, operator index,
    a seed for the task's initial genomes, and keys for sampling and the operator."""
    key, choice_key, seed_key, sample_key, op_key = jax.random.split(key, 5)
    choice = jax.random.categorical(choice_key, log_weights)
    seed = jax.random.randint(seed_key, (), 0, 2**31 - 1)
    return key, choice, seed, sample_key, op_key


@dataclasses.dataclass(frozen=True)
class _Seed:
    """A task's initial text genome, in the shape of an LLM operator's child."""

    text: str
    error: None = None
    operator: str = "init"
    model: None = None
    prompt: None = None
    response: None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


def _parent(candidate: Candidate) -> Any:
    """An elite as an LLM operator shows it: code, score, metrics and evaluator feedback."""
    from operators.llm import Parent

    notes = [f"error: {candidate.error}"] if candidate.error else []
    for name, value in (candidate.artifacts or {}).items():
        notes.append(f"{name}:\n{value}")
    return Parent(candidate.id, candidate.text, candidate.fitness, candidate.metrics, "\n".join(notes) or None)


def _open_events(path: Path):
    """Opens events.jsonl for appending, dropping a line torn by a crash."""
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])
    return open(path, "a")


class Engine:
    """One run: a task, an archive spec, operators, and a run directory.

    Args:
        task: initial genomes and evaluator (a numeric ``Task`` or a ``TextTask``).
        spec: archive tessellation (GridSpec / CVTSpec).
        operators: (operator, weight) pairs. A numeric operator is an async callable
            ``op(key, parents f32[B, k, n], context) -> f32[B, n]``; an LLM operator
            is ``op(parents, inspirations, context) -> list[Child]`` (parents and
            inspirations are store ``Candidate``s). Both have ``name`` and
            ``num_parents``; LLM ones also ``num_inspirations``.
        evaluator: async ``evaluator(genomes) -> Evaluation``.
        run_dir: holds ``store.sqlite``, ``checkpoints/`` and ``events.jsonl``.
        llm: the run's ``qd.llm.LLMClient`` (text tasks); its ledger feeds the
            LLM budgets and the progress line and is checkpointed.
        initial_population: seed children in flight at most per empty island
            (rounded up to whole proposals of ``batch_size``).
        describer: a ``descriptors.base.Descriptor`` placing text candidates (None:
            the task's own descriptors). Its ``dim`` must match ``spec``.
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
        migration: Migration = Migration(),
        progress: bool = True,
        llm: Any = None,
        initial_population: int = 8,
        describer: Any = None,
    ):
        self.task, self.spec, self.evaluator, self.llm = task, spec, evaluator, llm
        self.describer, self.seed = describer, seed
        self._fitted = describer is not None and is_fitted_kind(describer)
        self._closers: list[Any] = []
        self._seed_proposals = max(1, -(-initial_population // batch_size))
        self._seeding = np.zeros(islands, np.int64)  # seed proposals in flight per island
        self.operators = [op for op, _ in operators]
        weights = np.asarray([w for _, w in operators], np.float64)
        if len(weights) == 0 or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError("operators.mix: need at least one operator with a positive weight")
        self._log_weights = np.log(weights / weights.sum()).astype(np.float32)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.islands, self.batch_size, self.in_flight = islands, batch_size, in_flight
        self.budget, self.checkpoint_every = budget, checkpoint_every
        self.learning_rate, self.qd_offset, self.migration = learning_rate, qd_offset, migration
        self.store = Store(self.run_dir / "store.sqlite")
        if callable(getattr(describer, "attach", None)):
            describer.attach(self.store, llm)
        self._events = _open_events(self.run_dir / "events.jsonl")
        self._ckpt_dir = self.run_dir / "checkpoints"
        self._progress_enabled = progress
        self._stop_requested = False
        self.stop_reason: str | None = None  # set when the run stops on an error

        loaded = checkpoint.load(self._ckpt_dir)
        if loaded is None:
            self.state = archive.init(spec, islands, spec.descriptor_dim, threshold_min)
            self.key = jax.random.key(seed)
            self.counters = {
                "batches": 0, "last_id": -1, "elapsed": 0.0, "proposals": 0, "llm_calls": 0, "fits": 0,
            }
        else:
            self.state, self.key, self.counters = loaded
            for name in ("proposals", "llm_calls", "fits"):
                self.counters.setdefault(name, 0)
            if self._fitted and self.counters["fits"]:
                describer.load_state_dict(checkpoint.load_arrays(self._ckpt_dir))
                self._use_describer_cells()
            if self.state.fitness.shape != (islands, spec.num_cells):
                raise CheckpointError(
                    f"checkpoint in {self._ckpt_dir} holds {self.state.fitness.shape[0]} islands x "
                    f"{self.state.fitness.shape[1]} cells but the config asks for {islands} x "
                    f"{spec.num_cells}; resume with the run's own config.yaml"
                )
        self._count = self.store.count()
        self._valid_count = self.store.count(valid=True)
        self._genomes = self._empty_genome_table()
        self._replay_store()
        self._fill_genome_table()
        self._stats = jax.device_get(archive.stats(self.state, qd_offset))

    # ----- resume -------------------------------------------------------------

    def _replay_store(self) -> None:
        """Inserts every store row (and migration) newer than the checkpoint."""
        after = self.counters["last_id"]
        if self.llm is not None:
            self.llm.ledger.restore(self.counters.get("llm") or {})
            usage = self.store.llm_usage(after)
            self.counters["llm_calls"] += usage["calls"]
            ledger = self.llm.ledger  # calls made after the checkpoint, as stored
            ledger.calls += usage["calls"]
            ledger.tokens_in += usage["tokens_in"]
            ledger.tokens_out += usage["tokens_out"]
            ledger.cost += usage["cost"]
        offers = self.store.placements(after, self.spec.descriptor_dim)
        if len(offers["id"]):
            self.state, _ = archive.insert(
                self.spec, self.state, offers["island"], offers["descriptor"],
                offers["fitness"], offers["id"], offers["valid"], self.learning_rate,
            )
            self.counters["last_id"] = self.store.last_id()
            self.counters["batches"] += 1

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
        stored = [c for c in self.store.iter() if c.valid and c.text is not None]
        items = [Item(c.text, c.fitness, c.metrics, c.id) for c in stored]
        await self.describer.fit(items, np.random.default_rng([self.seed, self.counters["fits"]]))
        self.counters["fits"] += 1
        self._use_describer_cells()
        out = await self.describer.describe(items)
        row = {c.id: j for j, c in enumerate(stored)}
        offers = self.store.placements(-1, self.spec.descriptor_dim)
        at = np.asarray([row.get(int(i), -1) for i in offers["id"]], np.int64)
        known = at >= 0
        values = np.asarray(out.values, np.float32).reshape(len(items), self.spec.descriptor_dim)
        descriptor = np.full((len(at), self.spec.descriptor_dim), np.nan, np.float32)
        descriptor[known] = values[at[known]]
        valid = offers["valid"] & known & np.asarray(out.valid, bool)[np.maximum(at, 0)]
        self.state = archive.rebuild(
            self.spec, self.islands, offers["island"], descriptor, offers["fitness"], offers["id"],
            valid, float(self.state.threshold_min), self.learning_rate,
        )
        self._genomes = self._empty_genome_table()
        self._fill_genome_table()
        self._stats = jax.device_get(archive.stats(self.state, self.qd_offset))
        self._checkpoint()
        event = {
            "event": "refit", "time": time.time(), "fits": self.counters["fits"],
            "candidates": len(items), "placed": int(np.sum(np.isfinite(descriptor).all(1) & valid)),
            "elites": int(self._stats.num_elites[-1]), "seconds": round(time.monotonic() - started, 3),
        }
        self._events.write(json.dumps(event) + "\n")
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
        pending: collections.deque[tuple[asyncio.Future, int]] = collections.deque()
        try:
            while True:
                self._refill(pending)
                if not pending:
                    break
                head, _, island, seeding = pending[0]
                await asyncio.wait([head])
                pending.popleft()
                candidates, fits = head.result()
                if self.in_flight > 1:
                    # Refill first: new proposals run while this one is written (they
                    # sample the archive as it was before it, in every run alike).
                    self._refill(pending, writing=len(candidates))
                if fits is not None and fits != self.counters["fits"]:
                    await self._describe(candidates)  # described before a refit: redo
                await self._commit(candidates)
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
        ``writing`` counts finished candidates not yet in the store.
        """
        while not self._should_stop() and len(pending) < self.in_flight:
            size = self._next_size(sum(p[1] for p in pending) + writing)
            seq = self.counters["proposals"]
            island = seq % self.islands
            seeding = bool(self._stats.num_elites[island] == 0)
            if size == 0 or (seeding and self._seeding[island] >= self._seed_proposals):
                break
            self._seeding[island] += seeding
            self.counters["proposals"] += 1
            fut = asyncio.ensure_future(self._propose(island, size, seq, seeding))
            pending.append((fut, size, island, seeding))

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
        if b.max_seconds is not None and self._elapsed() >= b.max_seconds:
            return True
        if self.llm is not None:
            ledger = self.llm.ledger
            if b.max_tokens is not None and ledger.tokens_in + ledger.tokens_out >= b.max_tokens:
                return True
            if b.max_cost is not None and ledger.cost >= b.max_cost:
                return True
        return False

    def _next_size(self, in_flight_candidates: int) -> int:
        """Children for the next proposal: the batch size, cut to what the budgets leave."""
        size = self.batch_size
        if self.budget.max_evaluations is not None:
            size = min(size, self.budget.max_evaluations - self.evaluations - in_flight_candidates)
        if self.budget.max_llm_calls is not None and self.task.kind != "vector":
            # Each LLM child is one call (a diff's rewrite fallback is a second child).
            left = self.budget.max_llm_calls - self.counters["llm_calls"] - in_flight_candidates
            size = min(size, left)
        return max(0, size)

    def _split(self) -> jax.Array:
        self.key, sub = jax.random.split(self.key)
        return sub

    async def _propose(
        self, island: int, size: int, seq: int, seeding: bool
    ) -> tuple[list[Candidate], int | None]:
        """Children of one proposal, evaluated (and described), with the describer's
        fit count they were described under (None if no fitted describer)."""
        self.key, choice, seed, sample_key, op_key = _proposal_keys(self.key, self._log_weights)
        op = self.operators[int(choice)]
        if self.task.kind != "vector":
            return await self._propose_text(op, island, size, seq, seeding, int(seed), sample_key)
        if seeding:
            # An empty island starts from the task's initial genomes, varied once
            # (as pyribs's emitters start from x0 plus noise).
            initial = self.task.initial(np.random.default_rng(int(seed)), size)
            parent_ids = np.zeros((size, 0), np.int64)
            parents = np.repeat(np.asarray(initial)[:, None], op.num_parents, axis=1)
            genomes, name = await op(op_key, parents, {"island": island}), f"init+{op.name}"
        else:
            ids, cells = archive.sample(self.state, sample_key, island, size * op.num_parents)
            cells = np.asarray(cells).reshape(size, op.num_parents)
            parent_ids = np.asarray(ids, np.int64).reshape(size, op.num_parents)
            genomes = await op(op_key, self._genomes[island, cells], {"island": island})
            name = op.name
        ev = await self.evaluator(genomes)
        return [
            Candidate(
                kind="vector", island=island, fitness=float(ev.fitness[j]),
                descriptor=ev.descriptor[j], valid=bool(ev.valid[j]), vector=genomes[j],
                parent_ids=parent_ids[j], operator=name,
                metrics=ev.metrics[j] if ev.metrics else None,
                error=ev.error[j] if ev.error else None,
            )
            for j in range(len(ev.fitness))
        ], None

    async def _propose_text(
        self, op: Any, island: int, size: int, seq: int, seeding: bool, seed: int, sample_key: jax.Array
    ) -> tuple[list[Candidate], int | None]:
        """LLM children of sampled elites (or the task's seeds on an empty island), evaluated."""
        if seeding:
            texts = self.task.initial(np.random.default_rng(seed), size)
            children = [_Seed(text) for text in texts]
            parent_ids: list[list[int]] = [[] for _ in texts]
        else:
            children, parent_ids = await self._llm_children(op, island, size, seq, seed, sample_key)
        usable = [j for j, c in enumerate(children) if c.text is not None]
        ev = await self.evaluator([children[j].text for j in usable]) if usable else None
        at = {j: k for k, j in enumerate(usable)}
        out = []
        for j, child in enumerate(children):
            k = at.get(j)
            fields = dict(fitness=math.nan, descriptor=None, valid=False, error=child.error)
            if k is not None:
                fields = dict(
                    fitness=float(ev.fitness[k]), descriptor=ev.descriptor[k], valid=bool(ev.valid[k]),
                    metrics=ev.metrics[k], error=ev.error[k], artifacts=ev.artifacts[k],
                    eval_seconds=ev.seconds[k],
                )
            out.append(Candidate(
                kind="text", island=island, text=child.text, parent_ids=parent_ids[j],
                operator=child.operator, model=child.model, prompt=child.prompt,
                response=child.response, tokens_in=child.tokens_in, tokens_out=child.tokens_out,
                cost=child.cost, **fields,
            ))
        fits = self.counters["fits"]
        if self.describer is not None:
            await self._describe(out)
        return out, fits if self._fitted else None

    async def _llm_children(
        self, op: Any, island: int, size: int, seq: int, seed: int, sample_key: jax.Array
    ) -> tuple[list[Any], list[list[int]]]:
        """One operator call per child, all at once; a dead LLM stops the run."""
        per_child = op.num_parents + op.num_inspirations
        _, cells = archive.sample(self.state, sample_key, island, size * per_child)
        cells = np.asarray(cells).reshape(size, per_child)
        calls, chosen = [], []
        for j in range(size):
            elites = [_parent(self._genomes[island, c]) for c in cells[j]]
            chosen.append([int(p.id) for p in elites[: op.num_parents]])  # before a refit can move them
            context = self.prompt_context(
                island=island, sample_index=seq * self.batch_size + j,
                rng=np.random.default_rng([seed, j]),
            )
            calls.append(op(elites[: op.num_parents], elites[op.num_parents:], context))
        results = await asyncio.gather(*calls, return_exceptions=True)
        children, parent_ids = [], []
        for j, result in enumerate(results):
            if isinstance(result, LLMError):
                self.request_stop(str(result))
                continue
            if isinstance(result, BaseException):
                raise result
            for child in result:
                children.append(child)
                parent_ids.append(chosen[j])
        return children, parent_ids

    def prompt_context(self, **fields: Any) -> Any:
        """What an LLM operator is told about the task besides its parents."""
        from operators.llm import PromptContext

        return PromptContext(task=self.task.description, language=self.task.language, **fields)


    async def _commit(self, candidates: list[Candidate]) -> None:
        if not candidates:
            return
        # Committed before it counts; SQLite releases the GIL, so proposals in flight
        # keep running while the batch is written.
        ids = np.asarray(await asyncio.to_thread(self.store.add, candidates))
        self._count += len(ids)
        self._valid_count += sum(c.valid for c in candidates)
        self.counters["llm_calls"] += sum(c.model is not None for c in candidates)
        island = np.asarray([c.island for c in candidates], np.int32)
        descriptor = np.stack([
            c.descriptor if c.descriptor is not None else np.full(self.spec.descriptor_dim, np.nan, np.float32)
            for c in candidates
        ])
        self.state, result = archive.insert(
            self.spec, self.state, island, descriptor,
            np.asarray([c.fitness for c in candidates], np.float32), ids,
            np.asarray([c.valid for c in candidates]), self.learning_rate,
        )
        won = np.flatnonzero(np.asarray(result.is_elite))
        cells = np.asarray(result.cell)
        for j in won:
            self._genomes[island[j], cells[j]] = self._elite_entry(candidates[j])
        self.counters["last_id"] = int(ids[-1])
        self.counters["batches"] += 1
        if self.migration.every and self.counters["batches"] % self.migration.every == 0:
            self._migrate()
        self._stats = jax.device_get(archive.stats(self.state, self.qd_offset))
        self._write_event(len(candidates), result)
        if self._fitted and self.describer.needs_fit(self._valid_count):
            await self.refit()  # checkpoints
        elif self.counters["batches"] % self.checkpoint_every == 0:
            self._checkpoint()

    def _migrate(self) -> None:
        m = archive.select_migrants(
            self.state, self._split(), self.migration.topology, self.migration.migrants
        )
        valid = np.asarray(m.valid)
        self.store.add_migrations(
            self.counters["last_id"], np.asarray(m.genome_id)[valid], np.asarray(m.island)[valid]
        )
        genomes = self._genomes[np.asarray(m.source_island), np.asarray(m.source_cell)]
        self.state, result = archive.insert(
            self.spec, self.state, m.island, m.descriptor, m.fitness, m.genome_id, m.valid,
            self.learning_rate,
        )
        target, cells = np.asarray(m.island), np.asarray(result.cell)
        for j in np.flatnonzero(np.asarray(result.is_elite)):
            self._genomes[target[j], cells[j]] = genomes[j]

    def _checkpoint(self) -> None:
        self.counters["elapsed"] = self._elapsed()
        if self.llm is not None:
            self.counters["llm"] = self.llm.ledger.as_dict()
        arrays = self.describer.state_dict() if self._fitted and self.counters["fits"] else None
        checkpoint.save(self._ckpt_dir, self.state, self.key, self.counters, arrays)

    # ----- reporting ------------------------------------------------------------

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
        return (
            f" llm_calls={ledger.calls} in_flight={ledger.in_flight} "
            f"tokens={ledger.tokens_in + ledger.tokens_out} cost=${ledger.cost:.4f}"
        )

    def _write_event(self, batch: int, result: archive.InsertResult) -> None:
        event = {
            "step": self.counters["batches"],
            "time": time.time(),
            **self.summary(),
            "batch": batch,
            "added": int(np.sum(np.asarray(result.status) > 0)),
            "evals_per_s": round(self._rate(), 2),
        }
        self._events.write(json.dumps(event) + "\n")
        self._events.flush()
        if self._progress_enabled:
            self._progress.update(self.evaluations, self._status_line())
