"""The peers' runs of ``bench/quality.py``, each in a child process of the peers' own interpreter
(``--peer-python``: a venv holding ``openevolve==0.4.1`` and ``gepa==0.1.4``, never qd's
environment). Only the standard library and the peer package are imported here: a program is
scored by qd's interpreter (``params["score"]``: a command that prints the score's JSON), so
every system is scored by the same code.

* OpenEvolve: the seed programs as the initial program and island seeds (5 islands, its
  default), the task description as its system message, qd's temperature, max_tokens, timeout
  and concurrency, ``max_iterations`` = the budget, full rewrites (SmolLM2 does not follow its
  SEARCH/REPLACE diffs), its MAP-Elites over the same code metrics (the task grid's bins),
  ``random_seed`` = the seed; defaults otherwise.
* GEPA: ``gepa.optimize`` with its default adapter, the system prompt as the one component;
  the task model and the reflection model are the bench's server (qd's temperature and
  max_tokens); the answer judged as qd's ``numeric`` metric judges it (the last number of the
  answer equals the row's); the budget counts every model call, reflection and task calls, as
  qd's counts its operator and evaluation calls (a stop callback ends the run once it is
  reached); train and validation rows are qd's.

Usage (by the bench): ``PEER_PYTHON bench/quality_peers.py SYSTEM PARAMS_JSON``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _score(p: dict[str, Any], path: str) -> dict[str, Any]:
    out = subprocess.run([*p["score"], path], capture_output=True, text=True, timeout=p["score_timeout_s"])
    if out.returncode != 0:
        return {"fitness": None, "valid": False, "error": out.stderr.strip()[-300:], "feedback": ""}
    return json.loads(out.stdout.strip().splitlines()[-1])


def openevolve_run(p: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    from openevolve.config import Config, LLMConfig, LLMModelConfig
    from openevolve.controller import OpenEvolve

    work = Path(p["work"])

    def marked(code: str) -> str:
        if "EVOLVE-BLOCK-START" in code:
            return code
        return f"# EVOLVE-BLOCK-START\n{code.rstrip()}\n# EVOLVE-BLOCK-END\n"

    seeds = [marked(s) for s in p["seeds"][:5]]
    paths = []
    for i, code in enumerate(seeds):
        paths.append(work / f"seed_{i}.py")
        paths[-1].write_text(code)
    (work / "params.json").write_text(json.dumps(p))
    (work / "evaluator.py").write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from quality_peers import oe_evaluate\n"
        f"P = json.load(open({str(work / 'params.json')!r}))\n"
        "def evaluate(program_path):\n"
        "    return oe_evaluate(P, program_path)\n"
    )
    config = Config()
    config.language = "python"
    config.random_seed = p["seed"]
    config.max_iterations = p["calls"]
    config.checkpoint_interval = 10**6
    config.diff_based_evolution = False
    config.llm = LLMConfig(
        api_base=p["base_url"],
        api_key="sk-none",
        temperature=p["temperature"],
        max_tokens=p["max_tokens"],
        timeout=p["timeout_s"],
        models=[LLMModelConfig(name=p["model"], weight=1.0)],
    )
    config.prompt.system_message = p["description"]
    config.evaluator.parallel_evaluations = p["concurrency"]
    config.evaluator.cascade_evaluation = False
    config.evaluator.timeout = p["score_timeout_s"] + 30
    config.database.feature_dimensions = ["nodes", "constants"]
    config.database.feature_bins = {"nodes": p["bins"][0], "constants": p["bins"][1]}
    config.database.island_initial_programs = [None, *map(str, paths[1:])]
    controller = OpenEvolve(str(paths[0]), str(work / "evaluator.py"), config, output_dir=str(work / "oe"))
    added: dict[str, dict[str, Any]] = {}
    add = controller.database.add

    def recording_add(program, iteration=None, target_island=None):
        # every program the run evaluated: the seeds (iteration 0) and each iteration's child;
        # copies for empty islands and migrants repeat a known program
        if program.id not in added and (iteration is not None or not program.parent_id):
            m = dict(program.metrics)
            valid = m.get("valid") == 1.0
            added[program.id] = {
                "text": program.code,
                "fitness": m.get("combined_score") if valid else None,
                "valid": valid,
                "llm": iteration is not None and iteration > 0,
                "error": None,
            }
        return add(program, iteration=iteration, target_island=target_island)

    controller.database.add = recording_add
    t0 = time.perf_counter()
    asyncio.run(controller.run(iterations=p["calls"]))
    return {"programs": list(added.values()), "wall_s": time.perf_counter() - t0}


def oe_evaluate(p: dict[str, Any], program_path: str):
    """OpenEvolve's ``evaluate(program_path)``: the bench's score, as combined_score."""
    from openevolve.evaluation_result import EvaluationResult

    s = _score(p, program_path)
    valid = bool(s["valid"])
    d = s.get("descriptor") or [0.0, 0.0]
    metrics = {
        "combined_score": float(s["fitness"]) if valid else p["worst"],
        "valid": 1.0 if valid else 0.0,
        "nodes": float(d[0]),
        "constants": float(d[1]),
    }
    artifacts = {"feedback": s.get("feedback") or ""}
    if s.get("error"):
        artifacts["error"] = s["error"]
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def gepa_run(p: dict[str, Any]) -> dict[str, Any]:
    import gepa
    from gepa.adapters.default_adapter.default_adapter import EvaluationResult
    from openai import OpenAI

    client = OpenAI(base_url=p["base_url"], api_key="sk-none", timeout=p["timeout_s"])
    calls = 0

    def chat(messages: list[dict[str, str]]) -> str:
        nonlocal calls
        calls += 1
        answer = client.chat.completions.create(
            model=p["model"],
            messages=messages,
            temperature=p["temperature"],
            max_tokens=p["max_tokens"],
            seed=p["seed"],
        )
        return answer.choices[0].message.content or ""

    def reflect(prompt: str) -> str:
        return chat([{"role": "user", "content": prompt}])

    def judge(row: dict[str, Any], response: str) -> EvaluationResult:
        got, want = _last_number(response), _last_number(str(row["answer"]))
        ok = got is not None and want is not None and abs(got - want) <= 1e-6
        return EvaluationResult(score=float(ok), feedback=f"expected {row['answer']}, got {got}")

    class Budget:
        def __call__(self, state: Any) -> bool:
            return calls >= p["calls"]

    def rows(split: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"input": r["input"], "answer": str(r["answer"]), "additional_context": {}} for r in split]

    t0 = time.perf_counter()
    result = gepa.optimize(
        seed_candidate={"system_prompt": p["seeds"][0]},
        trainset=rows(p["train"]),
        valset=rows(p["validation"]),
        task_lm=chat,
        evaluator=judge,
        reflection_lm=reflect,
        stop_callbacks=[Budget()],
        max_metric_calls=10**6,
        run_dir=str(Path(p["work"]) / "gepa"),
        seed=p["seed"],
        raise_on_exception=False,
    )
    wall = time.perf_counter() - t0
    programs = [
        {"text": c["system_prompt"], "fitness": float(s), "valid": True, "llm": i > 0, "error": None}
        for i, (c, s) in enumerate(zip(result.candidates, result.val_aggregate_scores))
    ]
    best = result.candidates[result.best_idx]["system_prompt"]
    return {"programs": programs, "wall_s": wall, "best_prompt": best, "budget_calls": calls}


PEERS = {"openevolve": openevolve_run, "gepa": gepa_run}

if __name__ == "__main__":
    params = json.loads(sys.argv[2])
    out = PEERS[sys.argv[1]](params)
    Path(params["work"], "result.json").write_text(json.dumps(out, default=float))
