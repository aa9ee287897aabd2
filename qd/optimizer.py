"""``qd.optimize``: your own problem in one call, from a script or a notebook.

    import qd

    def evaluate(program_path):  # runs in the sandbox, beside the candidate's file
        ...
        return {"score": 0.7, "feedback": "too slow on n=1000"}

    result = qd.optimize("def solve(xs):\\n    return sorted(xs)\\n", evaluate=evaluate,
                         budget={"llm_calls": 50})
    print(result.best.text, result.best.fitness)

What a user would otherwise write (a task file, a hydra config) is made here from the
arguments: the task (``qd.callable_tasks.code_task`` for a code genome scored by a function,
``host_task`` for a data genome scored by one, ``qd.data.task.dataset_task`` for a data
genome scored on a dataset), the archive, the model client and the driver's settings; then the
run is built through the composition root (``qd.build`` with parts), run, and read back as a
:class:`qd.optimize_result.OptimizeResult`. Every argument is checked before anything starts,
with ``qd-run``'s one-line errors naming the argument.

The run directory is a run like any other (``qd show``, ``qd explore``, ``qd export``), and
the same call given its ``run_dir=`` continues it (the checkpoint and the store rows after it,
as ``qd-run resume=`` does). ``qd-run resume=`` refuses it: the evaluator is a Python object
that only the caller's process holds. An interrupt (Ctrl-C, a notebook's stop button) stops
the run cleanly and returns what was evaluated. Arguments, result and the mapping from
OpenEvolve and GEPA: ``docs/optimize.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qd.api import build
from qd.assembly import Settings
from qd.budget import Budget
from qd.contract import ConfigError
from qd.memory import MemorySettings
from qd.optimize_parts import ModelArgs, heldout_of, make_task, placement_of, start_client, strategy_of
from qd.optimize_result import OptimizeResult, read_result
from qd.rundir import layout
from qd.stop_rules import StopRules

__all__ = ["BUDGET_KEYS", "OptimizeResult", "SavedTask", "optimize", "saved_task"]

# ``budget=`` keys -> ``qd.Budget`` fields (the words of the issue: LLM calls, evaluations, seconds, cost)
BUDGET_KEYS = {
    "llm_calls": "max_llm_calls",
    "evaluations": "max_evaluations",
    "seconds": "max_seconds",
    "tokens": "max_tokens",
    "cost": "max_cost",
}
DEFAULT_BUDGET = {"llm_calls": 100}
MARKER = {"made_by": "qd.optimize"}  # in ``optimize.json``: what ``qd-run resume=`` refuses


def optimize(
    seed: str | Path | Sequence[str],
    evaluate: Callable[..., Any] | None = None,
    *,
    genome: str = "program",
    dataset: Any = None,
    metric: str | Callable[..., Any] = "exact",
    columns: Mapping[str, str] | None = None,
    splits: Sequence[float] | None = None,
    description: str = "",
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    llm: Any = None,
    budget: Budget | Mapping[str, float] | None = None,
    descriptors: Any = None,
    islands: int = 1,
    operators: Sequence[str] = ("rewrite",),
    memory: bool | Mapping[str, Any] | None = None,
    objectives: Sequence[tuple[str, str]] = (),
    front_size: int | None = None,
    parents: str = "uniform",
    inspirations: str = "uniform",
    target_fitness: float | None = None,
    patience: int | None = None,
    random_seed: int = 0,
    run_dir: str | Path | None = None,
    progress: bool = False,
) -> OptimizeResult:
    """Evolves ``seed`` against ``evaluate`` (or ``dataset`` + ``metric``); the best candidate,
    the elites, the held-out score (a dataset's test split), the ledger and the run directory.

    Args:
        seed: the starting text(s): one string, a list, or the path of a file holding one.
        evaluate: for a code genome, ``evaluate(program_path) -> number | dict``, shipped into
            the sandbox; for a data genome, ``evaluate(candidate, llm) -> number | dict`` on the
            host. A dict gives ``score`` (or ``combined_score``), ``feedback`` and other metrics.
        genome: ``program``, ``prompt``, ``agent`` or any kind registered with ``genomes.register``.
        dataset: rows for a data genome (a list of dicts, a JSONL/CSV/Parquet file, a ``datasets``
            folder), scored by ``metric`` (a name or ``(row, output) -> float | dict``);
            ``columns`` names the ``input`` and ``answer`` columns (``{"input": "question"}``);
            ``splits`` the train, validation and test fractions (default 0.5, 0.25, 0.25).
        description: what the model is told the task is.
        model, base_url, api_key_env, llm: the model: an ``llm`` preset of ``conf/llm/``
            (``openai``, ``vllm``, ...) or a client object, with ``model`` / ``base_url`` /
            ``api_key_env`` over it; ``base_url`` alone: any OpenAI-compatible server; ``model``
            alone: OpenAI; nothing: the embedded SmolLM2, started here and stopped at the end.
        budget: a ``qd.Budget`` or a dict of ``llm_calls``, ``evaluations``, ``seconds``,
            ``tokens``, ``cost`` (default: 100 LLM calls); the run stops at the first reached.
        descriptors: where candidates land in the archive: ``"code_metrics"`` or ``"embedding"``
            (computed from the text), or the evaluator's metric names / callables, for the
            task to report (default: the task's own: a program's AST size and constants, a
            text's words, a dataset task's axes).
        islands, operators: the island count and the LLM operators by name (``rewrite``, ``diff``,
            ``crossover``, ``inspiration``, ``agent``: a bounded tool loop, ``operators.agent``),
            each an arm of equal weight.
        memory: run memory (``qd.memory``): each prompt shows the parent's recent children with
            their fates, and a ``meta`` call writes a lessons note every few commits. ``True``: the
            ``memory=on`` config group; a dict: that group with these ``MemoryConf`` fields over it
            (``children``, ``lessons_every``, ``max_tokens``, ``model``); None or False: off.
        objectives: named objectives with directions, ``[("accuracy", "max"), ("tokens", "min")]``:
            metrics of ``evaluate``'s dict, or a dataset task's own (``accuracy``, the metric's
            mean; ``tokens``, the model's output tokens per answer). The fitness stays the score.
        front_size: with ``objectives``, each cell keeps a Pareto front of at most this many
            elites (``archive=pareto``: the objectives decide who stays, the hypervolume is
            reported); None: one elite per cell, the fittest (the objectives drive selection only).
        parents, inspirations: the selection rules (``select=``'s): ``pareto``, ``hypervolume``
            (by the objectives) and ``instance`` (a dataset's validation rows, GEPA's rule) among
            others; ``inspirations="complement"``: elites best where the parent is weak.
        target_fitness, patience: stop rules beside the budget (``qd.StopRules``).
        random_seed: the run's seed (every random draw, the model's sampling seeds).
        run_dir: the run's folder (default: a new one under ``runs/``); a folder a previous call
            wrote is continued.
        progress: draw the progress line on the terminal.
    """
    seeds, kind, limits, arms = _seeds(seed), _genome(genome), _budget(budget), _operators(operators)
    memory_settings = _memory(memory)
    settings = Settings(
        islands=_positive("islands", islands),
        batch_size=len(seeds),  # the founding proposal holds every seed (initial() is asked per batch)
        in_flight=4,  # children in flight, as the code experiments run (function_fit, openevolve)
        initial_population=len(seeds),  # each seed evaluated once
        seed=random_seed,
        progress=progress,
        stop=StopRules(target_fitness=target_fitness, patience=patience),
    )
    folder = _run_dir(run_dir, kind.name)
    task = make_task(
        seeds,
        kind,
        evaluate,
        dataset,
        metric,
        dict(columns or {}),
        _splits(splits),
        description,
        descriptors,
        random_seed,
        tuple(tuple(o) for o in objectives),
    )
    strategy = strategy_of(parents, inspirations, task, settings.islands)
    describer, spec = placement_of(task, descriptors, random_seed)
    spec = _fronts(spec, front_size, task)
    with contextlib.ExitStack() as stack:  # the embedded server, if started, stops last
        models = ModelArgs(model, base_url, api_key_env, llm)
        client = start_client(models, random_seed, folder, stack)
        # marked before anything is stored: only qd.optimize continues it
        _mark(folder, kind.name, evaluate, dataset, task)
        engine = build(
            run_dir=folder,
            task=task,
            spec=spec,
            operators=arms,
            llm=client,
            describer=describer,
            strategy=strategy,
            budget=limits,
            settings=settings,
            memory=memory_settings,
        )
        try:
            summary = drive(engine)
        finally:
            engine.close()
        scored, spent = heldout_of(task, folder, client) if dataset is not None else (None, None)
        return read_result(folder, summary, scored, spent)


def drive(engine: Any) -> dict[str, Any]:
    """``engine.run()``, from a script or from inside a running event loop (a notebook: the run
    gets a thread of its own). An interrupt (Ctrl-C, a notebook's stop button) stops the run
    cleanly: in the main thread the engine's own signal handler asks it to stop; a
    ``KeyboardInterrupt`` raised while waiting on its thread asks it here, until it has."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return engine.run()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qd-optimize") as pool:
        running = pool.submit(engine.run)
        while True:
            try:
                return running.result()
            except KeyboardInterrupt:
                while not running.done():  # the loop thread may overwrite one request with its state
                    engine.request_stop("interrupted")
                    concurrent.futures.wait([running], timeout=0.1)


def _seeds(seed: Any) -> list[str]:
    """The starting texts: a path's contents (a ``Path``, or a one-line string naming a file), a
    string, or a list of strings."""
    if isinstance(seed, Path) or (isinstance(seed, str) and "\n" not in seed and Path(seed).is_file()):
        path = Path(seed)
        if not path.is_file():
            raise ConfigError("seed", f"no file {path}", "give the starting text itself or an existing file")
        return [path.read_text()]
    texts = [seed] if isinstance(seed, str) else list(seed) if isinstance(seed, Sequence) else None
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ConfigError(
            "seed", "needs one or more non-empty starting texts", "give a string or a list of them"
        )
    return texts


def _genome(name: Any) -> Any:
    """The registered genome kind ``name`` (``genomes``), as an error naming ``genome``."""
    import genomes

    try:
        return genomes.get(name)
    except ConfigError as e:
        raise ConfigError("genome", e.problem, e.fix) from None


def _budget(budget: Any) -> Budget:
    """``budget=`` as a ``qd.Budget``: every limit positive (a limit of 0 would stop the run
    before it starts), at least one of them."""
    if budget is None:
        budget = DEFAULT_BUDGET
    if isinstance(budget, Budget):
        limits = {k: getattr(budget, v) for k, v in BUDGET_KEYS.items() if getattr(budget, v) is not None}
    elif isinstance(budget, Mapping):
        unknown = [k for k in budget if k not in BUDGET_KEYS]
        if unknown:
            raise ConfigError("budget", f"unknown limit {unknown[0]!r}", f"use {', '.join(BUDGET_KEYS)}")
        limits = {k: v for k, v in budget.items() if v is not None}
    else:
        raise ConfigError("budget", f"is a {type(budget).__name__}", "give a dict such as {'llm_calls': 50}")
    if not limits:
        raise ConfigError("budget", "sets no limit: the run would never stop", "give e.g. {'llm_calls': 50}")
    for key, value in limits.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(
                "budget", f"{key} is {value!r}: the run would stop before it starts", "give a positive number"
            )
    return Budget(**{BUDGET_KEYS[k]: v for k, v in limits.items()})


def _splits(splits: Sequence[float] | None) -> dict[str, Any]:
    """``splits=`` as ``dataset_task`` takes it (checked there)."""
    return {} if splits is None else {"splits": tuple(splits)}


def _operators(names: Sequence[str]) -> list[str]:
    """The LLM operators by name, each known (``operators.check_text_operator``)."""
    from operators import check_text_operator

    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ConfigError("operators", "is empty", "name at least one, e.g. ('rewrite',)")
    for name in names:
        try:
            check_text_operator(name)
        except ConfigError as e:
            raise ConfigError("operators", e.problem, e.fix) from None
    return names


def _memory(memory: Any) -> MemorySettings:
    """``memory=`` as the run's ``MemorySettings``: off (None, False), the ``memory=on`` config
    group (True), or that group with a dict's ``MemoryConf`` fields over it, checked as ``qd-run``
    checks the group (so ``memory=True`` here and ``memory=on`` there are one setting)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from qd.config import MemoryConf, check_ranges
    from qd.memory import plan_memory
    from qd.paths import conf_dir

    if memory is None or memory is False:
        return MemorySettings()
    if memory is not True and not isinstance(memory, Mapping):
        raise ConfigError(
            "memory", f"is a {type(memory).__name__}", "give True, or a dict such as {'children': 3}"
        )
    try:
        conf = OmegaConf.merge(
            OmegaConf.structured(MemoryConf),
            OmegaConf.load(conf_dir() / "memory" / "on.yaml"),
            {} if memory is True else dict(memory),
        )
    except OmegaConfBaseException as e:
        fields = ", ".join(f.name for f in dataclasses.fields(MemoryConf))
        raise ConfigError("memory", str(e).splitlines()[0], f"give True, or a dict of {fields}") from None
    check_ranges(conf, MemoryConf, "memory.")
    return plan_memory(conf, text=True)


def _fronts(spec: Any, front_size: int | None, task: Any) -> Any:
    """The grid as ``front_size=`` asks: unchanged (None), or a Pareto front of that many in
    each of its cells over the task's objectives (``archive=pareto``'s archive)."""
    if front_size is None:
        return spec
    from qd.archive import ParetoSpec
    from qd.task import objectives_of

    count = len(objectives_of(task))
    if not count:
        raise ConfigError(
            "front_size",
            "keeps fronts of objectives, and none are given",
            "pass objectives=[(name, 'max'), ...]",
        )
    return ParetoSpec(spec, _positive("front_size", front_size), count)


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(name, f"is {value!r}", "give a whole number of at least 1")
    return value


def _run_dir(run_dir: str | Path | None, genome: str) -> Path:
    """The run's folder: a new one under ``runs/``, or the one given. A folder holding a run
    that ``qd.optimize`` did not make is refused (``qd-run resume=`` continues it), and so is
    one made for another genome."""
    if run_dir is None:
        return Path("runs") / f"optimize-{genome}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}"
    folder = Path(run_dir)
    marker, store = folder / layout.OPTIMIZE, folder / layout.STORE
    if store.exists() and not marker.exists():
        raise ConfigError(
            "run_dir",
            f"{folder} holds a run qd.optimize did not make",
            f"continue it with qd-run resume={folder}",
        )
    if marker.exists() and json.loads(marker.read_text()).get("genome") != genome:
        raise ConfigError("run_dir", f"{folder} holds a run of another genome", "give a new run_dir")
    return folder


def _mark(folder: Path, genome: str, evaluate: Any, dataset: Any, task: Any) -> None:
    """``optimize.json``: the run was made by ``qd.optimize`` (its evaluator is the caller's own
    Python object, so only the same call can continue it), what it was given, and what readers
    of the run need of its task, which no file names (:func:`saved_task`)."""
    held_out = getattr(task, "held_out", None)
    made = {
        **MARKER,
        "genome": genome,
        "evaluate": getattr(evaluate, "__qualname__", None) if evaluate is not None else None,
        "dataset": dataset if isinstance(dataset, (str, Path)) else None,
        "description": task.description,
        "held_out": held_out() if callable(held_out) else [],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / layout.OPTIMIZE).write_text(json.dumps(made, default=str, indent=2) + "\n")


@dataclasses.dataclass(frozen=True)
class SavedTask:
    """A ``qd.optimize`` run's task as its readers see it (``qd export``): what the operators were
    told, and the held-out items (a dataset's test inputs) no export may hold."""

    description: str
    held_out_items: tuple[str, ...] = ()

    def held_out(self) -> list[str]:
        return list(self.held_out_items)


def saved_task(run_dir: str | Path) -> SavedTask | None:
    """The task of the ``qd.optimize`` run in ``run_dir`` (None: ``qd.optimize`` did not make it)."""
    marker = Path(run_dir) / layout.OPTIMIZE
    if not marker.exists():
        return None
    made = json.loads(marker.read_text())
    return SavedTask(made.get("description", ""), tuple(made.get("held_out", ())))
