"""Running a task's evaluator: in the loop's process, or in a pool of worker processes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from typing import Any

import numpy as np

from qd.task import Evaluation, Task, load_task

_WORKER_TASK: Task | None = None


def _init_worker(name: str, params: dict[str, Any]) -> None:
    global _WORKER_TASK
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
    """Splits each batch over ``workers`` spawned processes that each load the task once."""

    def __init__(self, name: str, params: dict[str, Any], workers: int):
        self.workers = workers
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(name, params),
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
    )
