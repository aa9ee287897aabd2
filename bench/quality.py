#!/usr/bin/env python
"""Search quality per model call, side by side: qd, its variants, its peers and two controls on
three tasks, one model server, one budget.

Systems (rows): ``qd`` (the task's defaults), ``qd+memory`` (``memory=on``; on the prompt task
``qd.optimize(memory=True)``, the same group), ``qd+agent`` (``operators=llm_agent``; on the
prompt task ``qd.optimize(operators=("rewrite", "agent"))``) -- a variant whose config is missing
from this checkout gets a "not available" row --, ``openevolve`` (OpenEvolve 0.4.1), ``gepa``
(GEPA 0.1.4), ``shinka`` (ShinkaEvolve), and the controls ``best-of-N`` and ``restarts``
(``bench/quality_systems.py``). Tasks: ``function_fit``, OpenEvolve's ``function_minimization``
example and ``prompt`` (arith60 through ``qd.optimize``) (``bench/quality_tasks.py``). Where a
system cannot run a task, its row says why.

Setup: one embedded SmolLM2 server (``qd.llm.server.EmbeddedServer``) shared by every run, one
run at a time, each in a fresh child process (qd and the controls in this interpreter, the
peers in ``--peer-python``'s: ``bench/quality_peers.py``). LLM calls are counted by the server
(its access log), alike for all. The budget (``--calls``, 40) is what each system's own limit
counts: model calls for the code tasks (qd's ``runner.max_llm_calls``, OpenEvolve's
iterations, ShinkaEvolve's LLM client, which answers no more once they are made, GEPA's
proposals, the controls' samples); for the prompt task (``--prompt-calls``, 80) every call,
the proposer's and the evaluation's on the dataset rows (qd's ``llm_calls`` budget counts both,
and so does best-of-N, which asks for a child only while it and its evaluation fit;
GEPA is stopped when its reflection and task calls reach it, checked between its iterations, so
it may overshoot by one iteration's calls: its row shows the calls it made; OpenEvolve and
ShinkaEvolve score each prompt on the validation rows, ``bench/quality_tasks.py::score_prompt``,
and propose only what fits with its scoring: ``bench/quality_peers.py``). 80, twice the code
tasks' budget because a prompt's evaluation is itself calls (a proposal and its evaluation cost
about 7), keeps the prompt runs at ~5 minutes each on 2 cores; 400 (the first runs) took 24.
The held-out scoring's calls come after the run and are not counted.

Measured per run: the held-out best (function_fit: -RMSE on the 64 held-out points of the best
program; function_minimization: the best ``combined_score``; prompt: the test split's accuracy
of the best prompt, scored by ``DatasetTask.heldout`` on the same server for every system), the
QD score on one grid per task over every valid program of the run (seeds included), the valid
fraction of the model-written programs, calls and wall time. Per system x task: the median
and the min-max over seeds.

Resumable: each finished run appends one line to ``--jsonl``; a rerun skips the runs already
there (key: system, task, seed, budget, server), so the bench runs across sessions.

Usage::

    python bench/quality.py --peer-python /work/venv-peers/bin/python \\
        --oe-example OPENEVOLVE_REPO/examples/function_minimization --seeds 0 1 2 3 4
    python bench/quality.py --render --results bench/RESULTS.md        # report the JSON-lines file
    python bench/quality.py --quick --jsonl /tmp/q.jsonl              # scripted server, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT):  # ROOT first: bench/descriptors.py must not shadow the package
    with contextlib.suppress(ValueError):
        sys.path.remove(str(_p))
    sys.path.insert(0, str(_p))

from _search_runs import calls_in_log, code_descriptor, grid_quality, run_child  # noqa: E402
from quality_tasks import TASKS, BenchTask, bench_task, best_seed, prompt_descriptor, prompt_task, scorer  # noqa: E402

TITLE = "## Search quality per model call: qd, its variants, peers and controls (bench/quality.py)"
JSONL = HERE / "quality_runs.jsonl"
# --quick: the runs it makes (task -> systems), each cheap on the scripted server: qd and both
# controls on function_fit, ShinkaEvolve and GEPA there too, the qd.optimize switches of the two
# variants, best-of-N, OpenEvolve and ShinkaEvolve on the prompt task (the peers given
# --peer-python)
QUICK_RUNS = {
    "function_fit": ("qd", "best-of-N", "restarts", "shinka", "gepa"),
    "prompt": ("qd+memory", "qd+agent", "best-of-N", "openevolve", "shinka"),
}
QUICK_PROMPT_CALLS = 60


@dataclasses.dataclass(frozen=True)
class System:
    """A row: where it runs (``qd``, ``control``, ``peer``), the tasks it can run (others: why
    not), and for a qd variant its overrides, the config file they need and the same switch as
    ``qd.optimize``'s arguments (the prompt task)."""

    runs: str
    tasks: dict[str, str | None]  # task -> None (runs) or why it does not
    variant: tuple[str, ...] = ()
    needs: str | None = None
    optimize: tuple[tuple[str, Any], ...] = ()  # qd.optimize's keyword arguments of the variant


_ONE_SAMPLE = (
    "with one seed prompt and qd.optimize's one operator (rewrite), a restart is a best-of-N sample: "
    "see best-of-N's row"
)
SYSTEMS = {
    "qd": System("qd", dict.fromkeys(TASKS)),
    "qd+memory": System("qd", dict.fromkeys(TASKS), ("memory=on",), "memory/on.yaml", (("memory", True),)),
    "qd+agent": System(
        "qd",
        dict.fromkeys(TASKS),
        ("operators=llm_agent",),
        "operators/llm_agent.yaml",
        (("operators", ("rewrite", "agent")),),
    ),
    "openevolve": System("peer", dict.fromkeys(TASKS)),
    "gepa": System("peer", dict.fromkeys(TASKS)),
    "shinka": System("peer", dict.fromkeys(TASKS)),
    "best-of-N": System("control", dict.fromkeys(TASKS)),
    "restarts": System("control", {**dict.fromkeys(TASKS), "prompt": _ONE_SAMPLE}),
}


def why_not(name: str, task: str, tasks: dict[str, BenchTask | str], peer_python: str | None) -> str | None:
    """None if ``name`` runs ``task`` here, else the reason its row gives."""
    from qd.paths import conf_dir

    system = SYSTEMS[name]
    if system.needs and not (conf_dir() / system.needs).is_file():
        return f"not available in this checkout (no conf/{system.needs})"
    if system.tasks[task]:
        return system.tasks[task]
    if isinstance(tasks[task], str):
        return tasks[task]
    if system.runs == "peer" and not peer_python:
        return "no --peer-python (the peers run in their own venv)"
    return None


def pairs_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The bench's (task, system) pairs: every selected system on every selected task, or
    ``QUICK_RUNS`` for ``--quick``."""
    return [(t, s) for t in args.tasks for s in args.systems if not args.quick or s in QUICK_RUNS.get(t, ())]


def budget_of(task: str, args: argparse.Namespace) -> int:
    """A run's call budget: ``--calls`` for a code task, ``--prompt-calls`` for the prompt task
    (whose every evaluation calls the model on the rows: qd counts those calls in its budget too)."""
    return args.prompt_calls if task == "prompt" else args.calls


def run_key(line: dict[str, Any]) -> tuple:
    return (line["system"], line["task"], line["seed"], line["budget"], line["server"])


def done_keys(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    return {run_key(json.loads(ln)) for ln in path.read_text().splitlines() if ln.strip()}


# ----- one run ----------------------------------------------------------------------------------


def _sampling() -> dict[str, Any]:
    from qd.plan import compose

    cfg = compose(["experiment=function_fit"])
    return {
        "temperature": cfg.llm.temperature,
        "max_tokens": cfg.llm.max_tokens,
        "timeout_s": cfg.llm.timeout_s,
        "concurrency": cfg.llm.concurrency,
    }


def _prompt_params(seed: int, budget: int) -> dict[str, Any]:
    """What a peer is given of the prompt task for this run seed: qd.optimize's train and
    validation rows of arith60 (GEPA's trainset and valset), its description (OpenEvolve's and
    ShinkaEvolve's system message), the grid's axes, the calls a prompt's scoring takes
    (ShinkaEvolve's LLM gate counts them) and how many proposals fit in the budget when each is
    scored (the seed's scoring first): OpenEvolve's iterations."""
    t = prompt_task(seed)
    as_dicts = lambda rows: [{"input": r.input, "answer": r.answer} for r in rows]  # noqa: E731
    scoring = len(t.splits.validation) * t.calls_per_row
    return {
        "train": as_dicts(t.splits.train),
        "validation": as_dicts(t.splits.validation),
        "description": t.description,
        "features": ["words", "lines"],
        "proposals": max(0, (budget - scoring) // (1 + scoring)),
        "scoring": scoring,
    }


def one_run(
    name: str, task: BenchTask, seed: int, args: argparse.Namespace, server: Any, count: Callable
) -> dict[str, Any]:
    """A finished run's JSON line (the child's programs scored on the task's grid)."""
    system = SYSTEMS[name]
    budget = budget_of(task.name, args)
    params = {
        "system": name,
        "task": task.name,
        "seed": seed,
        "calls": budget,
        "base_url": server.base_url,
        "model": server.model,
        "seeds": list(task.seeds),
        "start": best_seed(task) if system.runs == "peer" else None,
        "variant": list(system.variant),
        "optimize": dict(system.optimize),
        "description": task.description,
        "bins": task.grid["bins"],
        "worst": -100.0 if task.name == "function_fit" else 0.0,
        **_sampling(),
        "features": ["nodes", "constants"],
        "proposals": budget,
        "scoring": 0,
        "score": [sys.executable, __file__, "--_score", task.name, str(args.oe_example)],
        "score_timeout_s": 90,
    }
    if task.name == "prompt":
        params.update(_prompt_params(seed, budget))
        server_of = {k: params[k] for k in ("seed", "model", "base_url")}
        params.update(
            score=[sys.executable, __file__, "--_score_prompt", json.dumps(server_of)], score_timeout_s=600
        )
    command = (
        [args.peer_python, str(HERE / "quality_peers.py"), name]
        if system.runs == "peer"
        else [sys.executable, __file__, "--_child", name, task.name, str(args.oe_example)]
    )
    timeout = budget * args.per_call_timeout + 600
    r = run_child(name, params, count, timeout, command)
    describe = prompt_descriptor if task.name == "prompt" else code_descriptor
    grid = grid_quality(r["programs"], task.grid, describe)
    llm = [p for p in r["programs"] if p["llm"]]
    heldout = grid["best"]
    if task.name == "prompt":
        heldout, best_prompt = r.get("heldout"), r.get("best_prompt") or grid["best_text"]
        if heldout is None and best_prompt:
            held = run_child(
                "heldout",
                {**params, "best_prompt": best_prompt},
                count,
                timeout,
                [sys.executable, __file__, "--_child", "heldout", task.name, str(args.oe_example)],
            )
            heldout = held["heldout"]
    return {
        "system": name,
        "task": task.name,
        "seed": seed,
        "budget": budget,
        "server": args.server_name,
        "heldout_best": heldout,
        "qd_score": grid["qd_score"],
        "cells": grid["cells"],
        "best_seed": grid["best_seed"],
        "valid_frac": (sum(p["valid"] for p in llm) / len(llm)) if llm else None,
        "programs": grid["programs"],
        "calls": r["calls"] - r.get("heldout_calls", 0),
        "failed_calls": r["failed_calls"],
        "budget_calls": r.get("budget_calls", r["calls"]),
        "wall_s": r["wall_s"],
        "proc_s": r["proc_s"],
        "load": r["load"],
        "best_text": grid["best_text"],
        "stop_reason": r.get("stop_reason"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


@contextlib.contextmanager
def model_server(quick: bool) -> Iterator[tuple[Any, Callable[[], tuple[int, int]]]]:
    """The shared server and its call counter: the embedded SmolLM2 (its access log), or for
    ``--quick`` the scripted server of the tests answering every prompt with a valid program."""
    if quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from scripted_llm import Rule, ScriptedLLM

        with ScriptedLLM([Rule("", scripted_program)]) as server:
            server.model = "scripted"
            yield server, lambda: (server.stats()["requests"], 0)
        return
    from _search_runs import start_server

    server, log, *_ = start_server("qd_quality_")
    try:
        yield server, lambda: calls_in_log(log)
    finally:
        server.stop()


def scripted_program(body: dict) -> str:
    """A valid function_fit program whose constant follows the prompt's length (so they differ),
    submitted with the agent's tool line when the agent operator asks; asked for a markdown file
    (ShinkaEvolve's prompt task), a prompt between its markers."""
    k = sum(len(m.get("content") or "") for m in body["messages"]) % 7
    if any("```markdown" in (m.get("content") or "") for m in body["messages"]):
        prompt = f"Solve it; answer with the number only ({k})."
        return f"```markdown\n<!-- EVOLVE-BLOCK-START -->\n{prompt}\n<!-- EVOLVE-BLOCK-END -->\n```"
    program = f"```python\ndef f(x):\n    return x * x + 0.5 * x + {k}\n```"
    agent = any("TOOL: submit" in (m.get("content") or "") for m in body["messages"])
    return f"TOOL: submit\n{program}" if agent else program


def run_all(args: argparse.Namespace) -> None:
    tasks = {t: bench_task(t, args.oe_example) for t in args.tasks}
    done = done_keys(args.jsonl)
    todo = [
        (seed, t, s)
        for seed in args.seeds
        for t, s in pairs_of(args)
        if why_not(s, t, tasks, args.peer_python) is None
        and (s, t, seed, budget_of(t, args), args.server_name) not in done
    ]
    print(f"{len(todo)} runs to do ({len(done)} done in {args.jsonl})", flush=True)
    if not todo:
        return
    with model_server(args.quick) as (server, count):
        for seed, t, s in todo:
            try:
                line = one_run(s, tasks[t], seed, args, server, count)
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                print(f"!! {s} {t} seed {seed}: {str(e)[-3000:]}", flush=True)
                continue
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(line, default=float) + "\n")
            print(
                f"{s} {t} seed {seed}: best {line['heldout_best']}, QD {line['qd_score']:.2f}, "
                f"{line['calls']} calls, {line['wall_s']:.0f} s",
                flush=True,
            )


# ----- the report -------------------------------------------------------------------------------


def _fmt(x: Any, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _spread(xs: list[Any], nd: int = 3) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    med = statistics.median(xs)
    return _fmt(float(med), nd) + (
        f" [{_fmt(float(min(xs)), nd)}, {_fmt(float(max(xs)), nd)}]" if len(xs) > 1 else ""
    )


def summarize(lines: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per system x task: the medians and ranges, or why the system did not run it."""
    tasks = {t: bench_task(t, args.oe_example) for t in args.tasks}
    rows = []
    for t, s in pairs_of(args):
        runs = [ln for ln in lines if ln["system"] == s and ln["task"] == t]
        row: dict[str, Any] = {
            "system": s,
            "task": t,
            "runs": len(runs),
            "seeds": [r["seed"] for r in runs],
        }
        if runs:
            row.update(
                {
                    "heldout_best": _spread([r["heldout_best"] for r in runs]),
                    "best_seed": _spread([r["best_seed"] for r in runs]),
                    "qd_score": _spread([r["qd_score"] for r in runs], 2),
                    "valid_frac": _spread([r["valid_frac"] for r in runs], 2),
                    "calls": _spread([r["calls"] for r in runs], 0),
                    "budget_calls_max": max(r["budget_calls"] or 0 for r in runs),
                    "wall_s": _spread([r["wall_s"] for r in runs], 0),
                    "beat_seeds": beat_seeds(
                        runs, tasks[t].seeds if isinstance(tasks[t], BenchTask) else None
                    ),
                }
            )
        else:
            row["why_not"] = why_not(s, t, tasks, args.peer_python) or "not run yet"
        rows.append(row)
    return rows


def beat_seeds(runs: list[dict[str, Any]], seeds: tuple[str, ...] | None) -> str:
    """How many runs' best is a new program (not one of the task's ``seeds``, whitespace aside)
    that beats their best seed program on the held-out measure (``k of n``); "-" for the prompt
    task, whose held-out best (test accuracy) and seed score (the grid's fitness) are not on one
    scale. A seed scored twice by a noisy scorer does not count: a task where no run's best is a
    new, better program does not rank the systems, their spread is the scorer's."""
    if seeds is None or not runs or runs[0]["task"] == "prompt":
        return "-"  # (``seeds`` None: the task is not available here, so its seeds are unknown)
    known = {" ".join(text.split()) for text in seeds}
    new = [
        r["heldout_best"] > r["best_seed"] and " ".join((r["best_text"] or "").split()) not in known
        for r in runs
        if r["heldout_best"] is not None and r["best_seed"] is not None
    ]
    return f"{sum(new)} of {len(new)}" if new else "-"


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


VARIANTS = {"qd+memory": "memory (`memory=on`)", "qd+agent": "the agent operator"}


def switch_effects(lines: list[dict[str, Any]]) -> dict[str, tuple[list[tuple], bool | None]]:
    """Per qd variant: (task, seeds both ran, its median held-out best, qd's, its median QD score,
    qd's) for each task both ran, and whether it pays (None: nothing compared). A switch pays where
    its medians are >= qd's on every task measured, one of them above: the rule the defaults follow."""
    out = {}
    for variant in VARIANTS:
        compared = []
        for task in TASKS:
            base = {r["seed"]: r for r in lines if r["system"] == "qd" and r["task"] == task}
            mine = {r["seed"]: r for r in lines if r["system"] == variant and r["task"] == task}
            seeds = sorted(base.keys() & mine.keys())
            medians = [
                _median_of([runs[s] for s in seeds], key)
                for key in ("heldout_best", "qd_score")
                for runs in (mine, base)
            ]
            if seeds and None not in medians:
                compared.append((task, len(seeds), *medians))
        pays = None
        if compared:
            at_least = all(h >= qh and q >= qq for _, _, h, qh, q, qq in compared)
            pays = at_least and any(h > qh or q > qq for _, _, h, qh, q, qq in compared)
        out[variant] = (compared, pays)
    return out


def effects(lines: list[dict[str, Any]]) -> list[str]:
    """What each qd variant changed against qd, task by task (medians over the seeds both ran),
    and whether it paid everywhere (:func:`switch_effects`): the evidence the defaults follow."""
    out = []
    for variant, (compared, pays) in switch_effects(lines).items():
        what = VARIANTS[variant]
        for task, n, held, qd_held, score, qd_score in compared:
            out.append(
                f"- {what}, {task} ({n} seeds both ran): held-out best {held:.3f} vs qd's "
                f"{qd_held:.3f}, QD score {score:.2f} vs {qd_score:.2f}"
            )
        if pays is not None:
            verdict = "pays" if pays else "does not pay"
            measured = f"({len(compared)} of {len(TASKS)} tasks)"
            out.append(f"- so {what} {verdict} on every task measured {measured}")
    return out


def ahead_of_qd(lines: list[dict[str, Any]]) -> list[str]:
    """Per task, the systems whose median held-out best or QD score is above qd's, with both
    valid fractions: where the goal (qd first on both) is missed, and the first thing to read."""
    out = []
    for task in TASKS:
        runs = {s: [r for r in lines if r["task"] == task and r["system"] == s] for s in SYSTEMS}
        if not runs["qd"]:
            continue
        qd = {k: _median_of(runs["qd"], k) for k in ("heldout_best", "qd_score", "valid_frac")}
        ahead = []
        for system, mine in runs.items():
            m = {k: _median_of(mine, k) for k in qd} if mine and system != "qd" else None
            if m is None or None in (m["heldout_best"], m["qd_score"], qd["heldout_best"], qd["qd_score"]):
                continue
            above = [k for k in ("heldout_best", "qd_score") if m[k] > qd[k]]
            if above:
                valid = "-" if m["valid_frac"] is None else f"{m['valid_frac']:.2f}"
                ahead.append(f"{system} ({', '.join(above)}; valid {valid})")
        qd_valid = "-" if qd["valid_frac"] is None else f"{qd['valid_frac']:.2f}"
        out.append(
            f"- {task}: "
            + (f"ahead of qd (valid {qd_valid}): {'; '.join(ahead)}" if ahead else "no system ahead of qd")
        )
    return out


def defaults_line(lines: list[dict[str, Any]]) -> str:
    """qd's defaults for the two switches (``conf/config.yaml`` as composed) and whether they
    follow the verdicts of :func:`switch_effects`."""
    import inspect

    from qd.optimizer import optimize
    from qd.plan import compose

    cfg, call = compose([]), inspect.signature(optimize).parameters
    memory_on = bool(cfg.memory.children or cfg.memory.lessons_every or call["memory"].default)
    agent_on = "agent" in call["operators"].default or any(
        op.name == "agent" for ops in cfg.operators.values() for op in ops
    )
    pays = {variant: bool(paid) for variant, (_, paid) in switch_effects(lines).items()}
    follows = [memory_on == pays["qd+memory"], agent_on == pays["qd+agent"]]
    state = lambda on: "on" if on else "off"  # noqa: E731
    return (
        f"Defaults chosen from it (`qd-run` with no overrides, `conf/config.yaml`, and `qd.optimize`'s "
        f"arguments): memory {state(memory_on)}, the agent operator {state(agent_on)}: "
        + ("each follows its verdict above." if all(follows) else "**a verdict above disagrees with them.**")
    )


def report(args: argparse.Namespace) -> list[dict[str, Any]]:
    lines = [json.loads(ln) for ln in args.jsonl.read_text().splitlines() if ln.strip()]
    lines = [
        ln for ln in lines if ln["budget"] == budget_of(ln["task"], args) and ln["server"] == args.server_name
    ]
    rows = summarize(lines, args)
    table = [
        "| task | system | runs (seeds) | held-out best: median [min, max] | its best seed program "
        "| runs beating their seeds | QD score | valid / model-written | server calls | budget calls (max) "
        "| wall s |",
        "|---|---|---|---|---|---|---|---|---|---:|---|",
    ]
    for r in rows:
        if r["runs"]:
            table.append(
                f"| {r['task']} | {r['system']} | {r['runs']} ({' '.join(map(str, r['seeds']))}) | "
                f"{r['heldout_best']} | {r['best_seed']} | {r['beat_seeds']} | {r['qd_score']} | "
                f"{r['valid_frac']} | "
                f"{r['calls']} | {r['budget_calls_max']} | {r['wall_s']} |"
            )
        else:
            table.append(f"| {r['task']} | {r['system']} | 0 | {r['why_not']} | | | | | | | |")
    print("\n".join(table))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": lines}, indent=1, default=float))
    if args.results:
        _write_results(args, lines, table)
    return rows


def _median_wall(lines: list[dict[str, Any]], code: bool) -> float:
    walls = [ln["wall_s"] for ln in lines if (ln["task"] != "prompt") == code]
    return statistics.median(walls) if walls else float("nan")


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _write_results(args: argparse.Namespace, lines: list[dict[str, Any]], table: list[str]) -> None:
    from _results import commit, versions, write_section

    seeds = sorted({ln["seed"] for ln in lines})
    tasks = {t: bench_task(t, args.oe_example) for t in args.tasks}
    runnable = [(t, s) for t, s in pairs_of(args) if why_not(s, t, tasks, args.peer_python) is None]
    planned = len(runnable) * len(args.seeds)
    loads = [x for ln in lines for x in ln["load"]] or [0.0]
    section = [
        TITLE,
        "",
        f"- Command: `{args.command}`; runs from `{_shown(args.jsonl)}` (one JSON line per "
        f"finished run; a rerun skips them), commit {commit()}",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {len(lines)} runs, "
        f"seeds done: {' '.join(map(str, seeds)) or 'none'}",
        f"- Machine: {os.cpu_count()} cores ({platform.machine()}), shared; 1-min load {min(loads)}-"
        f"{max(loads)} around the runs (wall time depends on it; quality after a fixed number of calls "
        "does not).",
        f"- Whole bench: {sum(ln['wall_s'] for ln in lines) / 3600:.1f} h of runs, one at a time "
        "(the goal is 3 h on 2 cores; a code task's run took a median of "
        f"{_median_wall(lines, code=True):.0f} s, a prompt run {_median_wall(lines, code=False):.0f} s: "
        "SmolLM2 writes code at a few seconds per answer on 2 cores, and the peers' runs include their "
        "own start-up).",
        f"- Versions: {versions('jax', 'llama_cpp_python', 'openai')}; peers in their own venv: "
        "openevolve 0.4.1, gepa 0.1.4, shinka-evolve 0.0.7",
        f"- Budget {args.calls} calls per run on one "
        f"{'scripted' if args.quick else 'embedded SmolLM2-135M (n_ctx 2048)'} server, one run at a time; "
        "setup, systems, tasks and the scoring in the docstrings of `bench/quality.py`, "
        "`bench/quality_tasks.py`, `bench/quality_systems.py`, `bench/quality_peers.py`. "
        "`function_minimization` is OpenEvolve's example from its repository (`--oe-example`; the wheel "
        "ships no examples), run unchanged, its one import of `openevolve.evaluation_result` served in "
        "qd's interpreter by `bench/quality_shim`. Prompt task: the budget counts the proposer's calls "
        f"and its evaluations on the rows alike: {args.prompt_calls} calls per run (`--prompt-calls`).",
        f"- {'Partial: ' if len(lines) < planned else ''}{len(lines)} of {planned} runs "
        f"({len(args.seeds)} seeds of every runnable system x task) finished; a row with 0 runs was not "
        'reached yet or says why it cannot run. "Runs beating their seeds": runs whose best is a new '
        "program (not a seed) that beats the best seed program on the held-out measure; where it is 0 "
        "for every system, the task did not rank the systems at this budget (the spread between them "
        "is the scorer's: OpenEvolve's function_minimization evaluator draws unseeded random numbers, "
        "so one program scores differently run to run).",
        "",
        *table,
        "",
        "Where qd is not first (medians; the goal is qd's median best and QD score at least every "
        "other system's):",
        "",
        *ahead_of_qd(lines),
        "",
        "Effect of memory and of the agent operator (medians over the seeds both ran, variant vs qd):",
        "",
        *effects(lines),
        f"- {defaults_line(lines)}",
    ]
    write_section(args.results, TITLE, "\n".join(section))
    print(f"wrote {TITLE!r} to {args.results}")


# ----- entry points ---------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40, help="the budget of each run of a code task")
    ap.add_argument(
        "--prompt-calls",
        type=int,
        default=80,
        help="the budget of a prompt run: proposer and evaluation calls",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--systems", nargs="+", choices=list(SYSTEMS), help="default: all (--quick: its own)")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), help="default: all (--quick: its own)")
    ap.add_argument("--peer-python", help="the peers' interpreter (a venv with openevolve and gepa)")
    ap.add_argument("--oe-example", type=Path, help="OpenEvolve's examples/function_minimization folder")
    ap.add_argument("--jsonl", type=Path, default=JSONL, help="finished runs, one JSON line each")
    ap.add_argument("--json", type=Path, help="write the summary rows and the runs as one JSON file")
    ap.add_argument("--results", type=Path, help="write this benchmark's section into RESULTS.md")
    ap.add_argument("--render", action="store_true", help="no runs: report the JSON-lines file")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 seed, 6 calls (prompt: 60), the scripted server, the runs of QUICK_RUNS",
    )
    ap.add_argument(
        "--per-call-timeout", type=float, default=30.0, help="child timeout: calls x this + 600 s"
    )
    args = ap.parse_args(argv)
    args.command = "python bench/quality.py " + " ".join(argv)
    args.server_name = "scripted" if args.quick else "smollm2"
    quick = [s for s in SYSTEMS if any(s in runs for runs in QUICK_RUNS.values())]
    args.systems = args.systems or (quick if args.quick else list(SYSTEMS))
    args.tasks = args.tasks or list(QUICK_RUNS if args.quick else TASKS)
    if args.quick:
        args.seeds, args.calls, args.prompt_calls = [0], 6, QUICK_PROMPT_CALLS
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    if not args.render:
        run_all(args)
    return report(args)


def _child(name: str, task_name: str, oe_example: str, params_json: str) -> None:
    from quality_systems import control, heldout_prompt, prompt_control, qd_prompt, qd_run

    p = json.loads(params_json)
    task = bench_task(task_name, None if oe_example == "None" else Path(oe_example))
    if name == "heldout":
        out = {"heldout": heldout_prompt(p), "programs": [], "wall_s": 0.0}
    elif SYSTEMS[name].runs == "control":
        out = prompt_control(p) if task_name == "prompt" else control(p, task)
    else:
        out = qd_prompt(p) if task_name == "prompt" else qd_run(p, task)
    Path(p["work"], "result.json").write_text(json.dumps(out, default=float))


def _score_prompt(server_json: str, path: str) -> None:
    """One prompt scored for a peer (its validation accuracy): its JSON on the last line of stdout."""
    from quality_peers import prompt_text
    from quality_tasks import score_prompt

    print(json.dumps(score_prompt(json.loads(server_json), prompt_text(Path(path).read_text()))))


def _score(task_name: str, oe_example: str, path: str) -> None:
    """One program scored for a peer: its JSON on the last line of stdout."""
    text = Path(path).read_text()
    out = scorer(task_name, None if oe_example == "None" else Path(oe_example))(text)
    out["descriptor"] = code_descriptor(text)
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--_child"]:
        _child(*sys.argv[2:6])
    elif sys.argv[1:2] == ["--_score"]:
        _score(*sys.argv[2:5])
    elif sys.argv[1:2] == ["--_score_prompt"]:
        _score_prompt(*sys.argv[2:4])
    else:
        main()
