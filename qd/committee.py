"""``qd committee RUN_DIR``: does a committee of the run's diverse elites beat its best one?

Quality-diversity keeps many *different* good solutions; DEI's claim is that a committee of
diverse agents answers better than the best single agent. This command measures it on a
run's task's held-out problems (never seen during the run), read-only on the run:

1. the committee: ``--k`` elites picked by the ``diverse`` export's greedy farthest-point
   selection (the best elite first; the archive holds valid agents only; a Pareto run's
   members come from the union of its fronts), each answering
   every held-out problem in the sandbox through the host's client, with the run's
   evaluator, model and per-problem call budget (``qd.heldout.held_out_scores``);
   per problem, ``--rule vote`` takes the majority of the normalised answers (a tie: the
   answer of the fitter agent), ``--rule judge`` shows the model the question and the k
   answers and takes the one it names (one more call per problem, counted; an
   unusable reply falls back to the vote);
2. the best elite alone (its own answers);
3. k copies of the best elite, run with sampling seeds 0..k-1 and majority vote: the
   committee's call budget spent on the best agent only. An agent that samples at
   temperature 0 answers the same k times, and this row equals row 2.

Each row: accuracy, a 95% bootstrap interval over the problems, model calls per problem
(answered calls, the host's record). The task must offer held-out problems with
checkable answers (``held_out()``, ``answer_key(item, answer)``, ``answers_of(items,
answers)``: the agent_design and prompt_evolution tasks); other runs are refused.

    qd committee RUN_DIR [--k 5] [--rule vote|judge] [--held-out N] [--base-url URL --model NAME] [--json]

Without ``--base-url`` the embedded llama.cpp server (SmolLM2-135M) is started and stopped here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from qd import heldout
from qd.views import render

PROG = "qd committee"
NEEDS = ("held_out", "answer_key", "answers_of")  # what the task must offer


def vote(keys: list[str | None]) -> str | None:
    """The most common answer (None: no answer, never counted); a tie goes to the earliest
    (fitter) member among the tied."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(k for k in keys if k is not None and counts[k] == top)


def judge_prompt(question: str, keys: list[str | None]) -> str:
    """The question and the members' answers as the checker reads them (short, not the agents'
    working), numbered: the reply is one number, which even a small model can give."""
    listed = "\n".join(f"{i}. {k if k is not None else '(no answer)'}" for i, k in enumerate(keys, 1))
    return (
        f"Question: {question}\n\nCandidate answers:\n{listed}\n\n"
        "Which candidate answer is correct? Reply with its number only."
    )


async def judged(client: Any, question: str, keys: list[str | None]) -> tuple[str | None, bool]:
    """(the answer the model names, whether a call was answered); the vote when the reply names none."""
    from qd.contract import LLMError

    try:
        reply = await client.complete(
            [{"role": "user", "content": judge_prompt(question, keys)}],
            temperature=0.0,
            max_tokens=8,
            role="judge",
        )
    except LLMError:
        return vote(keys), False
    found = re.search(r"\d+", reply.text)
    pick = int(found.group()) if found else 0
    return (keys[pick - 1] if 1 <= pick <= len(keys) else vote(keys)), True


def _keys(task: Any, items: list[Any], scored: Any) -> list[str | None]:
    """An agent's normalised answer per problem (all None when its evaluation failed)."""
    raw = (scored.metrics or {}).get("answers") if scored.valid else None
    return [task.answer_key(p, a) for p, a in zip(items, raw)] if raw else [None] * len(items)


def _calls(scored: Any, n: int) -> float:
    """Model calls per problem that reached the model (a failed evaluation: its counted calls)."""
    m = scored.metrics or {}
    return float(m.get("calls_per_problem", m.get("model_calls", 0) / n))


def _correct(task: Any, items: list[Any], keys: list[str | None]) -> list[int]:
    """1 per problem whose answer the task's checker accepts."""
    return [int(c) for c in task.answers_of(items, [{"answer": k} for k in keys])]


def _row(task: Any, items: list[Any], name: str, agents: str, keys: list[str | None], calls: float) -> dict:
    correct = _correct(task, items, keys)
    return {
        "row": name,
        "agents": agents,
        "accuracy": float(np.mean(correct)),
        "ci95": list(heldout.bootstrap(correct)),
        "calls_per_item": calls,
        "correct": correct,
    }


async def measure(cfg: Any, task: Any, members: list[dict], client: Any, rule: str) -> dict:
    """The three rows for ``members`` (``diverse`` rows) on ``task``'s held-out problems."""
    from qd.llm import LLMClient

    items = task.held_out()
    n, k = len(items), len(members)
    members = sorted(members, key=lambda m: (-m["fitness"], m["id"]))  # fitter first: who wins a tie
    seeded = [LLMClient(dataclasses.replace(client.settings, seed=s)) for s in range(1, k)]
    try:
        own, *copies = await asyncio.gather(
            heldout.held_out_scores(cfg, task, [m["text"] for m in members], client),
            *(heldout.held_out_scores(cfg, task, [members[0]["text"]], c) for c in seeded),
        )
        keys = [_keys(task, items, s) for s in own]
        per_item = [list(votes) for votes in zip(*keys)]
        judge_calls = 0
        if rule == "vote":
            combined = [vote(v) for v in per_item]
        else:
            picks = await asyncio.gather(*(judged(client, p.question, v) for p, v in zip(items, per_item)))
            combined = [key for key, _ in picks]
            judge_calls = sum(called for _, called in picks)
    finally:
        for c in seeded:
            await c.aclose()
        await client.aclose()
    copies = [own[0], *(c[0] for c in copies)]
    copy_keys = [_keys(task, items, s) for s in copies]
    best = f"id {members[0]['id']}"
    rows = [
        _row(
            task,
            items,
            f"committee ({rule})",
            ", ".join(f"id {m['id']}" for m in members),
            combined,
            sum(_calls(s, n) for s in own) + judge_calls / n,
        ),
        _row(task, items, "best elite", best, keys[0], _calls(own[0], n)),
        _row(
            task,
            items,
            f"{k} copies of the best (vote)",
            f"{best} x{k}, seeds 0..{k - 1}",
            [vote(list(v)) for v in zip(*copy_keys)],
            sum(_calls(s, n) for s in copies),
        ),
    ]
    agents = [
        {
            "id": m["id"],
            "search_fitness": m["fitness"],
            "min_distance": m["min_distance"],
            "held_out_accuracy": float(np.mean(_correct(task, items, ks))),
            "calls_per_item": _calls(s, n),
            "error": s.error,
        }
        for m, s, ks in zip(members, own, keys)
    ]
    return {
        "rule": rule,
        "k": k,
        "held_out_items": n,
        "judge_calls": judge_calls,
        "members": agents,
        "rows": rows,
    }


def _task(cfg: Any, path: Path, held_out: int) -> Any:
    """The run's task with ``held_out`` held-out problems, or a one-line refusal."""
    from qd.contract import ConfigError
    from qd.task import load_task, task_params

    name = cfg.experiment.task
    params = task_params(cfg.experiment)
    try:
        task = load_task(name, params)
        missing = [need for need in NEEDS if not callable(getattr(task, need, None))]
        if missing:
            render.fail(
                PROG,
                f"RUN_DIR {path}: its task {name!r} offers no held-out problems with checkable "
                f"answers (no {', '.join(missing)}); pass an agent_design or prompt_evolution run",
            )
        task = load_task(name, {**params, "held_out_items": held_out})
    except ConfigError as e:
        render.fail(PROG, f"RUN_DIR {path}: its task {name!r} cannot be loaded: {e}")
    return task


def main(argv: list[str]) -> None:
    """Reads the run (never writes it), answers with the model and prints the table (or ``--json``)."""
    ap = render.parser(
        PROG,
        "Does a committee of the run's diverse elites beat its best one? "
        "Measured on held-out problems (DEI).",
    )
    ap.add_argument("run_dir")
    ap.add_argument("--k", type=render.positive, default=5, help="committee size (default 5)")
    ap.add_argument(
        "--rule", choices=("vote", "judge"), default="vote", help="how answers combine (default vote)"
    )
    ap.add_argument("--held-out", type=render.positive, default=24, help="held-out problems (default 24)")
    ap.add_argument(
        "--base-url", default=None, help="an OpenAI-compatible server (default: the embedded one)"
    )
    ap.add_argument("--model", default=None, help="the model name on --base-url")
    ap.add_argument("--api-key-env", default=None, help="the variable holding --base-url's key")
    ap.add_argument("--json", action="store_true", help="the whole result as JSON")
    args = ap.parse_args(argv)
    if (args.base_url is None) != (args.model is None):
        render.fail(PROG, "--base-url and --model go together: pass both, or neither for the embedded model")
    run = render.open_run(PROG, args.run_dir)
    cfg = run.config()
    task = _task(cfg, run.path, args.held_out)
    from qd.export import diverse

    members = list(diverse.rows(run, {"k": args.k}))
    if len(members) < args.k:
        render.fail(
            PROG,
            f"--k {args.k}: {run.path} has {len(members)} elites; pass --k {max(1, len(members))} or less"
            if members
            else f"RUN_DIR {run.path} has no elites yet",
        )
    with tempfile.TemporaryDirectory(prefix="qd-committee-") as out:  # the server log and response cache
        with heldout.model_server(args.base_url, args.model, Path(out)) as (base_url, model):
            client = heldout.scoring_client(cfg, base_url, model, args.api_key_env, Path(out) / "llm_cache")
            result = asyncio.run(measure(cfg, task, members, client, args.rule))
    result = {"run": str(run.path), "model": model, **result}
    if args.json:
        render.dump(result)
        return
    show(result)


def show(result: dict) -> None:
    """The rows, then the members, as tables."""
    render.table(
        f"{PROG} {result['run']}: {result['k']} diverse elites, rule {result['rule']}, "
        f"{result['held_out_items']} held-out problems, model {result['model']}",
        ["row", "agents", "accuracy", "95% interval", "model calls / problem"],
        [[r["row"], r["agents"], r["accuracy"], r["ci95"], r["calls_per_item"]] for r in result["rows"]],
    )
    render.table(
        "members (fitter first)",
        ["id", "search fitness", "held-out accuracy", "calls / problem", "error"],
        [
            [m["id"], m["search_fitness"], m["held_out_accuracy"], m["calls_per_item"], m["error"]]
            for m in result["members"]
        ],
    )
