"""The creative_writing table: QDAIF against its three controls, at equal model-call budgets.

Arms (each run for every ``--seeds`` seed to the same ``runner.max_llm_calls``, all
calls counted: generation, quality judge, axis judges):

- ``qdaif``: the experiment as configured: a 5 x 5 grid on genre x tone.
- ``quality_only``: the same run with a single-cell archive (``descriptor.parts.0.bins=[1,1]``;
  the axis calls still happen, so the budget buys the same number of texts).
- ``random``: fresh texts from the task description alone, no parent, no selection.
- ``fewshot``: fresh texts from one fixed prompt holding three hand-written examples.

(``controls.py`` samples the last two; every arm starts from the same founders.)
Every arm's valid texts are then placed on one common grid: the axis judges' scores
(from the runs' cache, no new calls) mapped through the quantiles of all arms'
scores pooled (``rescale=quantile``, 5 bins per axis), so every arm is measured on
the same cells and the bins are dense where the judge's scores cluster. Per run,
each cell keeps its best text by the run's quality judge, and:

- QD score: the sum of the cells' qualities (quality = expected digit / 9);
- coverage: filled cells / 25;
- high-quality cells: cells whose quality beats every founder's (the best hand-written text);
- held-out: the cells' texts re-scored by a second quality judge never used in a
  run (``judges.HELD_OUT``), the same three numbers with its scores.

Each number is the mean over seeds with a 95% percentile bootstrap interval over
the seeds (2,000 resamples; with 3 seeds it is coarse). The judges' agreement with
the shipped labelled set (``labels.json``) is measured with the same model. All of
it goes to ``<out>/table.json``; the Markdown tables are printed.

    python experiments/creative_writing/table.py --seeds 0 1 2 --max-llm-calls 80
    python experiments/creative_writing/table.py --base-url http://host:8000/v1 --model NAME
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from descriptors import Item, make_descriptor
from descriptors.ai_feedback import AIFeedbackDescriptor
from qd import tables
from qd.heldout import bootstrap
from qd.llm import LLMClient
from qd.plan import compose, plan
from qd.run import run_in
from qd.store import Store
from qd.task import load_module

_HERE = Path(__file__).resolve().parent
judges = load_module(_HERE / "judges.py", "experiments_creative_writing_judges")
controls = load_module(_HERE / "controls.py", "experiments_creative_writing_controls")

ENGINE_ARMS = {"qdaif": [], "quality_only": ["descriptor.parts.0.bins=[1,1]"]}
ARMS = (*ENGINE_ARMS, *controls.TEMPLATES)
METRICS = ("qd_score", "coverage", "high_quality_cells", "held_out_qd_score", "held_out_high_quality_cells")


def stored_texts(run_dir: Path) -> list[dict]:
    """A run's texts in the order they were made: ``{"text", "origin", "valid", "quality", "error"}``."""
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = sorted((c for c in store.iter() if c.kind == "text"), key=lambda c: c.id)
    return [
        {
            "text": c.text,
            "origin": c.operator,
            "valid": bool(c.valid and c.fitness is not None),
            "quality": c.fitness if c.valid else None,
            "error": c.error,
        }
        for c in rows
    ]


def run_arm(arm: str, shared: list[str], seed: int, out: Path) -> dict:
    """One arm at one seed: its texts and the model calls it spent."""
    started = time.monotonic()
    p = plan(compose([*shared, f"seed={seed}", *ENGINE_ARMS.get(arm, [])]))
    archive = None
    if arm in ENGINE_ARMS:
        try:
            summary = run_in(p, out / arm / f"seed{seed}")
            calls, archive = summary["llm"]["calls"], summary["global"]
        except SystemExit:  # stopped early (printed); the store holds what it evaluated
            calls = None
        texts = stored_texts(out / arm / f"seed{seed}")
    else:
        client = LLMClient(p.llm.settings)
        try:
            texts = asyncio.run(_sampled(p, arm, client))
        finally:
            calls = client.ledger.calls
    result = {
        "arm": arm,
        "seed": seed,
        "llm_calls": calls,
        "seconds": round(time.monotonic() - started, 1),
        "archive": archive,
        "texts": texts,
    }
    (out / arm).mkdir(parents=True, exist_ok=True)
    (out / arm / f"seed{seed}.json").write_text(json.dumps(result, indent=1))
    return result


async def _sampled(p: Any, arm: str, client: LLMClient) -> list[dict]:
    try:
        return await controls.sample(p, arm, client)
    finally:
        await client.aclose()


def elites(rows: list[dict], cells: np.ndarray) -> dict[tuple, dict]:
    """Per cell, the row of best quality (the earlier one on ties)."""
    best: dict[tuple, dict] = {}
    for row, cell in zip(rows, map(tuple, cells)):
        if cell not in best or row["quality"] > best[cell]["quality"]:
            best[cell] = row
    return best


async def measure(runs: list[dict], cfg: Any, settings: Any, out: Path) -> dict:
    """Places every arm's valid texts on the common grid and scores each run's cells, both judges."""
    part = next(p for p in cfg.descriptor.parts if p.kind == "ai_feedback")
    axes = make_descriptor("ai_feedback", OmegaConf.to_container(part, resolve=True)).axes
    grid = AIFeedbackDescriptor(axes, rescale_at=(1,), rescale="quantile")
    clients = {s: LLMClient(dataclasses.replace(settings, seed=s)) for s in {r["seed"] for r in runs}}
    measuring = LLMClient(settings)
    try:
        with Store(out / "measure.sqlite") as store:
            grid.attach(store.ports())
            for r in (
                runs
            ):  # the runs' own axis answers, from the LLM cache (keyed by the run's seed) into the store
                grid.client = clients[r["seed"]]
                r["valid"] = [t for t in r["texts"] if t["valid"]]
                await grid.judge_scores([Item(t["text"]) for t in r["valid"]])
            pooled = [Item(t["text"]) for r in runs for t in r["valid"]]
            await grid.fit(pooled, np.random.default_rng(0))  # every score is in the store: no call
            bins = np.asarray(grid.bins)
            founders = [t["text"] for t in runs[0]["texts"] if t["origin"] == "init"]
            held = judges.judge(judges.HELD_OUT, measuring)
            held.attach(store.ports())
            founder_held = (await held.judge_scores([Item(t) for t in founders])).values[:, 0]
            founder_best = max(
                (t["quality"] for r in runs for t in r["valid"] if t["origin"] == "init"), default=1.0
            )
            bar = {"quality": founder_best, "held_out": float(np.nanmax(founder_held))}
            for r in runs:
                placed = await grid.describe([Item(t["text"]) for t in r["valid"]])
                keep = [i for i in range(len(r["valid"])) if placed.valid[i]]
                cells = np.minimum((placed.values[keep] * bins).astype(int), bins - 1)
                best = list(elites([r["valid"][i] for i in keep], cells).values())
                rescored = (await held.judge_scores([Item(t["text"]) for t in best])).values[:, 0]
                h = np.nan_to_num(rescored, nan=0.0)
                q = np.asarray([t["quality"] for t in best])
                r["scores"] = {
                    "qd_score": float(q.sum()),
                    "coverage": len(best) / int(bins.prod()),
                    "high_quality_cells": int((q > bar["quality"]).sum()),
                    "held_out_qd_score": float(h.sum()),
                    "held_out_high_quality_cells": int((h > bar["held_out"]).sum()),
                    "texts": len(r["texts"]),
                    "valid_texts": len(r["valid"]),
                    "mean_quality": float(np.mean([t["quality"] for t in r["valid"]]))
                    if r["valid"]
                    else math.nan,
                }
            labels = await judges.agreement_on_labels(measuring, AIFeedbackDescriptor(axes))
    finally:
        for c in (*clients.values(), measuring):
            await c.aclose()
    edges = [grid.state_dict()[f"edges{j}"].tolist() for j in range(grid.dim)]
    return {"thresholds": bar, "agreement": labels, "grid_edges": edges}


def summarize(runs: list[dict]) -> list[dict]:
    """Per arm: each metric's mean over seeds with its 95% bootstrap interval over the seeds."""
    rows = []
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        row = {
            "arm": arm,
            "seeds": [r["seed"] for r in mine],
            "llm_calls": [r["llm_calls"] for r in mine],
            "texts": [r["scores"]["texts"] for r in mine],
            "valid_texts": [r["scores"]["valid_texts"] for r in mine],
        }
        for m in (*METRICS, "mean_quality"):
            values = [r["scores"][m] for r in mine]
            row[m] = float(np.mean(values))
            row[m + "_ci95"] = list(bootstrap(values))
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    head = ["arm", "texts (valid), per seed", "model calls, per seed", *METRICS]
    lines = [
        "| " + " | ".join(h.replace("_", " ") for h in head) + " |",
        "|---|---|---|" + "---:|" * len(METRICS),
    ]
    for r in result["rows"]:
        cells = [f"{r[m]:.2f} [{r[m + '_ci95'][0]:.2f}, {r[m + '_ci95'][1]:.2f}]" for m in METRICS]
        texts = ", ".join(f"{n} ({v})" for n, v in zip(r["texts"], r["valid_texts"]))
        lines.append(
            f"| {r['arm']} | {texts} | {', '.join(map(str, r['llm_calls']))} | " + " | ".join(cells) + " |"
        )
    bar = result["thresholds"]
    lines += [
        "",
        f"High-quality cell: quality above the best founder's ({bar['quality']:.3f} by the run's judge, "
        f"{bar['held_out']:.3f} by the held-out judge). Intervals: 95% bootstrap over seeds.",
        "",
        "| judge | n | spearman | accuracy | AUC |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, a in result["agreement"].items():
        lines.append(
            f"| {name} | {a['n']} (+{a['missing']} missing) | {a['spearman']:.2f} | {a['accuracy']:.2f} | "
            f"{a['auc']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    a = tables.arguments("creative_writing", argv, __doc__, held_out=None, max_llm_calls=80)
    started = time.monotonic()
    with tables.model_server(a) as (base_url, model):
        shared = tables.shared_overrides("creative_writing", a, base_url, model)
        runs = []
        for seed in a.seeds:
            for arm in ARMS:
                runs.append(run_arm(arm, shared, seed, a.out))
                print(
                    f"{arm} seed {seed}: {len(runs[-1]['texts'])} texts, {runs[-1]['llm_calls']} calls, "
                    f"{runs[-1]['seconds']} s",
                    flush=True,
                )
        p = plan(compose(shared))
        measured = asyncio.run(measure(runs, p.cfg, p.llm.settings, a.out))
        result = {
            "experiment": "creative_writing",
            "model": model,
            "base_url": base_url if a.base_url else "embedded",
            "seeds": a.seeds,
            "max_llm_calls": a.max_llm_calls,
            **measured,
            "rows": summarize(runs),
            "runs": [
                {k: r[k] for k in ("arm", "seed", "llm_calls", "seconds", "archive", "scores")} for r in runs
            ],
            "seconds": round(time.monotonic() - started, 1),
        }
        (a.out / "table.json").write_text(json.dumps(result, indent=2))
        print(markdown(result))
        return result


if __name__ == "__main__":
    main()
