"""What an experiment provides: initial genomes and a (vectorized) evaluator.

A task is a ``task.py`` that defines ``make_task(**params) -> Task``, named by
``experiment.task``: a folder name in ``experiments/`` (``sphere``), or the path of
the user's own file (``my_task/task.py``, relative to the current directory,
absolute, or ``~/...``). It is loaded by file path, so experiments need not be
importable packages and ship unchanged inside the wheel, and a task needs no
install. The contract, with an example: ``docs/tasks.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, get_args, get_type_hints

import numpy as np

from qd.contract import ConfigError
from qd.paths import experiments_dir


@dataclasses.dataclass
class Evaluation:
    """Results for a batch of B genomes.

    Attributes:
        fitness: f32[B]; descriptor: f32[B, D]; valid: bool[B] (False = failed);
        metrics: B dicts of extra numbers (or None); error: B reasons (None if ok);
        artifacts: B dicts of feedback for later prompts (or None);
        seconds: B evaluation wall times (or None).
        traces: B lists of the model calls each evaluation made (or None: no model calls).
    """

    fitness: np.ndarray
    descriptor: np.ndarray
    valid: np.ndarray
    metrics: list[dict] | None = None
    error: list[str | None] | None = None
    artifacts: list[dict | None] | None = None
    seconds: list[float | None] | None = None
    traces: list[list[dict] | None] | None = None


class Task(Protocol):
    """A numeric task: vectorized and trusted, so it is evaluated in process."""

    kind: str  # "vector"
    descriptor_dim: int
    genome_dim: int  # length of a vector genome
    # Optional: ``descriptor_names``, what each descriptor axis measures (``qd.task.descriptor_names``).
    # Optional: ``objectives``, named objectives with directions (``qd.task.objectives_of``).

    def initial(self, rng: np.random.Generator, n: int) -> Any:
        """n starting genomes, f32[n, dim]."""
        ...

    def evaluate(self, genomes: Any) -> Evaluation:
        """Evaluates a batch; must not raise for a bad genome (mark it invalid)."""
        ...

    # Optional: ``evaluate_jax(genomes f32[B, dim]) -> (fitness f32[B], descriptor
    # f32[B, D], valid bool[B])``, the same evaluation as a pure, traceable JAX
    # function. A task that has it can run on the device loop (``runner.loop``:
    # select, vary, evaluate and insert fused in one jitted step; see qd.device).


def descriptor_names(task: Any, dim: int) -> tuple[str, ...]:
    """A name per descriptor axis: the task's ``descriptor_names`` when it names each of its
    ``dim`` axes, else ``d0, d1, ...``. Saved with the run, they label the axes of ``qd plot``,
    ``qd explore`` and ``qd show``."""
    names = tuple(getattr(task, "descriptor_names", None) or ())
    return names if len(names) == dim else tuple(f"d{j}" for j in range(dim))


DIRECTIONS = ("max", "min")


def objectives_of(task: Any) -> tuple[tuple[str, str], ...]:
    """The task's named objectives with directions, checked: for example
    ``objectives = (("error", "min"), ("size", "min"))`` on either task protocol.

    Each candidate returns its values in its metrics under those names
    (``Evaluation.metrics``, ``Scored.metrics``); the scalar fitness stays what it was,
    so a task without ``objectives`` (every earlier one) and its stored runs read as
    before. Empty when the task declares none.
    """
    declared = tuple(tuple(entry) for entry in getattr(task, "objectives", None) or ())
    for entry in declared:
        if len(entry) != 2 or not isinstance(entry[0], str) or entry[1] not in DIRECTIONS:
            raise ConfigError(
                "objectives",
                f"each entry is (name, direction), got {entry!r}",
                f"give a name and one of {list(DIRECTIONS)}",
            )
    names = [name for name, _ in declared]
    if len(set(names)) != len(names):
        raise ConfigError("objectives", f"names repeat: {names}", "name each objective once")
    return declared


def objective_matrix(objectives: tuple[tuple[str, str], ...], metrics: list[dict | None]) -> np.ndarray:
    """f32[B, M]: each candidate's objectives read from its metrics, every one maximised.

    A "min" objective is negated here, the one place directions are read, so the
    Pareto archive (``qd.archive.pareto``) only ever maximises. A value that is
    missing or not a number reads as NaN, which the archive treats as an invalid
    candidate.
    """
    sign = np.asarray([1.0 if direction == "max" else -1.0 for _, direction in objectives], np.float32)
    out = np.full((len(metrics), len(objectives)), np.nan, np.float32)
    for row, values in enumerate(metrics):
        for column, (name, _) in enumerate(objectives):
            value = (values or {}).get(name)
            if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
                out[row, column] = value
    return out * sign


def has_device_evaluation(task: Any) -> bool:
    """True if ``task`` provides ``evaluate_jax`` (the device loop can run it)."""
    return getattr(task, "kind", None) == "vector" and callable(getattr(task, "evaluate_jax", None))


@dataclasses.dataclass
class Scored:
    """One text candidate's evaluation, computed by trusted code on the host."""

    fitness: float
    descriptor: Any  # D floats
    valid: bool = True
    metrics: dict[str, float] | None = None
    error: str | None = None  # why it is invalid: shown to the LLM in later prompts
    artifacts: dict[str, Any] | None = None  # extra feedback for prompts (short strings)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of an evaluation cascade, run in the sandbox as ``entry(text, **args)``.

    The next stage runs only if this one scored valid and, when the next stage has
    a ``threshold``, its fitness is at least that (cheap checks first); with ``runs_if``,
    only if ``runs_if(text, scored_so_far)`` holds too: a cascade that depends on the
    candidate, e.g. on its parents' scores (:func:`parents_of`).

    ``same_visit``: this stage runs in the sandbox process of the stage before it, right
    after it and before that stage is scored (one fork, one process and one set of limits
    for both; ``Sandbox.run``'s ``then``). Its output is still used only if the gate above
    lets it, so a candidate the gate stops has run it anyway: for a cheap stage after a cheap
    one, where a second process costs more than the stage (function_fit's held-out points).
    A task whose evaluation calls the model, or a runner without the feature (Ray), runs
    each stage in its own visit.
    """

    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    threshold: float | None = None
    name: str = "main"
    runs_if: Callable[[str, Scored], bool] | None = None
    same_visit: bool = False


_PARENTS: contextvars.ContextVar[dict[str, list[Any]]] = contextvars.ContextVar("qd_parents", default={})


@contextlib.contextmanager
def evaluating_children(parents: dict[str, list[Any]]) -> Iterator[None]:
    """While a proposal's children are evaluated: each child's text -> the parents it was made
    from (``qd.contract.Parent``: their fitness and stored metrics), for :func:`parents_of`."""
    token = _PARENTS.set(parents)
    try:
        yield
    finally:
        _PARENTS.reset(token)


def parents_of(text: str) -> list[Any]:
    """The parents of the child ``text`` being evaluated (``qd.contract.Parent``); empty for a
    founder, an evaluation outside a run's proposals, or a task that does not :func:`reads_parents`."""
    return list(_PARENTS.get().get(text, ()))


def reads_parents(task: Any) -> bool:
    """Whether a stage of ``task``'s cascade runs only for some children (``Stage.runs_if``): the
    one place their parents can matter, so a run sets :func:`parents_of` only for such a task."""
    return any(stage.runs_if is not None for stage in getattr(task, "stages", ()))


class TextTask(Protocol):
    """A program/prompt task: the candidate runs only in the sandbox.

    The untrusted part (``sandbox_entry``, called with the candidate text) returns
    plain JSON; ``score`` then judges that JSON on the host, so a candidate can
    never tamper with its own score or read hidden targets.
    """

    kind: str  # "text"
    descriptor_dim: int
    # Optional: ``descriptor_names``, what each descriptor axis measures (``qd.task.descriptor_names``).
    # Optional: ``objectives``, named objectives with directions (``qd.task.objectives_of``).
    description: str  # what the LLM is told; must not leak hidden targets
    language: str  # "python"
    sandbox_entry: str  # "path/to/file.py:function"
    stages: list[Stage]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]: ...

    def score(self, text: str, outputs: list[Any]) -> Scored:
        """Judges the outputs of the stages run so far; must not raise."""
        ...


def is_task_file(ref: str) -> bool:
    """True when ``experiment.task`` names a file rather than a folder of ``experiments/``
    (a name never has a ``/``, a ``.py`` suffix or a leading ``~``)."""
    return "/" in ref or ref.endswith(".py") or ref.startswith("~")


def task_ref(ref: str) -> str:
    """``experiment.task`` as a run saves it: an experiment's name unchanged, a file's
    absolute path (so ``resume=RUN_DIR`` finds it from any directory)."""
    return str(Path(ref).expanduser().resolve()) if is_task_file(ref) else ref


def task_params(experiment: Any) -> dict[str, Any]:
    """The params ``make_task`` is called with for a run's ``experiment`` config: its ``params``,
    and ``experiment.dataset``/``experiment.metric`` only where they are set (a task that evolves
    on a user's rows takes them: ``qd.data.task.experiment_make_task``), so a task that takes no
    dataset is never handed them. One given in ``params`` wins: a saved run holds there its
    dataset's path made absolute (``task.resolved_params``)."""
    from omegaconf import OmegaConf

    params = OmegaConf.to_container(experiment.params, resolve=True) or {}
    routed = {key: experiment[key] for key in ("dataset", "metric") if experiment.get(key) is not None}
    return {**routed, **params}


def load_task(name: str, params: dict[str, Any]) -> Task:
    """Imports the ``task.py`` that ``name`` (``experiment.task``) names and calls ``make_task(**params)``
    (a run's params: :func:`task_params`).

    A user's file is imported under a name derived from its resolved path, the same in
    every process (pool workers re-load the task by this name and unpickle its classes).
    """
    if is_task_file(name):
        path = Path(task_ref(name))
        if not path.is_file() or path.suffix != ".py":
            raise ConfigError(
                "experiment.task",
                f"no task file {path}",
                "give the path of a .py file that defines make_task(**params): "
                "relative to the current directory, absolute, or ~/...",
            )
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        module = load_module(path, f"qd_task_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}")
    else:
        path = experiments_dir() / name / "task.py"
        if not path.is_file():
            known = sorted(p.name for p in experiments_dir().iterdir() if (p / "task.py").is_file())
            raise ConfigError(
                "experiment.task",
                f"no experiment {name!r}",
                f"use one of {known}, or the path of your own task.py",
            )
        module = load_module(path, f"qd_experiment_{name}")
    fix = (
        f"a task file gets the params (and archive) of the experiment it runs under: pick one that fits "
        f"with experiment=NAME, or give {path.name} its own experiment yaml with --config-dir "
        "(docs/tasks.md)"
        if is_task_file(name)
        else f"see {path}"
    )
    known = declared_params(module.make_task)
    unknown = [key for key in params if known is not None and key not in known]
    if unknown:
        takes = f"its params: {', '.join(known)}" if known else "it takes none"
        raise ConfigError(f"experiment.params.{unknown[0]}", f"not a param of {name} ({takes})", fix)
    try:
        task = module.make_task(**params)
    except TypeError as e:
        raise ConfigError("experiment.params", str(e), fix) from None
    _check_entries(task, path)
    return task


def declared_params(make_task: Callable[..., Any]) -> list[str] | None:
    """The params ``make_task`` takes by name: its own keywords and, where it passes
    ``**params`` on to the class its return annotation names (the first, for a union:
    ``-> ReasoningTask | DatasetTask``), that class's (a dataclass's fields). None where it
    takes any keyword, so that nothing can be checked up front."""
    own = _keywords(make_task, keep_var=True)
    if not own or own[-1] != "**":
        return own
    try:
        made = get_type_hints(make_task).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve: nothing to check against
        return None
    made = next(iter(get_args(made)), None) if get_args(made) else made
    passed = _keywords(made) if isinstance(made, type) else None
    return None if passed is None else [*own[:-1], *(n for n in passed if n not in own)]


def _keywords(fn: Callable[..., Any], keep_var: bool = False) -> list[str] | None:
    """``fn``'s keyword parameters; if it takes ``**kwargs``, None (``keep_var``: they end with ``"**"``)."""
    params = inspect.signature(fn).parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return [*names, "**"] if keep_var else None
    return names


def _check_entries(task: Any, path: Path) -> None:
    """A file entry must be absolute: relative, it would name another file once the run
    resumes from another directory (the sandbox resolves it against the current one)."""
    for attr in ("sandbox_entry", "host_entry"):
        entry = getattr(task, attr, None)
        target = entry.rpartition(":")[0] if isinstance(entry, str) else ""
        if target.endswith(".py") and not Path(target).expanduser().is_absolute():
            raise ConfigError(
                "experiment.task",
                f"{path}: {attr} {entry!r} is a relative path",
                "build it from the task's own file, e.g. f\"{Path(__file__).parent / 'entry.py'}:run\"",
            )


def load_module(path: str | Path, module_name: str) -> Any:
    """The module at ``path``, imported once as ``sys.modules[module_name]``: how an experiment
    (a folder, not a package) imports its own files; shared code is a module of the package."""
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = (
            module  # before running it: picklable by process pools, and dataclasses need it
        )
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return module
