"""The red_team table: QD (the technique x rule archive) against the same budget without an archive.

For each run seed, both arms run to the same ``runner.max_llm_calls`` (every call
counted: operators, target replies, tiebreak judge), from the same 12 seed attacks:

- **qd archive**: the experiment as configured (6 x 2 cells, technique x rule targeted).
- **no archive**: ``archive.bins=[1,1]``, one cell: the run keeps only its best attack
  and every parent is that attack (greedy hill climbing on the success rate, with
  the same operators, gate and tiebreak).

Reported per arm, over the attacks the operators wrote (founders and gate-rejected
or duplicate children left out): the attack success rate (the fraction that broke a
rule on at least one target variant) with a 95% bootstrap interval over the attacks
of all seeds; of the final archive, the elites and how many broke a rule; and the
cells covered: every successful attack placed on the same 6 x 2 technique x rule
grid, distinct cells per run, mean over seeds with a 95% bootstrap interval over
the seeds. The seed attacks' own row is the baseline. Everything goes to
``<out>/table.json``; the Markdown table is printed.

    python experiments/red_team/table.py --seeds 0 1 2 --max-llm-calls 80
    python experiments/red_team/table.py --base-url http://host:8000/v1 --model NAME

Without ``--base-url`` it starts the embedded llama.cpp server (SmolLM2-135M) once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from qd import tables
from qd.heldout import bootstrap
from qd.search.gate import evaluated
from qd.store import Store

ARMS = {"qd archive": [], "no archive": ["archive.bins=[1,1]"]}
GRID = 12  # technique x rule targeted cells


def attacks(run_dir: Path) -> list[Any]:
    """The run's attacks with an evaluation of their own (gate-rejected and duplicate children left out)."""
    with Store(run_dir / "store.sqlite", readonly=True) as store:
        return [c for c in store.iter() if c.kind == "text" and c.valid and evaluated(c)]


def cell(c: Any) -> tuple[int, int]:
    return int(c.metrics["technique"]), int(c.metrics["rule"])


def final_archive(rows: list[Any], single: bool) -> list[Any]:
    """The archive the run ended with, replayed: per cell the first attack with the highest fitness
    (a tiebreak win is stored one float32 step above the incumbent it beat)."""
    elites: dict[Any, Any] = {}
    for c in rows:
        key = () if single else cell(c)
        if key not in elites or c.fitness > elites[key].fitness:
            elites[key] = c
    return list(elites.values())


def success(c: Any) -> int:
    return int(c.metrics["success"])


def _interval(values: list[int | float]) -> list[float]:
    return list(bootstrap(values)) if values else [float("nan")] * 2


def arm_row(name: str, runs: list[dict]) -> dict:
    """One arm's numbers over its runs' attacks (children only)."""
    children = [c for r in runs for c in r["rows"] if c.operator != "init"]
    hits = [success(c) for c in children]
    covered = [len({cell(c) for c in r["rows"] if c.operator != "init" and success(c)}) for r in runs]
    elites = [c for r in runs for c in r["final"]]
    return {
        "arm": name,
        "attacks": len(children),
        "success_rate": float(np.mean(hits)) if hits else float("nan"),
        "success_ci95": _interval(hits),
        "final_archive": len(elites) / len(runs),
        "final_successful": sum(map(success, elites)) / len(runs),
        "cells_covered": float(np.mean(covered)),
        "cells_ci95": _interval(covered),
        "tiebreak_wins": sum(int((c.metrics or {}).get("tiebreak_won", 0)) for c in children),
    }


def seed_row(founders: list[Any]) -> dict:
    hits = [success(c) for c in founders]
    elites = final_archive(founders, single=False)
    return {
        "arm": "seed attacks",
        "attacks": len(founders),
        "success_rate": float(np.mean(hits)),
        "success_ci95": _interval(hits),
        "final_archive": len(elites),
        "final_successful": sum(map(success, elites)),
        "cells_covered": float(len({cell(c) for c in founders if success(c)})),
        "cells_ci95": [None, None],
        "tiebreak_wins": 0,
    }


def markdown(result: dict) -> str:
    def ci(pair: list) -> str:
        return "" if pair[0] is None else f"[{pair[0]:.2f}, {pair[1]:.2f}]"

    lines = [
        "| arm | attacks evaluated | success rate | 95% interval | final archive (successful) | "
        f"cells covered of {GRID} | 95% interval | tiebreak wins |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['arm']} | {r['attacks']} | {r['success_rate']:.3f} | {ci(r['success_ci95'])} | "
            f"{r['final_archive']:.1f} ({r['final_successful']:.1f}) | {r['cells_covered']:.2f} | "
            f"{ci(r['cells_ci95'])} | {r['tiebreak_wins']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    a = tables.arguments("red_team", argv, __doc__, held_out=None, max_llm_calls=80)  # every arm the same
    started = time.monotonic()
    with tables.model_server(a) as (base_url, model):
        shared = tables.shared_overrides("red_team", a, base_url, model)
        runs: dict[str, list[dict]] = {}
        for name, overrides in ARMS.items():
            out = a.out / name.replace(" ", "_")
            runs[name] = tables.run_seeds([*shared, *overrides], a.seeds, out)
            for r in runs[name]:
                r["rows"] = attacks(out / f"seed{r['seed']}")
                r["final"] = final_archive(r["rows"], single=bool(overrides))
        founders = [c for c in runs["qd archive"][0]["rows"] if c.operator == "init"]
        rows = [seed_row(founders), *(arm_row(name, arm_runs) for name, arm_runs in runs.items())]
        result = {
            "experiment": "red_team",
            "model": model,
            "base_url": a.base_url or "embedded",
            "seeds": a.seeds,
            "max_llm_calls": a.max_llm_calls,
            "seconds": round(time.monotonic() - started),
            "runs": [
                {
                    "arm": name,
                    "seed": r["seed"],
                    "llm_calls": r["llm_calls"],
                    "seconds": r["seconds"],
                    "attacks": len(r["rows"]),
                }
                for name, arm_runs in runs.items()
                for r in arm_runs
            ],
            "rows": rows,
        }
        (a.out / "table.json").write_text(json.dumps(result, indent=2))
        print(markdown(result))
        return result


if __name__ == "__main__":
    main()
