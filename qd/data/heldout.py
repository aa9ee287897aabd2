"""A dataset task's test split, scored once after the run: the held-out score of a genome
with its bootstrap 95 % interval.

The test rows are never part of a stage, a description or feedback during the run; here
they are run through the same entry as the run's stages, on the run's model (``llm``: its
client, closed or not), with their calls in its ledger under the role ``heldout``: after the
run, outside its budget (the calls are in no proposal's tally, so a continued run does not count
them either), and not in the run's response cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from qd.contract import ConfigError
from qd.heldout import bootstrap
from qd.llm.gateway import CallBudget, ModelGateway, candidate_key

ROLE = "heldout"


def test_score(task: Any, source: Any, llm: Any) -> tuple[float, tuple[float, float]]:
    """Mean test score of ``source`` (a genome's text, a run directory, or a result with a
    ``run_dir``: its best elite) and the 95 % bootstrap interval; works inside a running event
    loop too (a notebook's): it then runs on a thread of its own."""
    if not task.splits.test:
        raise ConfigError("splits", "the dataset has no test split", "give splits a test fraction > 0")
    text = _genome(source)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        scores = asyncio.run(_scores(task, text, llm))
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            scores = pool.submit(asyncio.run, _scores(task, text, llm)).result()
    return float(np.mean(scores)), bootstrap(scores)


def _genome(source: Any) -> str:
    run_dir = getattr(source, "run_dir", source)
    if isinstance(run_dir, Path) or (isinstance(run_dir, str) and _is_folder(run_dir)):
        from qd.api import elites

        best = elites(run_dir)
        if not best:
            raise ConfigError("run_dir", f"{run_dir} has no elite to score", "run it until one is placed")
        return best[0].candidate.text
    if not isinstance(source, str):
        raise TypeError(f"heldout: a {type(source).__name__} is not a genome, a run directory or a result")
    return source


def _is_folder(text: str) -> bool:
    """Whether ``text`` names a folder; a genome's text too long to be a path is none (not an error)."""
    try:
        return Path(text).is_dir()
    except OSError:  # e.g. ENAMETOOLONG: a line of the text is longer than a file name may be
        return False


async def _scores(task: Any, text: str, run_client: Any) -> list[float]:
    """Each test row's score: one run of the genome's entry on every test row."""
    rows = task.splits.test
    stage = task.stage(rows, ROLE)
    runner = _runner(task, len(rows))
    llm = _client(run_client)
    calls = min(4096, len(rows) * task.calls_per_row)
    budget = CallBudget(calls=calls, tokens=calls * (task.max_tokens + 4096), max_tokens=task.max_tokens)
    gateway = ModelGateway(llm, budget, candidate_key(text, ROLE), role=ROLE)
    try:
        result = await runner.run(text, stage.args, calls=gateway)
    finally:
        runner.close()
        if llm is not run_client:
            await llm.aclose()
            run_client.ledger.merge(llm.ledger)
    judged = task.judge(rows, result.value) if result.ok else None
    if judged is None:  # the genome failed on the test rows as a whole: each scores 0
        return [0.0] * len(rows)
    return [v.score if math.isfinite(v.score) else 0.0 for v in judged[0]]


def _client(llm: Any) -> Any:
    """What scores the test split: for a client of a server, a new one over the same server and
    settings (the run closed its own when it ended) without the response cache (test rows leave
    nothing in the run's folder), its calls added to ``llm``'s ledger after; a caller's own model
    (a ``ChatClient`` wrapped by ``qd.build``, which a run leaves open) as it is."""
    from qd.llm import LLMClient

    if isinstance(llm, LLMClient) and llm.settings.base_url is not None:
        return LLMClient(dataclasses.replace(llm.settings, cache_dir=None))
    return llm


def _runner(task: Any, rows: int) -> Any:
    if task.runs.entry == "host_entry":
        from qd.evaluator import HostRunner

        return HostRunner(task.host_entry, workers=1)
    from qd.sandbox import Limits, Sandbox

    return Sandbox(task.sandbox_entry, workers=1, limits=Limits(wall_s=task.item_seconds * rows + 10))
