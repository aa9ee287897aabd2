"""The runs of ``bench/quality.py`` that live in qd's own interpreter: qd (its variants are
override lists) and the two controls. Each is one child process; it returns every program the
run evaluated, with its fitness, so the parent scores all systems on one grid.

Controls (the question of OpenEvolve's issue #100, "is evolution necessary?"), with the same
client, sampling settings and prompts as qd's run of the task (``qd.plan`` of the same
overrides, its operators built on a ``qd.llm.LLMClient``), scored by the task's scorer:

* ``best-of-N``: N samples of qd's ``rewrite`` prompt on one parent, the best seed program
  (the same prompt every time; only the sampling seed changes), the best kept.
* ``restarts``: each call applies an operator drawn from qd's mix (its weights) to seed
  programs drawn at random, the seeds as its inspirations: a mutation of the start, never of a
  child. No archive, no selection.

On the prompt task, ``best-of-N`` asks ``qd.optimize``'s ``rewrite`` operator of the prompt genome
(built as ``qd.optimize`` builds it, on a client set up as it sets its up) for children of the
seed prompt and scores each, and the seed, on the validation split: its accuracy, what qd's
validation stage computes (``DatasetTask.heldout`` on a copy of the task whose test rows are the
validation rows). Every call counts, the proposer's and the evaluation's; a child is asked for only
while its call and its evaluation fit in what the budget leaves. With one seed and one operator a
restart would be the same sample, so ``restarts`` has no prompt row of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any

from _search_runs import run_qd
from quality_tasks import (
    DATASET,
    SHIM,
    BenchTask,
    on_validation,
    prompt_accuracy,
    prompt_descriptor,
    prompt_task,
)


def llm_overrides(p: dict[str, Any]) -> list[str]:
    """The model server of the bench, as qd-run overrides."""
    return [
        "llm.provider=server",
        f"llm.base_url={p['base_url']}",
        f"llm.models=[{{name: {p['model']}}}]",
        "llm.api_key_env=null",
        f"seed={p['seed']}",
    ]


def qd_run(p: dict[str, Any], task: BenchTask) -> dict[str, Any]:
    """qd on a code task: ``task.qd_overrides`` + the variant's (the sandbox's workers get this
    process's ``sys.path``, so OpenEvolve's evaluator finds the shim of its import)."""
    sys.path.append(str(SHIM))
    return run_qd(p, [*task.qd_overrides, *p["variant"]])


def qd_prompt(p: dict[str, Any]) -> dict[str, Any]:
    """qd on the prompt task, through ``qd.optimize`` (defaults: one island, the rewrite operator;
    a variant's switch as its arguments: ``memory=True``, ``operators=("rewrite", "agent")``)."""
    import qd
    from qd.store import Store

    run_dir = Path(p["work"]) / "qd_run"
    t0 = time.perf_counter()
    result = qd.optimize(
        p["seeds"][0],
        genome="prompt",
        dataset=str(DATASET),
        metric="numeric",
        base_url=p["base_url"],
        model=p["model"],
        budget={"llm_calls": p["calls"]},
        random_seed=p["seed"],
        run_dir=run_dir,
        **p["optimize"],
    )
    wall = time.perf_counter() - t0
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = [
            {
                "text": c.text,
                "fitness": c.fitness,
                "valid": bool(c.valid),
                "llm": c.model is not None,
                "error": c.error,
                "descriptor": prompt_descriptor(c.text or ""),
            }
            for c in store.iter()
        ]
    roles = result.ledger.split("role")
    heldout_calls = roles["heldout"].calls if "heldout" in roles else 0
    return {
        "programs": rows,
        "wall_s": wall,
        "heldout": None if result.heldout is None else result.heldout[0],
        "heldout_calls": heldout_calls,  # after the run, on the test split: not the run's
        "budget_calls": result.ledger.calls - heldout_calls,
        "stop_reason": result.summary.get("stop_reason"),
    }


def control(p: dict[str, Any], task: BenchTask) -> dict[str, Any]:
    """``best-of-N`` or ``restarts`` (``p["system"]``) on a code task; see the module doc."""
    return asyncio.run(_control(p, task))


async def _control(p: dict[str, Any], task: BenchTask) -> dict[str, Any]:
    import numpy as np

    from operators.llm import LLMOperator
    from qd.contract import LLMError, Parent, PromptContext
    from qd.plan import compose, plan
    from qd.run import start_llm

    planned = plan(compose([*task.qd_overrides, *llm_overrides(p)]))
    rng = np.random.default_rng(p["seed"])
    seeds = []
    for i, text in enumerate(task.seeds):
        s = task.score(text)
        seeds.append(Parent(i, text, s["fitness"] if s["valid"] else None, None, s["feedback"] or s["error"]))
    rows = [_row(parent.text, task.score(parent.text), llm=False) for parent in seeds]
    best_seed = max(seeds, key=lambda s: -math.inf if s.fitness is None else s.fitness)
    entries = [e for e in planned.operators if p["system"] == "restarts" or e.name == "rewrite"]
    weights = np.asarray([e.weight for e in entries], float)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        client = start_llm(planned.llm, Path(p["work"]), stack)
        ops = [LLMOperator(client=client, **e.params) for e in entries]
        for i in range(p["calls"]):
            op = ops[rng.choice(len(ops), p=weights / weights.sum())]
            if p["system"] == "best-of-N":
                parents = [best_seed]
            else:
                parents = [seeds[j] for j in rng.choice(len(seeds), op.num_parents)]
            context = PromptContext(task=planned.task.description, sample_index=i, rng=rng)
            try:
                children = await op(parents, seeds, context)
            except LLMError as e:
                rows.append({"text": None, "fitness": math.nan, "valid": False, "llm": True, "error": str(e)})
                continue
            for child in children:
                scored = task.score(child.text) if child.text else {"valid": False, "error": child.error}
                rows.append(_row(child.text, scored, llm=True))
    return {"programs": rows, "wall_s": time.perf_counter() - t0}


def prompt_control(p: dict[str, Any]) -> dict[str, Any]:
    """``best-of-N`` on the prompt task; see the module doc."""
    return asyncio.run(_prompt_control(p))


async def _prompt_control(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    import genomes
    from operators import make_text_operator
    from qd.contract import LLMError, Parent, PromptContext
    from qd.optimize_parts import ModelArgs, start_client

    task = prompt_task(p["seed"])
    validation = on_validation(task)
    cost = 1 + len(task.splits.validation) * task.calls_per_row  # a child's call and its evaluation
    rng, rows, t0 = np.random.default_rng(p["seed"]), [], time.perf_counter()
    with contextlib.ExitStack() as stack:
        client = start_client(
            ModelArgs(p["model"], p["base_url"], None, None), p["seed"], Path(p["work"]), stack
        )
        genome = genomes.of_task(task)
        rewrite = make_text_operator("rewrite", client, genome=genome)

        async def accuracy(text: str) -> float:
            return (await asyncio.to_thread(validation.heldout, text, client))[0]

        seed = Parent(0, task.seeds[0], await accuracy(task.seeds[0]), None, None)
        rows.append(_row(seed.text, {"valid": True, "fitness": seed.fitness}, llm=False))
        i = 0
        while client.ledger.calls + cost <= p["calls"]:
            context = PromptContext(task=task.description, language=genome.language, sample_index=i, rng=rng)
            i += 1
            try:
                children = await rewrite([seed], [], context)
            except LLMError as e:
                rows.append({"text": None, "fitness": math.nan, "valid": False, "llm": True, "error": str(e)})
                continue
            for child in children:
                scored = (
                    {"valid": True, "fitness": await accuracy(child.text)}
                    if child.text
                    else {"valid": False, "error": child.error}
                )
                rows.append(_row(child.text, scored, llm=True))
        spent = client.ledger.calls
    best = max((r for r in rows if r["valid"]), key=lambda r: r["fitness"])
    return {
        "programs": rows,
        "wall_s": time.perf_counter() - t0,
        "best_prompt": best["text"],
        "budget_calls": spent,
    }


def _row(text: str | None, scored: dict[str, Any], llm: bool) -> dict[str, Any]:
    return {
        "text": text,
        "fitness": scored.get("fitness", math.nan) if scored["valid"] else math.nan,
        "valid": bool(scored["valid"]),
        "llm": llm,
        "error": scored.get("error"),
    }


def heldout_prompt(p: dict[str, Any]) -> float:
    """A peer's best prompt (``p["best_prompt"]``) on the test split of the run seed's split, as
    ``qd.optimize`` scores qd's best: ``DatasetTask.heldout`` on the bench's server."""
    return prompt_accuracy(p, p["best_prompt"], "test")
