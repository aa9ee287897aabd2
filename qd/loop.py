"""The asynchronous steady-state loop: parents -> operator -> evaluate -> store -> insert.

Up to ``in_flight`` proposals run at once; each finished one is written to the
store (committed) and only then inserted into the archive, so a crash never
loses an evaluated candidate. No generation barrier: a slow proposal never
holds back the others.

Durability: every ``checkpoint_every`` insert batches (and on SIGINT/SIGTERM and
at the end) the archive, RNG key and counters are checkpointed atomically. On
start, the loop loads the last checkpoint and replays every store row newer
than it, so after ``kill -9`` each evaluated candidate counts exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from qd import archive, checkpoint
from qd.errors import CheckpointError
from qd.progress import RunProgress
from qd.store import Candidate, Store
from qd.task import Evaluation, Task


@dataclasses.dataclass(frozen=True)
class Budget:
    """The run stops cleanly at the first limit reached (None = no limit)."""

    max_evaluations: int | None = None
    max_seconds: float | None = None


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


@dataclasses.dataclass
class _Proposal:
    island: int
    operator: str
    parent_ids: np.ndarray  # i64[B, k]
    genomes: Any  # f32[B, n] or list[str]
    evaluation: Evaluation


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
        task: initial genomes and evaluator.
        spec: archive tessellation (GridSpec / CVTSpec).
        operators: (operator, weight) pairs; an operator is an async callable
            ``op(key, parents f32[B, k, n], context) -> children`` with ``name``
            and ``num_parents``.
        evaluator: async ``evaluator(genomes) -> Evaluation``.
        run_dir: holds ``store.sqlite``, ``checkpoints/`` and ``events.jsonl``.
    """

    def __init__(
        self,
        *,
        task: Task,
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
    ):
        self.task, self.spec, self.evaluator = task, spec, evaluator
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
        self._events = _open_events(self.run_dir / "events.jsonl")
        self._ckpt_dir = self.run_dir / "checkpoints"
        self._progress_enabled = progress
        self._stop_requested = False

        loaded = checkpoint.load(self._ckpt_dir)
        if loaded is None:
            self.state = archive.init(spec, islands, spec.descriptor_dim, threshold_min)
            self.key = jax.random.key(seed)
            self.counters = {"batches": 0, "last_id": -1, "elapsed": 0.0}
        else:
            self.state, self.key, self.counters = loaded
            if self.state.fitness.shape != (islands, spec.num_cells):
                raise CheckpointError(
                    f"checkpoint in {self._ckpt_dir} holds {self.state.fitness.shape[0]} islands x "
                    f"{self.state.fitness.shape[1]} cells but the config asks for {islands} x "
                    f"{spec.num_cells}; resume with the run's own config.yaml"
                )
        self._count = self.store.count()
        self._genomes = self._empty_genome_table()
        self._replay_store()
        self._fill_genome_table()
        self._stats = jax.device_get(archive.stats(self.state, qd_offset))

    # ----- resume -------------------------------------------------------------

    def _replay_store(self) -> None:
        """Inserts every store row (and migration) newer than the checkpoint."""
        offers = self.store.placements(self.counters["last_id"], self.spec.descriptor_dim)
        if len(offers["id"]):
            self.state, _ = archive.insert(
                self.spec, self.state, offers["island"], offers["descriptor"],
                offers["fitness"], offers["id"], offers["valid"], self.learning_rate,
            )
            self.counters["last_id"] = self.store.last_id()
            self.counters["batches"] += 1

    def _empty_genome_table(self) -> np.ndarray:
        """Host table of each elite's genome, [I, C, n] floats or [I, C] objects."""
        shape = (self.islands, self.spec.num_cells)
        if self.task.kind == "vector":
            return np.zeros((*shape, self.task.genome_dim), np.float32)
        return np.empty(shape, object)

    def _fill_genome_table(self) -> None:
        ids = np.asarray(self.state.genome_id)
        island, cell = np.nonzero(ids >= 0)
        if len(island):
            for i, c, cand in zip(island, cell, self.store.get(ids[island, cell])):
                self._genomes[i, c] = cand.genome

    # ----- the loop -----------------------------------------------------------

    @property
    def evaluations(self) -> int:
        """Candidates in the store (each evaluated exactly once)."""
        return self._count

    def run(self) -> dict[str, Any]:
        """Runs until a budget is spent or SIGINT/SIGTERM; returns the final stats."""
        return asyncio.run(self._run())

    def request_stop(self) -> None:
        self._stop_requested = True

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
        pending: dict[asyncio.Future, int] = {}
        island_cycle = 0
        try:
            while True:
                island_cycle = self._refill(pending, island_cycle)
                if not pending:
                    break
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    del pending[fut]
                results = [fut.result() for fut in done]
                if self.in_flight > 1:
                    # Refill first: new proposals run while this batch is written
                    # (they sample the archive as it was before this batch).
                    writing = sum(len(r.evaluation.fitness) for r in results)
                    island_cycle = self._refill(pending, island_cycle, writing)
                await self._commit(results)
        finally:
            for fut in pending:
                fut.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for sig in handled:
                loop.remove_signal_handler(sig)
            self._checkpoint()
            summary = self.summary()
            self._progress.close(self._status_line("done"))
        return summary

    def _refill(self, pending: dict[asyncio.Future, int], island_cycle: int, writing: int = 0) -> int:
        """Starts proposals until ``in_flight`` run or a budget says stop.

        ``writing`` counts finished candidates not yet in the store.
        """
        while not self._should_stop() and len(pending) < self.in_flight:
            size = self._next_size(sum(pending.values()) + writing)
            if size == 0:
                break
            fut = asyncio.ensure_future(self._propose(island_cycle % self.islands, size))
            pending[fut] = size
            island_cycle += 1
        return island_cycle

    def close(self) -> None:
        self._events.close()
        self.store.close()
        close = getattr(self.evaluator, "close", None)
        if close:
            close()

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _should_stop(self) -> bool:
        if self._stop_requested:
            return True
        return self.budget.max_seconds is not None and self._elapsed() >= self.budget.max_seconds

    def _next_size(self, in_flight_candidates: int) -> int:
        if self.budget.max_evaluations is None:
            return self.batch_size
        left = self.budget.max_evaluations - self.evaluations - in_flight_candidates
        return max(0, min(self.batch_size, left))

    def _split(self) -> jax.Array:
        self.key, sub = jax.random.split(self.key)
        return sub

    async def _propose(self, island: int, size: int) -> _Proposal:
        self.key, choice, seed, sample_key, op_key = _proposal_keys(self.key, self._log_weights)
        op = self.operators[int(choice)]
        if self._stats.num_elites[island] == 0:
            # An empty island starts from the task's initial genomes; vector genomes
            # are varied once (as pyribs's emitters start from x0 plus noise).
            initial = self.task.initial(np.random.default_rng(int(seed)), size)
            parent_ids = np.zeros((size, 0), np.int64)
            if self.task.kind != "vector":
                genomes, name = initial, "init"
            else:
                parents = np.repeat(np.asarray(initial)[:, None], op.num_parents, axis=1)
                genomes, name = await op(op_key, parents, {"island": island}), f"init+{op.name}"
        else:
            ids, cells = archive.sample(self.state, sample_key, island, size * op.num_parents)
            cells = np.asarray(cells).reshape(size, op.num_parents)
            parent_ids = np.asarray(ids, np.int64).reshape(size, op.num_parents)
            parents = self._genomes[island, cells]
            genomes = await op(op_key, parents, {"island": island})
            name = op.name
        evaluation = await self.evaluator(genomes)
        return _Proposal(island, name, parent_ids, genomes, evaluation)

    async def _commit(self, proposals: list[_Proposal]) -> None:
        candidates: list[Candidate] = []
        for p in proposals:
            ev = p.evaluation
            for j in range(len(ev.fitness)):
                genome = p.genomes[j]
                vector = genome if self.task.kind == "vector" else None
                candidates.append(Candidate(
                    kind=self.task.kind, island=p.island, fitness=float(ev.fitness[j]),
                    descriptor=ev.descriptor[j], valid=bool(ev.valid[j]),
                    vector=vector, text=None if vector is not None else genome,
                    parent_ids=p.parent_ids[j], operator=p.operator,
                    metrics=ev.metrics[j] if ev.metrics else None,
                    error=ev.error[j] if ev.error else None,
                ))
        if not candidates:
            return
        # Committed before it counts; SQLite releases the GIL, so proposals in flight
        # keep running while the batch is written.
        ids = np.asarray(await asyncio.to_thread(self.store.add, candidates))
        self._count += len(ids)
        island = np.asarray([c.island for c in candidates], np.int32)
        self.state, result = archive.insert(
            self.spec, self.state, island,
            np.stack([c.descriptor for c in candidates]),
            np.asarray([c.fitness for c in candidates], np.float32), ids,
            np.asarray([c.valid for c in candidates]), self.learning_rate,
        )
        won = np.flatnonzero(np.asarray(result.is_elite))
        cells = np.asarray(result.cell)
        for j in won:
            self._genomes[island[j], cells[j]] = candidates[j].genome
        self.counters["last_id"] = int(ids[-1])
        self.counters["batches"] += 1
        if self.migration.every and self.counters["batches"] % self.migration.every == 0:
            self._migrate()
        self._stats = jax.device_get(archive.stats(self.state, self.qd_offset))
        self._write_event(len(candidates), result)
        if self.counters["batches"] % self.checkpoint_every == 0:
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
        checkpoint.save(self._ckpt_dir, self.state, self.key, self.counters)

    # ----- reporting ------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        s = self._stats
        per_island = [
            {f: float(getattr(s, f)[i]) for f in archive.ArchiveStats._fields}
            for i in range(self.islands)
        ]
        return {
            "evaluations": self.evaluations,
            "batches": self.counters["batches"],
            "elapsed_s": round(self._elapsed(), 3),
            "global": {f: float(getattr(s, f)[-1]) for f in archive.ArchiveStats._fields},
            "islands": per_island,
        }

    def _rate(self) -> float:
        spent = time.monotonic() - self._session_start
        return (self.evaluations - self._session_evals) / spent if spent > 0 else 0.0

    def _status_line(self, prefix: str = "") -> str:
        g = self._stats
        return (
            f"{prefix} evals={self.evaluations} evals/s={self._rate():.0f} "
            f"qd_score={float(g.qd_score[-1]):.4g} coverage={float(g.coverage[-1]):.3f} "
            f"best={float(g.max_fitness[-1]):.4g}"
        ).strip()

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
