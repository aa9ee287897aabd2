"""The two QDAIF controls that generate without selection: random sampling and fixed few-shot.

qd's LLM operators always show a parent (a rewrite template must hold ``$parent``),
so these two arms are sampled here, beside the engine, from one fixed prompt each:
the text kind's system prompt and a template of this folder, ``random.txt`` (the
task description alone) or ``fewshot.txt`` (the task and three fixed hand-written
texts). Everything else is the run's (``plan``): the client settings (model,
temperature, seed, cache), the operators' ``max_tokens``, the text kind's parser,
the task's evaluator (the quality judge within ``eval_llm``) and the describer's
axis judges. An arm starts from the founders, evaluated and described as a run
does, then samples ``runner.batch_size`` texts at a time until fewer than one
text's calls (generation + evaluation + axes, as a run reserves them) are left of
``runner.max_llm_calls``: every call counts, as in a run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from descriptors import Item
from genomes.answers import MalformedAnswer
from operators.llm import load_templates
from qd.contract import sample_index
from qd.evaluator import HostRunner, StagedEvaluator
from qd.llm import LLMClient

TEMPLATES = {
    "random": Path(__file__).resolve().parent / "random.txt",
    "fewshot": Path(__file__).resolve().parent / "fewshot.txt",
}
_FIELDS = {"system": (set(), {"language", "noun"}), "sample": ({"task"}, {"task", "noun", "language"})}


def prompt(p: Any, arm: str) -> list[dict]:
    """The arm's one fixed chat: the text kind's system prompt, then the arm's template filled in."""
    t = load_templates({"system": p.genome.templates["system"], "sample": str(TEMPLATES[arm])}, _FIELDS)
    fill = {"task": p.task.description.strip(), "noun": p.genome.noun, "language": p.genome.language}
    return [
        {"role": "system", "content": t["system"].substitute(fill).strip()},
        {"role": "user", "content": t["sample"].substitute(fill).strip()},
    ]


async def sample(p: Any, arm: str, client: LLMClient) -> list[dict]:
    """The arm's texts, founders first: ``{"text", "origin", "valid", "quality", "error"}`` each."""
    cfg, task = p.cfg, p.task
    messages = prompt(p, arm)
    max_tokens = cfg.operators.mix[0].max_tokens
    evaluator = StagedEvaluator(task, HostRunner(task.host_entry, cfg.runner.workers), client, p.eval_budget)
    axes = p.describer.parts[0]  # the experiment's ai_feedback part: its axis calls count as a run's do
    axes.attach(None, client)
    per_text = 1 + evaluator.model_calls + axes.calls_per_item

    async def judged(texts: list[str], origin: str, errors: list[str | None]) -> list[dict]:
        ok = [t for t, e in zip(texts, errors) if e is None]
        ev = await evaluator(ok) if ok else None
        if ok:
            await axes.judge_scores([Item(t) for t in ok])
        rows, k = [], 0
        for text, error in zip(texts, errors):
            if error is None:
                valid, quality, error = bool(ev.valid[k]), float(ev.fitness[k]), ev.error[k]
                k += 1
            else:
                valid, quality = False, None
            rows.append(
                {
                    "text": text,
                    "origin": origin,
                    "valid": valid,
                    "quality": quality if valid else None,
                    "error": error,
                }
            )
        return rows

    try:
        founders = task.initial(np.random.default_rng(cfg.seed), cfg.runner.initial_population)
        rows = await judged(founders, "init", [None] * len(founders))
        while (left := (cfg.runner.max_llm_calls - client.ledger.calls) // per_text) > 0:
            n = min(cfg.runner.batch_size, left)
            answers = await asyncio.gather(
                *(
                    client.complete(messages, max_tokens=max_tokens, sample_index=sample_index(len(rows) + j))
                    for j in range(n)
                )
            )
            texts, errors = [], []
            for c in answers:
                try:
                    texts.append(p.genome.parse(c.text))
                    errors.append(None)
                except MalformedAnswer as e:
                    texts.append(c.text)
                    cut = " (answer cut at max_tokens)" if c.finish_reason == "length" else ""
                    errors.append(f"{arm}: {e.reason}{cut}")
            rows += await judged(texts, arm, errors)
    finally:
        evaluator.close()
    return rows
