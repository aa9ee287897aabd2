"""A task's held-out problems as an evaluation: score texts on problems no run saw, the
way the run scored its search problems (same evaluator, model and per-problem call
budget), with a bootstrap interval over the problems.

It is what every experiment table (``experiments/*/table.py``) and ``qd committee``
measure generalisation with: a run's fitness is on its search problems, and only a
held-out score says whether a found design is better, not just fitted. A task offers it
with ``held_out()`` (the problems), ``stage(items, split)`` and ``score_items``
(agent_design, agent_team, prompt_evolution).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from qd.evaluator import HostRunner, StagedEvaluator
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.llm.gateway import CallBudget
from qd.task import Scored


@dataclasses.dataclass
class HeldOut:
    """A task's held-out view: one stage on its held-out problems, scored like the search stage
    (``split="search"``: the same on its search problems, to choose among designs without held-out data)."""

    task: Any
    split: str = "held_out"

    def __post_init__(self) -> None:
        self.items = self.task.held_out() if self.split == "held_out" else self.task.search
        self.stages = [self.task.stage(self.items, self.split)]
        self.descriptor_dim = self.task.descriptor_dim

    def score(self, text: str, outputs: list[Any], trace: list[dict]) -> Scored:
        """The task's score, plus each problem's raw answer (``metrics["answers"]``): what a committee
        (``qd committee``) votes over; the tables read only their own fields."""
        scored = self.task.score_items(text, self.items, outputs[-1], trace)
        out = outputs[-1]
        answers = out.get("answers") if isinstance(out, dict) else out  # a team's entry wraps its answers
        if scored.valid and isinstance(answers, list):
            scored.metrics = {
                **(scored.metrics or {}),
                "answers": [a.get("answer") if isinstance(a, dict) else a for a in answers],
            }
        return scored


def bootstrap(correct: list[int], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of ``correct`` (0/1 per problem)."""
    values = np.asarray(correct, np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


async def held_out_scores(
    cfg: Any, task: Any, texts: list[str], client: Any, split: str = "held_out"
) -> list[Scored]:
    """Each text's evaluation on the held-out (or ``split``) problems (per-problem call budget as in
    the run)."""
    view = HeldOut(task, split)
    scale = len(view.items) / task.search_items
    e = cfg.eval_llm
    budget = CallBudget(
        calls=min(4096, math.ceil(e.calls * scale)),
        tokens=math.ceil(e.tokens * scale),
        max_tokens=e.max_tokens,
    )
    if getattr(task, "host_entry", None):
        runner = HostRunner(task.host_entry)
    else:
        from qd.sandbox import Limits, Sandbox

        limits = Limits(
            wall_s=cfg.sandbox.wall_s * scale * len(texts),
            cpu_s=cfg.sandbox.cpu_s,
            memory_mb=cfg.sandbox.memory_mb,
        )
        runner = Sandbox(task.sandbox_entry, workers=min(len(texts), 4), limits=limits)
    evaluator = StagedEvaluator(view, runner, client, budget)
    try:
        ev = await evaluator(texts)
    finally:
        evaluator.close()
    return [
        Scored(float(ev.fitness[i]), None, bool(ev.valid[i]), ev.metrics[i], ev.error[i])
        for i in range(len(texts))
    ]


@contextlib.contextmanager
def model_server(base_url: str | None, model: str | None, log_dir: Path) -> Iterator[tuple[str, str]]:
    """(base_url, model) to score with: the given server's, or the embedded llama.cpp server's
    (started here, its log in ``log_dir``, stopped after)."""
    if base_url is not None:
        yield base_url, model
        return
    from qd.llm.server import EmbeddedServer

    with EmbeddedServer(log_path=Path(log_dir) / "llm_server.log") as server:
        yield server.base_url, server.model


def scoring_client(
    cfg: Any, base_url: str, model: str, api_key_env: str | None, cache_dir: Path
) -> LLMClient:
    """A client for scoring after a run: the run's settings (``cfg``), seed 0, and ``cache_dir``."""
    return LLMClient(
        LLMSettings(
            base_url=base_url,
            models=(ModelSpec(model),),
            api_key_env=api_key_env,
            concurrency=cfg.llm.concurrency,
            timeout_s=cfg.llm.timeout_s,
            temperature=cfg.llm.temperature,
            seed=0,
            cache_dir=str(cache_dir),
        )
    )
