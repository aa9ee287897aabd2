"""The peers' runs of ``bench/quality.py``, each in a child process of the peers' own interpreter
(``--peer-python``: a venv holding ``openevolve==0.4.1``, ``gepa==0.1.4`` and
``shinka-evolve==0.0.7``, never qd's environment). Only the standard library and the peer
packages (with their numpy) are imported here: a program is scored by qd's interpreter
(``params["score"]``: a command that prints the score's JSON), so every system is scored by the
same code.

* OpenEvolve: the seed programs as the initial program and island seeds (5 islands, its
  default), the task description as its system message, qd's temperature, max_tokens, timeout
  and concurrency, ``max_iterations`` = the budget, full rewrites (SmolLM2 does not follow its
  SEARCH/REPLACE diffs), its MAP-Elites over the task grid's axes (code metrics; a prompt's words
  and lines), ``random_seed`` = the seed; defaults otherwise. On the prompt task it evolves a text
  file (``language = "text"``, as its own prompt-optimization example does) and ``max_iterations``
  is the proposals that fit in the budget when each is scored on the validation rows
  (``params["proposals"]``; it scores every answer, so the count is exact).
* GEPA: on the prompt task ``gepa.optimize`` with its default adapter, the system prompt as the
  one component; the task model and the reflection model are the bench's server (qd's
  temperature and max_tokens); the answer judged as qd's ``numeric`` metric judges it (the last
  number of the answer equals the row's); the budget counts every model call, reflection and task
  calls, as qd's counts its operator and evaluation calls (a stop callback ends the run once it is
  reached); train and validation rows are qd's. On a code task ``optimize_anything`` in its
  single-task mode (``gepa_code_run``): the best seed program (``params["start"]``) as its seed
  candidate, the task description as its objective, the bench's score as its evaluator.
* ShinkaEvolve 0.0.7: its own ``ShinkaEvolveRunner`` loop on the bench's server, reached through
  its model-name convention for a local OpenAI-compatible server
  (``local/MODEL@BASE_URL``, ``shinka.local_openai_config``); the best seed program
  (``params["start"]``: it takes one; a user hands it their best) as its initial program, the task
  description as its task system message, qd's temperature and max_tokens, ``concurrency``
  proposals and evaluations at a time, numpy's global seed = the seed (its samplers draw from it);
  full rewrites and crossovers in its default ratio (3:1; SmolLM2 does not follow its diff edits);
  no embedding model (the server serves chat only: its novelty check is then skipped, as
  ShinkaEvolve does without embeddings); defaults otherwise (no meta or novelty LLM: off by
  default). Its evaluation job is an ``evaluate.py`` that writes ``metrics.json`` /
  ``correct.json`` from the bench's score. The budget: its LLM client answers None (its own "no
  response" path: the proposal fails without a call) once a call and the scoring of what it
  proposes no longer fit (the scoring of every program it has written counted, ``params["scoring"]``
  calls each: 0 on a code task), and no later generation starts; it runs at most budget + 1
  generations (generation 0 is the initial program), so its resamples spend out of the same budget.
  On the prompt task the prompt is a markdown file between comment markers, and one proposal runs at
  a time, so every program it writes is counted before its next call.

Usage (by the bench): ``PEER_PYTHON bench/quality_peers.py SYSTEM PARAMS_JSON``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


_MARKER = re.compile(r"^\s*(?:#|<!--)?\s*EVOLVE-BLOCK-(?:START|END)\s*(?:-->)?\s*$", re.MULTILINE)


def prompt_text(text: str) -> str:
    """A prompt as it is scored: a peer's file without its EVOLVE-BLOCK marker lines."""
    return _MARKER.sub("", text).strip()


def marked(code: str, comment: tuple[str, str] = ("# ", "")) -> str:
    """A program with its whole text between EVOLVE-BLOCK markers (the region the peers evolve),
    written as ``comment`` (opening, closing) comments: Python's by default."""
    if "EVOLVE-BLOCK-START" in code:
        return code
    start, end = (f"{comment[0]}EVOLVE-BLOCK-{edge}{comment[1]}" for edge in ("START", "END"))
    return f"{start}\n{code.rstrip()}\n{end}\n"


def _evaluator_file(p: dict[str, Any], function: str, body: str) -> Path:
    """``work/evaluator.py``: the peer's evaluation entry, importing ``function`` from here with the
    run's params as ``P``, then ``body``."""
    work = Path(p["work"])
    (work / "params.json").write_text(json.dumps(p))
    path = work / "evaluator.py"
    path.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"from quality_peers import {function}\n"
        f"P = json.load(open({str(work / 'params.json')!r}))\n" + body
    )
    return path


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
    prompt = p["task"] == "prompt"  # a text file, as OpenEvolve's prompt-optimization example evolves
    seeds = p["seeds"][:5] if prompt else [marked(s) for s in p["seeds"][:5]]
    paths = []
    for i, code in enumerate(seeds):
        paths.append(work / f"seed_{i}.{'txt' if prompt else 'py'}")
        paths[-1].write_text(code)
    evaluator = _evaluator_file(
        p, "oe_evaluate", "def evaluate(program_path):\n    return oe_evaluate(P, program_path)\n"
    )
    config = Config()
    config.language = "text" if prompt else "python"
    config.random_seed = p["seed"]
    config.max_iterations = p["proposals"]
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
    config.database.feature_dimensions = list(p["features"])
    config.database.feature_bins = dict(zip(p["features"], p["bins"]))
    config.database.island_initial_programs = [None, *map(str, paths[1:])]
    controller = OpenEvolve(str(paths[0]), str(evaluator), config, output_dir=str(work / "oe"))
    added: dict[str, dict[str, Any]] = {}
    add = controller.database.add

    def recording_add(program, iteration=None, target_island=None):
        # every program the run evaluated: the seeds (iteration 0) and each iteration's child;
        # copies for empty islands and migrants repeat a known program
        if program.id not in added and (iteration is not None or not program.parent_id):
            m = dict(program.metrics)
            valid = m.get("valid") == 1.0
            added[program.id] = {
                "text": prompt_text(program.code) if prompt else program.code,
                "fitness": m.get("combined_score") if valid else None,
                "valid": valid,
                "llm": iteration is not None and iteration > 0,
                "error": None,
            }
        return add(program, iteration=iteration, target_island=target_island)

    controller.database.add = recording_add
    t0 = time.perf_counter()
    asyncio.run(controller.run(iterations=p["proposals"]))
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
        **{name: float(x) for name, x in zip(p["features"], d)},
    }
    artifacts = {"feedback": s.get("feedback") or ""}
    if s.get("error"):
        artifacts["error"] = s["error"]
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


_SHINKA_MAIN = """
import argparse
ap = argparse.ArgumentParser()
ap.add_argument("--program_path")
ap.add_argument("--results_dir")
a = ap.parse_args()
shinka_evaluate(P, a.program_path, a.results_dir)
"""
_SHINKA_ROW = "bench_row.json"  # each evaluated program, beside its metrics.json


def shinka_run(p: dict[str, Any]) -> dict[str, Any]:
    import asyncio
    import random

    import numpy as np
    from shinka.core import EvolutionConfig, ShinkaEvolveRunner
    from shinka.database import DatabaseConfig
    from shinka.launch import LocalJobConfig

    work = Path(p["work"])
    prompt = p["task"] == "prompt"  # a markdown file: the prompt between comment markers
    evaluator = _evaluator_file(p, "shinka_evaluate", _SHINKA_MAIN)
    random.seed(p["seed"])
    np.random.seed(p["seed"])
    results = work / "shinka"
    evo = EvolutionConfig(
        task_sys_msg=p["description"],
        patch_types=["full", "cross"],
        patch_type_probs=[0.75, 0.25],
        num_generations=p["calls"] + 1,
        language="markdown" if prompt else "python",
        llm_models=[f"local/{p['model']}@{p['base_url']}"],
        llm_dynamic_selection=None,
        llm_kwargs={"temperatures": [p["temperature"]], "max_tokens": p["max_tokens"]},
        embedding_model=None,
        init_program_path=None,
        results_dir=str(results),
    )
    runner = ShinkaEvolveRunner(
        evo_config=evo,
        job_config=LocalJobConfig(eval_program_path=str(evaluator), python_executable=sys.executable),
        db_config=DatabaseConfig(),
        banner_style="minimal",
        verbose=False,
        max_evaluation_jobs=p["concurrency"],
        max_proposal_jobs=1 if p["scoring"] else p["concurrency"],
        init_program_str=marked(p["start"], ("<!-- ", " -->") if prompt else ("# ", "")),
    )
    calls = 0
    query = runner.llm.query

    def committed() -> int:
        # its proposal calls and the scoring calls of every program it has written (gen_0 too)
        return calls + p["scoring"] * sum(1 for _ in results.glob("gen_*/main.*"))

    async def within_budget(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if committed() + 1 + p["scoring"] > p["calls"]:
            # its "no response": the proposal fails, no call made; and no generation after this
            # one is started (each would only try and fail its attempts)
            evo.num_generations = min(evo.num_generations, runner.next_generation_to_submit)
            return None
        calls += 1
        return await query(*args, **kwargs)

    runner.llm.query = within_budget
    t0 = time.perf_counter()
    asyncio.run(runner.run_async())
    wall = time.perf_counter() - t0
    # every generation's program once (its best/ folder is a copy of one of them)
    programs = [json.loads(path.read_text()) for path in results.glob(f"gen_*/**/{_SHINKA_ROW}")]
    return {"programs": programs, "wall_s": wall, "budget_calls": committed()}


def shinka_evaluate(p: dict[str, Any], program_path: str, results_dir: str) -> None:
    """ShinkaEvolve's evaluation job: the bench's score as its ``metrics.json`` (combined_score,
    the descriptor as public metrics, the feedback as text feedback) and ``correct.json``, and
    the program's row for the bench beside them."""
    s = _score(p, program_path)
    valid = bool(s["valid"])
    d = s.get("descriptor") or [0.0, 0.0]
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {
        "combined_score": float(s["fitness"]) if valid else p["worst"],
        "public": {name: float(x) for name, x in zip(p["features"], d)},
        "private": {},
        "text_feedback": s.get("feedback") or s.get("error") or "",
    }
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "correct.json").write_text(json.dumps({"correct": valid, "error": s.get("error")}))
    generation = re.search(r"gen_(\d+)", str(Path(program_path).resolve()))
    text = Path(program_path).read_text()
    row = {
        "text": prompt_text(text) if p["task"] == "prompt" else text,
        "fitness": float(s["fitness"]) if valid else None,
        "valid": valid,
        "llm": bool(generation and int(generation[1]) > 0),
        "error": s.get("error"),
    }
    (out / _SHINKA_ROW).write_text(json.dumps(row))


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def _budgeted_chat(p: dict[str, Any]) -> tuple[Callable[..., str], Callable[[], int]]:
    """GEPA's model: a chat call on the bench's server with qd's sampling settings, and the count
    of calls made (its budget). A task call samples with the run seed (a row's answer is
    reproducible, as qd's evaluation calls are); a reflection call (``propose=True``) with a seed of
    its own, as qd's operators sample each child with its own: with one seed GEPA's same reflection
    prompt got SmolLM2's same answer every time (an empty block, 40 times over)."""
    from openai import OpenAI

    client = OpenAI(base_url=p["base_url"], api_key="sk-none", timeout=p["timeout_s"])
    calls = 0

    def chat(messages: list[dict[str, Any]], propose: bool = False) -> str:
        nonlocal calls
        calls += 1
        answer = client.chat.completions.create(
            model=p["model"],
            messages=messages,
            temperature=p["temperature"],
            max_tokens=p["max_tokens"],
            seed=p["seed"] * 100_003 + calls if propose else p["seed"],
        )
        return answer.choices[0].message.content or ""

    return chat, lambda: calls


def gepa_run(p: dict[str, Any]) -> dict[str, Any]:
    import gepa
    from gepa.adapters.default_adapter.default_adapter import EvaluationResult

    chat, calls = _budgeted_chat(p)

    def reflect(prompt: str) -> str:
        return chat(_messages(prompt), propose=True)

    def judge(row: dict[str, Any], response: str) -> EvaluationResult:
        got, want = _last_number(response), _last_number(str(row["answer"]))
        ok = got is not None and want is not None and abs(got - want) <= 1e-6
        return EvaluationResult(score=float(ok), feedback=f"expected {row['answer']}, got {got}")

    class Budget:
        def __call__(self, state: Any) -> bool:
            return calls() >= p["calls"]

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
    return {"programs": programs, "wall_s": wall, "best_prompt": best, "budget_calls": calls()}


def gepa_code_run(p: dict[str, Any]) -> dict[str, Any]:
    """GEPA on a code task: ``optimize_anything`` in its single-task mode (the candidate is the
    program), the best seed program (``p["start"]``) as its seed candidate, the task description
    as its objective, the bench's score as its evaluator (the feedback and any error as its side
    information), the bench's server as its reflection model; at most ``calls`` proposals
    (``max_candidate_proposals``, one reflection call each) and a stop callback once they are made."""
    import tempfile

    from gepa.optimize_anything import EngineConfig, GEPAConfig, ReflectionConfig, optimize_anything

    chat, calls = _budgeted_chat(p)
    seen: dict[str, dict[str, Any]] = {}
    seed = p["start"]

    def evaluate(candidate: str) -> tuple[float, dict[str, Any]]:
        if candidate not in seen:  # GEPA may score a candidate again (minibatch, then validation)
            with tempfile.NamedTemporaryFile("w", suffix=".py", dir=p["work"], delete=False) as f:
                f.write(candidate)
            s = _score(p, f.name)
            valid = bool(s["valid"])
            seen[candidate] = {
                "text": candidate,
                "fitness": float(s["fitness"]) if valid else None,
                "valid": valid,
                "llm": candidate != seed,
                "error": s.get("error"),
                "feedback": s.get("feedback") or "",
            }
        row = seen[candidate]
        side = {"feedback": row["feedback"], **({"error": row["error"]} if row["error"] else {})}
        return (row["fitness"] if row["valid"] else p["worst"]), side

    config = GEPAConfig(
        engine=EngineConfig(
            run_dir=str(Path(p["work"]) / "gepa"),
            seed=p["seed"],
            raise_on_exception=False,
            max_candidate_proposals=p["calls"],
            parallel=False,
        ),
        reflection=ReflectionConfig(reflection_lm=lambda prompt: chat(_messages(prompt), propose=True)),
        stop_callbacks=[lambda state: calls() >= p["calls"]],
    )
    t0 = time.perf_counter()
    optimize_anything(seed, evaluator=evaluate, objective=p["description"], config=config)
    wall = time.perf_counter() - t0
    programs = [{k: v for k, v in row.items() if k != "feedback"} for row in seen.values()]
    return {"programs": programs, "wall_s": wall, "budget_calls": calls()}


def _messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


PEERS = {
    "openevolve": openevolve_run,
    "gepa": lambda p: gepa_run(p) if p["task"] == "prompt" else gepa_code_run(p),
    "shinka": shinka_run,
}

if __name__ == "__main__":
    params = json.loads(sys.argv[2])
    out = PEERS[sys.argv[1]](params)
    Path(params["work"], "result.json").write_text(json.dumps(out, default=float))
