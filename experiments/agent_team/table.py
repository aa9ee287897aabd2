"""The agent_team table: the best team each run found vs the single expert it started from vs the best
hand-designed agent of agent_design, on held-out problems, with model calls per problem.

    python experiments/agent_team/table.py --seeds 0 1 2 --max-llm-calls 40 --held-out 12
    python experiments/agent_team/table.py --base-url http://host:8000/v1 --model NAME --max-llm-calls 2000

Each seed runs ``experiment=agent_team`` to the same model-call budget (``--max-llm-calls``).
Then, with the run's per-problem call budget (``eval_llm.calls / search_items``) for every design:
the best team of each run and the single expert (the founder) are scored on the held-out problems;
the hand-designed agents of ``experiments/agent_design/seeds.py`` (Python agents, run in the sandbox
by agent_design's own entry) are scored on the search problems, and the best of them (accuracy, then
fewer calls per problem, then the first) on the held-out problems. Held-out accuracy has a 95%
bootstrap interval over the problems. Everything goes to ``<out>/table.json`` (the model calls spent
choosing the hand-designed agent under ``baselines``); the Markdown table is printed. Without
``--base-url`` the embedded llama.cpp server (SmolLM2-135M) is started once. The rest is
``qd.design_table``'s.
"""

from __future__ import annotations

import sys
from typing import Any

from qd import design_table
from qd.heldout import held_out_scores
from qd.task import load_task


async def best_hand_designed_agent(cfg: Any, task: Any, client: Any, held_out: int) -> tuple[list, dict]:
    """agent_design's hand-designed agents chosen on the search problems, the best one scored held out,
    all with this run's per-problem call budget (the same search and held-out problems as the teams')."""
    agents = load_task(
        "agent_design",
        {"search_items": task.search_items, "held_out_items": held_out, "problem_seed": task.problem_seed},
    )
    hand = agents.hand_designed()
    search = await held_out_scores(cfg, agents, [text for _, text in hand], client, split="search")

    def calls(s) -> float:
        return (s.metrics or {}).get("calls_per_problem", 0.0)

    ranked = [(s.fitness if s.valid else 0.0, -calls(s), -i) for i, s in enumerate(search)]
    best = max(range(len(hand)), key=ranked.__getitem__)
    scored = (await held_out_scores(cfg, agents, [hand[best][1]], client))[0]
    info = {
        "search": {
            name: {"accuracy": r[0], "calls_per_problem": -r[1]} for (name, _), r in zip(hand, ranked)
        },
        "chosen": hand[best][0],
        "search_calls": round(sum(calls(s) for s in search) * task.search_items),
    }
    row = (f"best hand-designed agent: {hand[best][0]}", "agent_design/seeds.py", scored, ranked[best][0])
    return [row], info


if __name__ == "__main__":
    design_table.main("agent_team", sys.argv[1:], baselines=best_hand_designed_agent, doc=__doc__)
