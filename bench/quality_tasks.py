"""The three tasks of ``bench/quality.py``, each as every system sees it: the seed programs, what
the model is told, how a program is scored (one scorer for every system: qd's own fitness,
computed outside qd for the others), qd's overrides, and the one descriptor grid on which every
system's programs get their QD score.

* ``function_fit``: ``experiments/function_fit`` (quadratic target); fitness = -min(RMSE on the
  64 held-out points, 100), the cascade of qd's evaluator (``_search_runs.score_program``).
* ``function_minimization``: OpenEvolve's example as it ships in OpenEvolve's repository
  (``examples/function_minimization``: ``initial_program.py`` and ``evaluator.py``, unchanged;
  the wheel does not ship its examples, so ``--oe-example`` names the folder); fitness = its
  ``combined_score``, a program valid when every metric it returns is a number (qd's rule:
  the evaluator answers a failure with an ``error`` string). qd runs it as ``experiment=openevolve``.
  The evaluator imports ``openevolve.evaluation_result``; qd's interpreter and its sandbox get
  it from ``bench/quality_shim`` (a stand-in of that one class), so it runs unchanged.
* ``prompt``: the instruction for SmolLM2 on the shipped ``qd/data/samples/arith60.jsonl``
  (numeric metric), through ``qd.optimize``; the held-out best is its test split's accuracy.
  A prompt's fitness, for every system but qd (whose validation stage computes it), is its
  accuracy on the run seed's validation split (``score_prompt``: ``DatasetTask.heldout`` on a copy
  of the task whose test rows are the validation rows), on the bench's server, uncached.

Grids: the code-metrics grids of ``conf/experiment/function_fit.yaml`` and
``conf/experiment/openevolve.yaml`` (AST nodes x numeric constants); for prompts, words x lines
(8 x 6 over 0..160 words, 0..12 lines).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _search_runs import ROOT, limit_child, score_program

TASKS = ("function_fit", "function_minimization", "prompt")
DATASET = ROOT / "qd" / "data" / "samples" / "arith60.jsonl"
PROMPT_SEED = "Solve the problem. Answer with the number only."
PROMPT_GRID = {"bins": [8, 6], "lower": [0.0, 0.0], "upper": [160.0, 12.0], "qd_offset": 0.0}
MINIMIZATION_WALL_S = 60.0  # OpenEvolve's evaluator: 10 trials of at most 5 s each

SHIM = Path(__file__).resolve().parent / "quality_shim"  # openevolve.evaluation_result, for its evaluator

_EVALUATE = r"""
import importlib.util, json, sys
sys.path.append(sys.argv[3])
spec = importlib.util.spec_from_file_location("evaluator", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = mod.evaluate(sys.argv[2])
metrics = getattr(out, "metrics", out)
sys.stdout.write("\n@@RESULT@@" + json.dumps(metrics, default=str))
"""


@dataclasses.dataclass(frozen=True)
class BenchTask:
    """One task as the bench runs it; ``score(text)`` -> ``{fitness, valid, error, feedback}``
    (None for the prompt task, whose evaluation calls the model)."""

    name: str
    seeds: tuple[str, ...]
    description: str
    qd_overrides: tuple[str, ...]
    grid: dict[str, Any]
    score: Callable[[str], dict[str, Any]] | None


def best_seed(task: BenchTask) -> str:
    """The seed a peer that takes one starts from (ShinkaEvolve, GEPA): the best by the task's
    scorer, as a user would hand it (an invalid seed, NaN, last); the prompt task has one."""
    if task.score is None or len(task.seeds) == 1:
        return task.seeds[0]
    fitness = {s: task.score(s)["fitness"] for s in task.seeds}
    return max(task.seeds, key=lambda s: -math.inf if math.isnan(fitness[s]) else fitness[s])


def prompt_descriptor(text: str) -> list[float]:
    """(words, lines) of a prompt: the prompt task's grid axes."""
    return [float(len(text.split())), float(len(text.strip().splitlines()))]


def prompt_task(seed: int) -> Any:
    """The prompt task's ``DatasetTask`` for a run seed (its splits, its description), as
    ``qd.optimize`` builds it for the bench's qd runs."""
    from qd.data.task import dataset_task

    return dataset_task(PROMPT_SEED, str(DATASET), "numeric", seed=seed)


def on_validation(task: Any) -> Any:
    """A copy of a dataset task whose test rows are its validation rows: its ``heldout(text,
    client)`` is then a prompt's validation accuracy, what qd's validation stage computes."""
    copied = copy.copy(task)
    copied.splits = dataclasses.replace(task.splits, test=task.splits.validation)
    return copied


def prompt_accuracy(p: dict[str, Any], text: str, split: str) -> float:
    """A prompt's accuracy on the run seed's ``split`` ("validation" or "test") rows, scored by
    ``DatasetTask.heldout`` (uncached) on a client of the bench's server (``p``: the run's ``seed``,
    ``model``, ``base_url``)."""
    from qd.optimize_parts import ModelArgs, start_client

    task = prompt_task(p["seed"])
    scored = on_validation(task) if split == "validation" else task
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="qd_bench_prompt_") as work:
        client = start_client(ModelArgs(p["model"], p["base_url"], None, None), p["seed"], Path(work), stack)
        return float(scored.heldout(text, client)[0])


def score_prompt(p: dict[str, Any], text: str) -> dict[str, Any]:
    """A prompt scored for a peer: its validation accuracy (:func:`prompt_accuracy`)."""
    accuracy = prompt_accuracy(p, text, "validation")
    rows = len(prompt_task(p["seed"]).splits.validation)
    return {
        "fitness": accuracy,
        "valid": True,
        "error": None,
        "feedback": f"{round(accuracy * rows)} of {rows} validation answers accepted",
        "descriptor": prompt_descriptor(text),
    }


def _grid(experiment: str) -> dict[str, Any]:
    from qd.plan import compose

    a = compose([f"experiment={experiment}"]).archive
    return {"bins": list(a.bins), "lower": list(a.lower), "upper": list(a.upper), "qd_offset": a.qd_offset}


def score_minimization(evaluator: Path, text: str) -> dict[str, Any]:
    """OpenEvolve's ``evaluate(program_path)`` on ``text``, in a fresh interpreter with qd's limits."""
    with tempfile.TemporaryDirectory(prefix="qd_bench_fm_") as cwd:
        program = Path(cwd, "program.py")
        program.write_text(text)
        try:
            p = subprocess.run(
                [sys.executable, "-c", _EVALUATE, str(evaluator), str(program), str(SHIM)],
                capture_output=True,
                text=True,
                timeout=MINIMIZATION_WALL_S,
                cwd=cwd,
                preexec_fn=lambda: limit_child(cpu_s=int(MINIMIZATION_WALL_S), memory_mb=2048),
            )
        except subprocess.TimeoutExpired:
            return {"fitness": math.nan, "valid": False, "error": "evaluator timed out", "feedback": ""}
    marker = p.stdout.rfind("\n@@RESULT@@")
    if marker < 0:
        return {"fitness": math.nan, "valid": False, "error": p.stderr.strip()[-300:], "feedback": ""}
    metrics = json.loads(p.stdout[marker + len("\n@@RESULT@@") :])
    numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    valid = len(numbers) == len(metrics) and "combined_score" in numbers
    return {
        "fitness": float(numbers["combined_score"]) if valid else math.nan,
        "valid": valid,
        "error": None if valid else str(metrics.get("error", "non-numeric metrics"))[:300],
        "feedback": ", ".join(f"{k} = {v:.4g}" for k, v in numbers.items()),
    }


def _score_fit(text: str) -> dict[str, Any]:
    s = score_program(text)
    values = (s.get("artifacts") or {}).get("values", "")
    return {"fitness": s["fitness"], "valid": s["valid"], "error": s["error"], "feedback": values}


def scorer(name: str, oe_example: Path | None) -> Callable[[str], dict[str, Any]]:
    """The score of a code task's program, without building the task (a peer's evaluator calls
    it once per program: no config is composed)."""
    if name == "function_fit":
        return _score_fit
    evaluator = (Path(oe_example) / "evaluator.py").resolve()
    return lambda text: score_minimization(evaluator, text)


def bench_task(name: str, oe_example: Path | None) -> BenchTask | str:
    """The task, or why it cannot run in this checkout."""
    if name == "function_fit":
        from experiments.function_fit.task import SEEDS

        return BenchTask(
            name,
            tuple(SEEDS),
            _search_description(),
            ("experiment=function_fit",),
            _grid("function_fit"),
            scorer(name, oe_example),
        )
    if name == "function_minimization":
        if oe_example is None or not (oe_example / "evaluator.py").is_file():
            return (
                "OpenEvolve's example not found (its wheel ships no examples): pass --oe-example "
                "OPENEVOLVE_REPO/examples/function_minimization"
            )
        from experiments.openevolve.task import DESCRIPTION

        evaluator = (oe_example / "evaluator.py").resolve()
        initial = (oe_example / "initial_program.py").resolve()
        return BenchTask(
            name,
            (initial.read_text(),),
            DESCRIPTION,
            (
                "experiment=openevolve",
                f"experiment.params.initial_program={initial}",
                f"experiment.params.evaluator={evaluator}",
            ),
            _grid("openevolve"),
            scorer(name, oe_example),
        )
    if name == "prompt":
        return BenchTask(name, (PROMPT_SEED,), "", (), PROMPT_GRID, None)
    raise ValueError(name)


def _search_description() -> str:
    from _search_runs import function_fit_task

    return function_fit_task().description
