"""CycleQD over agent skills: the problem families take turns as the quality, against a fixed objective.

Two arms, the same model-call budget each, three run seeds:

- **fixed**: agent_design as it is: the quality is the mean accuracy over both
  families (arithmetic, knights); cells are model calls per problem x code size.
- **cycleqd**: ``cycle=agent_skills``: in phase 0 the arithmetic accuracy is the
  quality and the knights accuracy the (1-D) cell; in phase 1 the other way
  round; the phase changes every ``cycle.every`` insertions, and the archive is
  rebuilt from the store each time (nothing is evaluated twice).

After each run its best agent (highest mean search accuracy, then fewer model
calls per problem, then the earliest) is scored on the held-out problems (other
templates), per family. Each row: held-out accuracy overall and per family, 95%
bootstrap intervals over the problems (each arm's row pools its seeds' best
agents), model calls per problem, and the best search accuracy each family
reached during the run. Written to ``<out>/cycle_table.json`` (the name the README cites beside
it); the Markdown is printed.

    python experiments/agent_design/cycle_table.py --seeds 0 1 2 --max-llm-calls 90
    python experiments/agent_design/cycle_table.py --base-url http://host:8000/v1 --model NAME

See ``qd.design_table`` for the options they share (``qd.tables``).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qd import tables
from qd.heldout import bootstrap, held_out_scores
from qd.plan import compose
from qd.store import Store
from qd.task import load_task, task_params

ARMS = {"fixed": [], "cycleqd": ["cycle=agent_skills"]}
FAMILIES = ("arithmetic", "knights")


def run_summary(run_dir: Path) -> dict[str, Any]:
    """The run's best agent by mean search accuracy (phase-independent) and each family's best."""
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        rows = [c for c in store.iter() if c.kind == "text" and c.valid and c.metrics]
    if not rows:
        return {"best": None, "skills": {f: math.nan for f in FAMILIES}, "evaluated": 0}
    best = max(rows, key=lambda c: (c.metrics["accuracy"], -c.metrics.get("calls_per_problem", 0.0), -c.id))
    return {
        "best": {
            "id": best.id,
            "text": best.text,
            "operator": best.operator,
            "search_accuracy": best.metrics["accuracy"],
        },
        "skills": {f: max(c.metrics.get(f, 0.0) for c in rows) for f in FAMILIES},
        "evaluated": len(rows),
    }


def family_scores(task: Any, scored: Any) -> dict[str, list[int]]:
    """The held-out 0/1 results of one agent, split by family ("all": every problem)."""
    correct = (scored.metrics or {}).get("correct") or [0] * len(task.held_out())
    out: dict[str, list[int]] = {"all": list(correct)}
    for p, ok in zip(task.held_out(), correct):
        out.setdefault(p.family, []).append(ok)
    return out


def row(
    arm: str,
    label: str,
    results: list[dict[str, list[int]]],
    calls: list[float],
    skills: list[dict[str, float]],
) -> dict[str, Any]:
    """One table row: pooled held-out accuracy (overall, per family) with bootstrap intervals."""
    out: dict[str, Any] = {"arm": arm, "runs": label}
    for part in ("all", *FAMILIES):
        pooled = [v for r in results for v in r.get(part, [])]
        out[part] = float(np.mean(pooled)) if pooled else math.nan
        out[f"{part}_ci95"] = list(bootstrap(pooled)) if pooled else [math.nan, math.nan]
    out["calls_per_problem"] = float(np.mean(calls)) if calls else math.nan
    out["search_best"] = {
        f: float(np.nanmax([s[f] for s in skills])) if skills else math.nan for f in FAMILIES
    }
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| arm | runs | held-out accuracy | arithmetic | knights | model calls / problem | "
        "best search accuracy (arithmetic / knights) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        cells = [f"{r[p]:.3f} [{r[p + '_ci95'][0]:.2f}, {r[p + '_ci95'][1]:.2f}]" for p in ("all", *FAMILIES)]
        lines.append(
            f"| {r['arm']} | {r['runs']} | {' | '.join(cells)} | {r['calls_per_problem']:.2f} | "
            f"{r['search_best']['arithmetic']:.2f} / {r['search_best']['knights']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = tables.arguments("agent_design", argv, __doc__, Path("outputs") / "agent_design" / "cycle_table", 16)
    with tables.model_server(a) as (base_url, model):
        shared = tables.shared_overrides("agent_design", a, base_url, model)
        runs = {arm: tables.run_seeds([*shared, *extra], a.seeds, a.out / arm) for arm, extra in ARMS.items()}
        summaries = {
            arm: [run_summary(a.out / arm / f"seed{r['seed']}") for r in rs] for arm, rs in runs.items()
        }
        cfg = compose(shared)
        task = load_task("agent_design", {**task_params(cfg.experiment), "held_out_items": a.held_out})
        found = [(arm, i, s) for arm, ss in summaries.items() for i, s in enumerate(ss) if s["best"]]
        client = tables.client_for(cfg, a, base_url, model)
        scores = asyncio.run(held_out_scores(cfg, task, [s["best"]["text"] for _, _, s in found], client))
        by_arm: dict[str, list] = {arm: [] for arm in ARMS}
        for (arm, i, s), scored in zip(found, scores):
            by_arm[arm].append(
                (
                    runs[arm][i]["seed"],
                    family_scores(task, scored),
                    (scored.metrics or {}).get("calls_per_problem", math.nan),
                    s,
                )
            )
        rows = []
        for arm, entries in by_arm.items():
            for seed, result, calls, s in entries:
                rows.append(row(arm, f"seed {seed}", [result], [calls], [s["skills"]]))
            rows.append(
                row(
                    arm,
                    f"{len(entries)} seeds pooled",
                    [e[1] for e in entries],
                    [e[2] for e in entries],
                    [e[3]["skills"] for e in entries],
                )
            )
        result = {
            "experiment": "agent_design",
            "variant": "cycleqd vs fixed",
            "model": model,
            "seeds": a.seeds,
            "max_llm_calls": cfg.runner.max_llm_calls,
            "held_out_items": a.held_out,
            "runs": {arm: rs for arm, rs in runs.items()},
            "best": {
                arm: [{k: v for k, v in (s["best"] or {}).items() if k != "text"} for s in ss]
                for arm, ss in summaries.items()
            },
            "rows": rows,
        }
        (a.out / "cycle_table.json").write_text(json.dumps(result, indent=2))
        print(markdown(result))
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
