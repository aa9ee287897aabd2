"""The table of the agent and prompt experiments: the best design each run found,
against every hand-designed one, on held-out problems.

For each run seed, the experiment runs to the same model-call budget; then the
best valid design of each run (highest search accuracy; fewer model calls per
problem, then the earlier one, break ties) and every hand-designed design are
scored on the held-out problems (other templates than the search problems,
never seen during a run), with the run's evaluator, model and per-problem call
budget. Each row has its held-out accuracy, a 95% bootstrap interval over the
problems (2,000 resamples), and model calls per problem. Everything is written
to ``<out>/table.json``; the Markdown table is printed.

    python experiments/agent_design/table.py --seeds 0 1 2 --max-llm-calls 250
    python experiments/agent_design/table.py --base-url http://host:8000/v1 --model NAME

Without ``--base-url`` it starts the embedded llama.cpp server (SmolLM2-135M) once.
``experiments/{agent_design,prompt_evolution,agent_team}/table.py`` call ``main``;
the scoring itself is ``qd.heldout``'s, the command line and runs ``qd.tables``'.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

from qd import tables
from qd.heldout import bootstrap, held_out_scores
from qd.plan import compose
from qd.store import Store
from qd.task import Scored, load_task, task_params


def best_design(run_dir: Path) -> dict | None:
    """The run's best valid design: highest fitness, then fewer model calls per problem, then earliest."""
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = [c for c in store.iter() if c.kind == "text" and c.valid and c.fitness is not None]
    if not rows:
        return None
    best = max(rows, key=lambda c: (c.fitness, -(c.metrics or {}).get("calls_per_problem", 0.0), -c.id))
    return {"id": best.id, "text": best.text, "operator": best.operator, "search_accuracy": best.fitness}


def _row(name: str, source: str, scored: Scored, search_accuracy: float | None) -> dict:
    m = scored.metrics or {}
    correct = m.get("correct") or []
    lo, hi = bootstrap(correct) if correct else (math.nan, math.nan)
    return {
        "name": name,
        "source": source,
        "held_out_accuracy": scored.fitness if scored.valid else 0.0,
        "ci95": [lo, hi],
        "calls_per_problem": m.get("calls_per_problem", math.nan),
        "search_accuracy": search_accuracy,
        "error": scored.error,
    }


def markdown(result: dict) -> str:
    lines = [
        "| design | source | held-out accuracy | 95% interval | model calls / problem | search accuracy |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        search = "" if r["search_accuracy"] is None else f"{r['search_accuracy']:.2f}"
        lines.append(
            f"| {r['name']} | {r['source']} | {r['held_out_accuracy']:.3f} | "
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['calls_per_problem']:.2f} | {search} |"
        )
    return "\n".join(lines)


def main(
    experiment: str, argv: list[str] | None = None, baselines: Any = None, doc: str | None = None
) -> dict:
    """Runs the seeds, scores held out, writes ``table.json`` and prints the table.

    ``await baselines(cfg, task, client, held_out) -> (rows, info)``: more designs to score beside the
    task's own hand-designed ones (rows: ``(name, source, Scored, search accuracy)``; ``info`` goes to
    the JSON)."""
    a = tables.arguments(experiment, argv, doc or __doc__)
    with tables.model_server(a) as (base_url, model):
        shared = tables.shared_overrides(experiment, a, base_url, model)
        runs = tables.run_seeds(shared, a.seeds, a.out)
        found = []
        for r in runs:
            best = best_design(a.out / f"seed{r['seed']}")
            r["best"] = best and {k: v for k, v in best.items() if k != "text"}
            if best:
                found.append((r, best))
        cfg = compose(shared)
        task = load_task(experiment, {**task_params(cfg.experiment), "held_out_items": a.held_out})
        hand = task.hand_designed()
        texts = [text for _, text in hand] + [best["text"] for _, best in found]
        client = tables.client_for(cfg, a, base_url, model)
        started = time.monotonic()

        async def score() -> tuple[list[Scored], tuple[list, Any]]:  # one event loop for the client's calls
            extra = await baselines(cfg, task, client, a.held_out) if baselines else ([], None)
            unique = list(dict.fromkeys(texts))  # a run's best is often a hand-designed one: scored once
            scored = dict(zip(unique, await held_out_scores(cfg, task, unique, client)))
            return [scored[text] for text in texts], extra

        scores, (extra, info) = asyncio.run(score())
        hand_names = {text: name for name, text in hand}
        rows = [_row(name, "hand-designed", s, None) for (name, _), s in zip(hand, scores)]
        rows += [_row(*r) for r in extra]
        for (r, best), s in zip(found, scores[len(hand) :]):
            source = f"seed {r['seed']}: " + (
                f"= {hand_names[best['text']]}"
                if best["text"] in hand_names
                else f"found ({best['operator']})"
            )
            rows.append(_row(f"best of run seed {r['seed']}", source, s, best["search_accuracy"]))
        result = {
            "experiment": experiment,
            "model": model,
            "base_url": base_url if a.base_url else "embedded",
            "seeds": a.seeds,
            "max_llm_calls": cfg.runner.max_llm_calls,
            "search_items": task.search_items,
            "held_out_items": a.held_out,
            "held_out_seconds": round(time.monotonic() - started, 1),
            "runs": runs,
            "rows": rows,
            **({"baselines": info} if baselines else {}),
        }
        (a.out / "table.json").write_text(json.dumps(result, indent=2))
        print(markdown(result))
        return result
