"""The device loop's driver: calls of K fused generations, a checkpoint after each.

Durability comes from determinism, not from writing every candidate: a call is a
pure function of the checkpointed state (archive, genomes, key, counters), and
the calls' boundaries are fixed by the run's start (generation multiples of
``generations_per_call``), so a run killed anywhere resumes from its last
checkpoint and recomputes exactly what was lost; the final archive is
bit-identical to an uninterrupted run on the same backend.

After each call, in this order, on a writer thread while the next call computes:
the store gets the rows it keeps (``elites``: the archive's elites it does not
hold yet; ``all``: every candidate of the call), then the checkpoint is written,
then the ``commit`` event. Rows are written only above the store's last id, and
ids are evaluation numbers, so a call recomputed after a crash never writes a
row twice. An elite that entered and left within one call is never in an
elites-only store: that store holds what the archive held at each checkpoint,
which is what it says.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from qd.archive.pareto import ParetoSpec
from qd.device.record import LOOP, DeviceRecord, HostState
from qd.device.step import Candidates, DeviceLoop, DeviceOperator, DeviceState, Migration, device_loop
from qd.events import EventLog
from qd.progress import RunProgress, Status
from qd.report import Report
from qd.rundir import layout
from qd.task import objectives_of

NO_LIMIT = 2**31 - 1  # evaluation numbers are int32


class DeviceEngine:
    """Runs a device loop until its budget is spent or a signal asks it to stop.

    Args:
        loop: the ``init``/``run`` of ``qd.device.step.device_loop``.
        founders: initial genomes per island (the first generation's candidates on each).
        record: the run's store and checkpoints (``qd.device.record.DeviceRecord``); closed
            with the engine.
        run_dir: where the ``commit`` events go (``events.jsonl``).
        generations_per_call: K, generations per jitted call; a checkpoint after each.
    """

    def __init__(
        self,
        *,
        loop: DeviceLoop,
        founders: int,
        record: DeviceRecord,
        run_dir: Path,
        islands: int,
        batch_size: int,
        generations_per_call: int,
        budget: Any,
        seed: int,
        qd_offset: float = 0.0,
        progress: bool = True,
        on_commit: Callable[[dict], Any] | None = None,
    ):
        self.loop, self.founders, self.record = loop, founders, record
        self.islands, self.batch_size, self.per_call = islands, batch_size, generations_per_call
        self.budget, self.seed = budget, seed
        self.on_commit, self._progress_enabled = on_commit, progress
        self.events = EventLog(Path(run_dir) / layout.EVENTS)
        self.report = Report(islands, qd_offset, union=islands > 1, budget=budget)
        self.stop_reason: str | None = None
        self._stop, self._closers, self._elapsed0 = False, [], 0.0
        self._started = time.monotonic()
        self.state = self._resume()
        self.report.refresh(self.state.archive)

    # ----- budget ---------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        return int(self.state.evaluations)

    def total_generations(self) -> int | None:
        """The founders' generation and the generations after it that ``max_evaluations``
        needs, the last possibly partial (None: no limit)."""
        if self.budget.max_evaluations is None:
            return None
        left = max(0, self.budget.max_evaluations - self.islands * self.founders)
        return 1 + -(-left // self.batch_size)

    def _next_call(self) -> int:
        """Generations of the next call: up to the next multiple of K (the same boundaries on
        every replay). Every call is a scan of K; a shorter one masks the rest."""
        done = int(self.state.generations)
        k = self.per_call - done % self.per_call
        total = self.total_generations()
        return k if total is None else max(0, min(k, total - done))

    def _elapsed(self) -> float:
        return self._elapsed0 + time.monotonic() - self._started

    # ----- the loop -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Calls the fused step until the budget is spent (or SIGINT/SIGTERM); returns the summary.

        Each call's writes (store rows, checkpoint, event) run on a writer thread while the
        next call computes: XLA releases the GIL, so the device (or the XLA:CPU threads) is
        not idle while SQLite and fsync work. One write is in flight at a time, in call
        order; ``on_commit`` and the progress line follow on this thread when it is done.
        """
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, self._request_stop)
            except ValueError:
                pass  # not the main thread: the caller handles signals
        self._elapsed0, self._started = self._elapsed(), time.monotonic()
        self.report.start_session(self.evaluations)
        progress = RunProgress(self._progress_enabled)
        limit = NO_LIMIT if self.budget.max_evaluations is None else self.budget.max_evaluations
        writing = None
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="qd-device-writer") as writer:
                while not self._stop and not self._out_of_time():
                    k = self._next_call()
                    if k == 0:
                        break
                    self.state, counts, candidates = self.loop.run(
                        self.state, k, limit, self.per_call, self.record.keep_all
                    )
                    written = writer.submit(
                        self._write,
                        self._snapshot(),
                        k,
                        int(counts.added),
                        None if candidates is None else jax.device_get(candidates),
                    )
                    if writing is not None:
                        self._written(writing.result(), progress)
                    writing = written
                if writing is not None:
                    self._written(writing.result(), progress)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            summary = self.summary()
            progress.close(self.report.status(self.evaluations, self._elapsed(), "done"))
        return summary

    def _out_of_time(self) -> bool:
        return self.budget.max_seconds is not None and self._elapsed() >= self.budget.max_seconds

    def _request_stop(self, *_: Any) -> None:
        self._stop = True

    def _snapshot(self) -> HostState:
        """The state on the host (the next call donates the device buffers), key as raw data."""
        s = self.state
        return HostState(jax.device_get(s._replace(key=jax.random.key_data(s.key))), self._elapsed())

    def _write(
        self, snap: HostState, generations: int, added: int, candidates: Candidates | None
    ) -> tuple[dict, Status]:
        """Store rows, then the checkpoint, then the event (the module doc says why in this
        order); returns the event and the progress status (the report is the writer's)."""
        self.record.add_rows(snap.state, candidates)
        self.record.save(snap)
        self.report.refresh(snap.state.archive)
        evaluations, done = int(snap.state.evaluations), int(snap.state.generations)
        event = self.events.write(
            "commit",
            {
                "step": done,
                **self._summary(snap.state, snap.elapsed),
                "batch": generations * self.batch_size,
                "added": added,
                "evals_per_s": round(self.report.rate(evaluations), 3),
            },
        )
        return event, self.report.status(evaluations, snap.elapsed)

    def _written(self, written: tuple[dict, Status], progress: RunProgress) -> None:
        event, status = written
        progress.update(status)
        if self.on_commit is not None:
            self.on_commit(event)

    def summary(self) -> dict[str, Any]:
        return self._summary(self.state, self._elapsed())

    def _summary(self, state: DeviceState, elapsed: float) -> dict[str, Any]:
        """The report's summary of ``state`` (batches are generations), marked as this loop's."""
        out = self.report.summary(
            int(state.evaluations), int(state.generations), elapsed, 0, self.stop_reason
        )
        return {**out, "loop": LOOP}

    # ----- durability -----------------------------------------------------------

    def _resume(self) -> DeviceState:
        """The checkpointed state (the store given the elites a crash kept from it), or a new run's."""
        loaded = self.record.load()
        if loaded is None:
            return self.loop.init(self.seed)
        self.state, self._elapsed0 = loaded
        self.record.add_rows(self._snapshot().state, None)
        return self.state

    # ----- closing --------------------------------------------------------------

    def on_close(self, fn: Callable[[], Any]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        self.events.close()
        self.record.close()
        for fn in self._closers:
            fn()


def migration_every(migrate_every: int, per_island: int) -> int:
    """Generations between migrations: ``islands.migrate_every`` counts insertions an
    island receives, and each generation gives every island ``per_island``."""
    return 0 if migrate_every == 0 else max(1, math.ceil(migrate_every / per_island))


def build(
    p: Any,
    spec: Any,
    operators: list[tuple[Any, float]],
    run_dir: Path,
    on_commit: Callable[[dict], Any] | None = None,
) -> DeviceEngine:
    """The device run of plan ``p`` (``qd.plan.Plan`` with ``loop == "device"``).

    ``operators``: (numeric operator, weight) per ``operators.mix`` entry, built
    with the task's genome bounds. The first generation is the task's
    ``initial(rng(seed), runner.initial_population)`` on every island.
    """
    cfg, r = p.cfg, p.cfg.runner
    islands, per_island = cfg.islands.count, r.batch_size // cfg.islands.count
    migrate = migration_every(cfg.islands.migrate_every, per_island)
    initial = np.asarray(p.task.initial(np.random.default_rng(cfg.seed), r.initial_population), np.float32)
    fronts = isinstance(spec, ParetoSpec)
    loop = device_loop(
        spec,
        p.task.objectives_jax if fronts else p.task.evaluate_jax,
        [DeviceOperator(op.draw, op.apply, op.num_parents, op.params, float(w)) for op, w in operators],
        islands,
        per_island,
        p.task.genome_dim,
        initial,
        Migration(migrate, cfg.islands.topology, cfg.islands.migrants) if migrate and islands > 1 else None,
    )
    record = DeviceRecord(
        run_dir,
        p.store,
        operators[0][0].name if len(operators) == 1 else None,
        objectives_of(p.task) if fronts else None,
    )
    return DeviceEngine(
        loop=loop,
        founders=min(len(initial), per_island),
        record=record,
        run_dir=run_dir,
        islands=islands,
        batch_size=r.batch_size,
        generations_per_call=r.generations_per_call,
        budget=p.budget,
        seed=cfg.seed,
        qd_offset=cfg.archive.qd_offset,
        progress=r.progress,
        on_commit=on_commit,
    )
