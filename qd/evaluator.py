"""Running a task's evaluator: in the loop's process, in a pool of worker processes,
or (for untrusted text candidates) in the sandbox."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
from typing import Any

import numpy as np

from qd import lifeline
from qd.task import Evaluation, Scored, Task, TextTask, load_task

_WORKER_TASK: Task | None = None


def _init_worker(name: str, params: dict[str, Any], parent: int) -> None:
    global _WORKER_TASK
    # Die with the parent however it dies (SIGKILL included): a worker blocked on the call
    # queue never sees EOF, as every worker holds a copy of its write end.
    lifeline.watch_parent(parent)
    _WORKER_TASK = load_task(name, params)


def _evaluate_in_worker(genomes: Any) -> Evaluation:
    return _WORKER_TASK.evaluate(genomes)


class InProcessEvaluator:
    """Calls ``task.evaluate`` directly: best for cheap vectorized numeric tasks."""

    def __init__(self, task: Task):
        self.task = task

    async def __call__(self, genomes: Any) -> Evaluation:
        return self.task.evaluate(genomes)

    def close(self) -> None:
        pass


class PoolEvaluator:
    """Splits each batch over ``workers`` spawned processes that each load the task once.

    Each worker dies with this process (``qd.lifeline``); so does multiprocessing's
    resource tracker, which exits once this process and the workers are gone.
    """

    def __init__(self, name: str, params: dict[str, Any], workers: int):
        self.workers = workers
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(name, params, os.getpid()),
        )

    async def __call__(self, genomes: Any) -> Evaluation:
        loop = asyncio.get_running_loop()
        chunks = [c for c in np.array_split(np.arange(len(genomes)), self.workers) if len(c)]
        parts = await asyncio.gather(*(
            loop.run_in_executor(self._pool, _evaluate_in_worker, _take(genomes, c))
            for c in chunks
        ))
        return _concat(parts)

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def _take(genomes: Any, index: np.ndarray) -> Any:
    if isinstance(genomes, np.ndarray):
        return genomes[index]
    return [genomes[i] for i in index]


def _concat(parts: list[Evaluation]) -> Evaluation:
    def join(name: str) -> list | None:
        values = [getattr(p, name) for p in parts]
        if all(v is None for v in values):
            return None
        return [x for p, v in zip(parts, values) for x in (v if v is not None else [None] * len(p.fitness))]

    return Evaluation(
        fitness=np.concatenate([p.fitness for p in parts]),
        descriptor=np.concatenate([p.descriptor for p in parts]),
        valid=np.concatenate([p.valid for p in parts]),
        metrics=join("metrics"),
        error=join("error"),
        artifacts=join("artifacts"),
        seconds=join("seconds"),
    )


class SandboxEvaluator:
    """Runs each text candidate's cascade in the sandbox, then scores it on the host.

    Candidates run concurrently (the sandbox bounds how many at once). Any failure,
    in the sandbox or in the task's ``score``, makes that candidate invalid with a
    one-line reason; the output tails go to its artifacts for later prompts.
    """

    def __init__(self, task: TextTask, sandbox: Any):
        self.task, self.sandbox = task, sandbox

    def close(self) -> None:
        self.sandbox.close()

    async def __call__(self, texts: list[str]) -> Evaluation:
        scored = [await self._one(texts[0])] if len(texts) == 1 else await asyncio.gather(*map(self._one, texts))
        dim = self.task.descriptor_dim
        descriptor = np.asarray([_descriptor(s, dim) for s, _ in scored], np.float32)  # may invalidate
        return Evaluation(
            fitness=np.asarray([s.fitness for s, _ in scored], np.float32),
            descriptor=descriptor.reshape(len(texts), dim),
            valid=np.asarray([s.valid for s, _ in scored], bool),
            metrics=[s.metrics for s, _ in scored],
            error=[s.error for s, _ in scored],
            artifacts=[s.artifacts for s, _ in scored],
            seconds=[seconds for _, seconds in scored],
        )

    async def _one(self, text: str) -> tuple[Scored, float]:
        outputs: list[Any] = []
        scored, seconds = None, 0.0
        for i, stage in enumerate(self.task.stages):
            if i and (not scored.valid or (stage.threshold is not None and scored.fitness < stage.threshold)):
                break
            result = await self.sandbox.run(text, stage.args)
            seconds += result.seconds
            tails = _tails(result)
            if not result.ok:
                return Scored(np.nan, None, False, {"stages": i + 1}, f"{stage.name}: {result.error}", tails), seconds
            outputs.append(result.value)
            try:
                scored = self.task.score(text, outputs)
            except Exception as e:  # a task bug must not stop the run
                scored = Scored(np.nan, None, False, None, f"score: {type(e).__name__}: {e}")
            scored.metrics = {**(scored.metrics or {}), "stages": i + 1}
            if tails:
                scored.artifacts = {**tails, **(scored.artifacts or {})}
        return scored, seconds


def _tails(result: Any, keep: int = 400) -> dict[str, str]:
    """The ends of stdout/stderr: what a model needs to see of a failure."""
    return {name: text[-keep:] for name in ("stdout", "stderr") if (text := getattr(result, name))}


def _descriptor(scored: Scored, dim: int) -> np.ndarray:
    """The D-vector, or NaNs (and the candidate marked invalid) if the task got it wrong."""
    d = np.full(dim, np.nan, np.float32) if scored.descriptor is None else np.asarray(scored.descriptor, np.float32)
    if d.shape != (dim,):
        scored.valid, scored.error = False, f"score: descriptor has shape {d.shape}, expected ({dim},)"
        return np.full(dim, np.nan, np.float32)
    return d
