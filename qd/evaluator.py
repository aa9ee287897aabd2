"""Running a task's evaluator: in the loop's process, in a pool of worker processes,
in the sandbox (LLM-written code), or in host threads (data genomes read by trusted code)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import itertools
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qd import lifeline
from qd.contract import Evaluator
from qd.sandbox.protocol import HARNESS, exception_line, harness_failure
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


def failed_batch(dim: int, n: int, e: Exception) -> Evaluation:
    """A numeric evaluator raised on a batch of ``n`` genomes: each failed outside its own code
    (the task's evaluation is trusted code, a harness), with one reason; the run's guard
    (``qd.stop_rules``) stops a run whose evaluation keeps failing so."""
    error = f"{HARNESS}evaluate: {exception_line(e)}"
    return Evaluation(
        fitness=np.full(n, np.nan, np.float32),
        descriptor=np.full((n, dim), np.nan, np.float32),
        valid=np.zeros(n, bool),
        error=[error] * n,
    )


class InProcessEvaluator(Evaluator):
    """Calls ``task.evaluate`` directly: best for cheap vectorized numeric tasks."""

    def __init__(self, task: Task):
        self.task = task

    async def __call__(self, genomes: Any) -> Evaluation:
        return self.task.evaluate(genomes)


class PoolEvaluator(Evaluator):
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
        parts = await asyncio.gather(
            *(loop.run_in_executor(self._pool, _evaluate_in_worker, _take(genomes, c)) for c in chunks)
        )
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


class HostRunner:
    """Runs a data genome's trusted host code: ``entry(text, llm=..., **args)`` in a worker thread.

    Data genomes (prompts, teams, texts) are never executed: the entry (the task's
    ``host_entry``, ``"path/to/file.py:function"``) reads the genome with safe loaders
    and, for a prompt, runs the fixed solver on it through ``llm``, a blocking callable
    over the evaluation's ``qd.llm.gateway.ModelGateway``. The same result shape as the
    sandbox's, so one staged evaluator serves both.

    Its threads are its own (``workers`` at most run at once): in asyncio's default
    executor, entries blocked on model calls would hold every thread the loop itself
    needs for them (a connection's address lookup runs there).
    """

    def __init__(self, entry: str | Callable[..., Any], workers: int = 4):
        # A callable is a Python caller's own trusted function (``qd.build`` from objects).
        self.entry, self.fn = entry, entry if callable(entry) else load_entry(entry)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="qd-host-entry")

    async def run(self, text: str, args: dict | None = None, *, calls: Any = None) -> Any:
        from qd.sandbox import SandboxResult

        kwargs = dict(args or {})
        if calls is not None:
            kwargs["llm"] = calls.blocking(asyncio.get_running_loop())
        start = time.perf_counter()
        call = functools.partial(contextvars.copy_context().run, self.fn, text, **kwargs)
        try:
            value = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except Exception as e:  # the genome is data: a failure is the task code's verdict on it
            error = " ".join(f"{type(e).__name__}: {e}".split())[:500]
            return SandboxResult(
                False, None, error, "", traceback.format_exc()[-2000:], time.perf_counter() - start
            )
        finally:  # (cancelled: the thread runs on, but its model calls now fail at once)
            if calls is not None:
                calls.close()
        return SandboxResult(True, value, None, "", "", time.perf_counter() - start)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def load_entry(entry: str) -> Callable[..., Any]:
    """The function ``"path/to/file.py:function"`` or ``"package.module:function"`` names."""
    target, _, name = entry.rpartition(":")
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_qd_host_entry_{Path(target).stem}", target)
        if spec is None or not Path(target).is_file():
            raise ValueError(f"entry: no file {target} (write 'path/to/file.py:function')")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"entry: {target} has no function {name} (define `def {name}(text, **args)` in it)")
    return fn


class StagedEvaluator(Evaluator):
    """Runs each text candidate's cascade of stages, then scores it on the host.

    ``runner`` runs one stage: the sandbox (``qd.sandbox.Sandbox``: LLM-written code
    runs only there) or :class:`HostRunner` (data genomes, read by trusted code).
    With ``client`` (a task whose evaluation calls the run's model: ``task.models``),
    each stage gets a ``ModelGateway`` over it, within what is left of ``budget`` for
    the whole evaluation; every call it made is the candidate's ``trace``, and the
    task scores with it: ``task.score(text, outputs, trace)``.

    Candidates run concurrently (the runner bounds how many at once). Any failure,
    in the runner or in the task's ``score``, makes that candidate invalid with a
    one-line reason; the output tails go to its artifacts for later prompts.
    """

    def __init__(self, task: TextTask, runner: Any, client: Any = None, budget: Any = None):
        self.task, self.runner, self.client, self.budget = task, runner, client, budget

    @property
    def model_calls(self) -> int:
        """Model calls one evaluation may make (what a child reserves against runner.max_llm_calls)."""
        return self.budget.calls if self.client is not None else 0

    @property
    def down(self) -> str | None:
        """The runner's reason no run can go on (``RaySandbox.down``); local runners have none."""
        return getattr(self.runner, "down", None)

    def close(self) -> None:
        self.runner.close()

    async def __call__(self, texts: list[str]) -> Evaluation:
        return await self._evaluate(texts, len(self.task.stages))

    async def first_stage(self, texts: list[str]) -> Evaluation:
        """The cascade's first stage only (an agent's trial: ``qd.workbench``)."""
        return await self._evaluate(texts, 1)

    async def _evaluate(self, texts: list[str], stages: int) -> Evaluation:
        """``texts`` through the first ``stages`` stages of the cascade."""
        one = functools.partial(self._one, stages=stages)
        scored = [await one(texts[0])] if len(texts) == 1 else await asyncio.gather(*map(one, texts))
        dim = self.task.descriptor_dim
        descriptor = np.asarray([_descriptor(s, dim) for s, _, _ in scored], np.float32)  # may invalidate
        return Evaluation(
            fitness=np.asarray([s.fitness for s, _, _ in scored], np.float32),
            descriptor=descriptor.reshape(len(texts), dim),
            valid=np.asarray([s.valid for s, _, _ in scored], bool),
            metrics=[s.metrics for s, _, _ in scored],
            error=[s.error for s, _, _ in scored],
            artifacts=[s.artifacts for s, _, _ in scored],
            seconds=[seconds for _, seconds, _ in scored],
            traces=[trace for _, _, trace in scored] if self.client is not None else None,
        )

    async def _one(self, text: str, stages: int) -> tuple[Scored, float, list[dict]]:
        outputs: list[Any] = []
        trace: list[dict] = []
        scored, seconds, spent = None, 0.0, (0, 0)  # model calls and tokens of the stages so far
        ahead: list[Any] = []  # the results of later stages that ran in an earlier stage's visit
        cascade = self.task.stages[:stages]
        for i, stage in enumerate(cascade):
            if i and (
                not scored.valid
                or (stage.threshold is not None and scored.fitness < stage.threshold)
                or (stage.runs_if is not None and not stage.runs_if(text, scored))
            ):
                break
            gateway = self._gateway(text, stage.name, *spent)
            together = [] if ahead else self._same_visit(cascade[i + 1 :])
            try:
                if ahead:
                    result = ahead.pop(0)
                elif together:
                    result = await self.runner.run(text, stage.args, then=[s.args for s in together])
                    ahead = _later_results(result)
                else:
                    result = await self.runner.run(text, stage.args, calls=gateway)
            except ValueError as e:  # the runner cannot run at all (its entry fails to import)
                return Scored(np.nan, None, False, None, f"{HARNESS}{stage.name}: {e}"), seconds, trace
            seconds += result.seconds
            if gateway is not None:
                trace += [{**call, "stage": stage.name} for call in gateway.trace]
                spent = (spent[0] + gateway.calls, spent[1] + gateway.tokens)
            tails = _tails(result)
            if not result.ok:
                metrics = {"stages": i + 1, **({"model_calls": spent[0]} if gateway is not None else {})}
                return (
                    Scored(np.nan, None, False, metrics, _staged(stage.name, result.error), tails),
                    seconds,
                    trace,
                )
            outputs.append(result.value)
            try:
                scored = (
                    self.task.score(text, outputs, trace)
                    if gateway is not None
                    else self.task.score(text, outputs)
                )
            except Exception as e:  # a task bug must not stop the run
                scored = Scored(np.nan, None, False, None, f"{HARNESS}score: {type(e).__name__}: {e}")
            scored.metrics = {**(scored.metrics or {}), "stages": i + 1}
            if gateway is not None:
                scored.metrics["model_calls"] = spent[0]  # calls that reached the model
            if tails:
                scored.artifacts = {**tails, **(scored.artifacts or {})}
        return scored, seconds, trace

    def _same_visit(self, later: list[Any]) -> list[Any]:
        """The stages right after this one that run in its visit (``Stage.same_visit``), where
        the runner can (``runs_stages_together``) and no stage's evaluation calls the model."""
        if self.client is not None or not getattr(self.runner, "runs_stages_together", False):
            return []
        return list(itertools.takewhile(lambda stage: stage.same_visit, later))

    def _gateway(self, text: str, stage: str, calls: int, tokens: int) -> Any:
        """The stage's access to the model: what the evaluation's budget leaves after the
        ``calls`` and ``tokens`` of its earlier stages."""
        if self.client is None:
            return None
        from qd.llm.gateway import ModelGateway, candidate_key

        left = dataclasses.replace(
            self.budget, calls=max(0, self.budget.calls - calls), tokens=max(0, self.budget.tokens - tokens)
        )
        return ModelGateway(self.client, left, candidate_key(text, stage))


def _later_results(visit: Any) -> list[Any]:
    """A visit's later calls as the results of their own stages: each value, then the failed
    one's reason; each with the visit's output (one process printed it all), the visit's time
    with its first stage."""
    if not visit.ok:
        return []
    later = [dataclasses.replace(visit, value=v, seconds=0.0) for v in visit.then or []]
    if visit.then_error is not None:
        later.append(dataclasses.replace(visit, ok=False, value=None, error=visit.then_error, seconds=0.0))
    return later


def _staged(stage: str, error: str) -> str:
    """A stage's error named by its stage, a harness failure still marked first (``HARNESS``)."""
    blame = HARNESS if harness_failure(error) else ""
    return f"{blame}{stage}: {error.removeprefix(HARNESS)}"


def _tails(result: Any, keep: int = 400) -> dict[str, str]:
    """The ends of stdout/stderr: what a model needs to see of a failure."""
    return {name: text[-keep:] for name in ("stdout", "stderr") if (text := getattr(result, name))}


def _descriptor(scored: Scored, dim: int) -> np.ndarray:
    """The D-vector, or NaNs (and the candidate marked invalid) if the task got it wrong."""
    d = (
        np.full(dim, np.nan, np.float32)
        if scored.descriptor is None
        else np.asarray(scored.descriptor, np.float32)
    )
    if d.shape != (dim,):
        scored.valid, scored.error = (
            False,
            f"{HARNESS}score: descriptor has shape {d.shape}, expected ({dim},)",
        )
        return np.full(dim, np.nan, np.float32)
    return d
