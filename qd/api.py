"""qd from Python: compose a config with the CLI's names, build a run, run it, read what it found.

    import qd

    cfg = qd.compose(["experiment=sphere", "runner.max_evaluations=2048"])
    engine = qd.build(cfg, "runs/demo", on_commit=lambda event: print(event["global"]["qd_score"]))
    try:
        summary = engine.run()
    finally:
        engine.close()
    best = qd.elites("runs/demo")[0]

``compose`` takes exactly what ``qd-run`` takes on its command line (hydra
overrides), ``build`` is what ``qd-run`` builds (validated once into a plan, so
a bad field fails here with the CLI's one-line error), and ``on_commit`` sees
each ``commit`` event of ``events.jsonl`` (``qd.events``) as it is written:
benchmarks and notebooks follow a run through it instead of patching the engine.

``build`` also takes the parts themselves, with no config at all: a task object, an archive
spec, operators (built, or names of LLM operators), an LLM client, a budget, the driver's
settings (``qd.assembly.Settings``) and run memory (``qd.memory.MemorySettings``); what is not
given gets the defaults the experiments use (MAP-Elites, the task's own evaluation: in process
for a numeric task, its ``host_entry`` on the host or its ``sandbox_entry`` in the sandbox for a
text task). Such a run uses the host loop; the device loop is built from a config.

    run = qd.build(run_dir="runs/mine", task=MyTask(), spec=qd.archive.GridSpec((10,), (0.0,), (1.0,)),
                   llm=client, operators=["rewrite"], budget=qd.Budget(max_llm_calls=40))
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig, OmegaConf

from qd.assembly import Run, Settings
from qd.budget import Budget
from qd.contract import Candidate
from qd.memory import MemorySettings
from qd.paths import conf_dir
from qd.plan import compose, plan

__all__ = ["Elite", "Run", "Settings", "build", "compose", "elites", "plan"]


def build(
    cfg: DictConfig | None = None,
    run_dir: str | Path | None = None,
    *,
    on_commit: Callable[[dict], Any] | None = None,
    task: Any = None,
    spec: Any = None,
    operators: list[Any] | None = None,
    evaluator: Any = None,
    llm: Any = None,
    describer: Any = None,
    strategy: Any = None,
    budget: Budget = Budget(),
    settings: Settings = Settings(),
    memory: MemorySettings = MemorySettings(),
) -> Run:
    """The run ``qd-run`` would make of ``cfg`` in ``run_dir`` (a resume if it holds one), or,
    with no ``cfg``, the run of the parts given (see the module doc).

    Starts what the run needs (for a config's text task the LLM server and the sandbox);
    ``close`` stops them. A config is saved as ``config.yaml`` beside the store, as ``qd-run``
    does, so ``qd-run resume=RUN_DIR`` continues it; a run of parts resumes by building it
    again with the same parts.
    """
    if run_dir is None:
        raise TypeError("qd.build: run_dir is required (the folder the run writes)")
    if cfg is not None:
        from qd.run import build_engine

        return build_engine(cfg, Path(run_dir), on_commit=on_commit)
    return _run_of_parts(
        Path(run_dir),
        task=task,
        spec=spec,
        operators=operators,
        evaluator=evaluator,
        llm=llm,
        describer=describer,
        strategy=strategy,
        budget=budget,
        settings=settings,
        memory=memory,
        on_commit=on_commit,
    )


def _run_of_parts(
    run_dir: Path,
    *,
    task: Any,
    spec: Any,
    operators: list[Any] | None,
    evaluator: Any,
    llm: Any,
    strategy: Any,
    on_commit: Callable[[dict], Any] | None,
    **parts: Any,
) -> Run:
    """``build`` without a config: the defaults filled in, then ``qd.assembly.assemble`` and the host loop."""
    from qd.assembly import assemble
    from qd.loop import Engine
    from qd.rundir import write_results
    from qd.search.strategy import Strategy

    if task is None or spec is None:
        raise TypeError("qd.build: without a config, give task= and spec= (and llm= for a text task)")
    text = task.kind != "vector"
    if text and llm is None:
        raise TypeError("qd.build: a text task needs llm= (a qd.llm.LLMClient, or a ChatClient to wrap)")
    client = client_of(llm, run_dir) if text else None
    ops = _operators(task, operators, client, parts["memory"].max_tokens)
    evaluator = evaluator if evaluator is not None else _evaluator(task, client)
    _save_geometry(run_dir, task, spec, ops, parts["settings"])
    engine = Engine(
        assemble(
            task=task,
            spec=spec,
            operators=ops,
            evaluator=evaluator,
            run_dir=run_dir,
            llm=client,
            strategy=strategy or Strategy(),
            on_commit=on_commit,
            **parts,
        )
    )
    engine.on_close(lambda: write_results(run_dir))  # elites.jsonl and best.<ext>, as qd-run's
    return engine


def _save_geometry(run_dir: Path, task: Any, spec: Any, ops: list[Any], settings: Settings) -> None:
    """What the run's readers (``qd.elites``, ``qd show``, ``qd explore``) need beside the store."""
    from qd.rundir.founding import create_of_spec

    text = task.kind != "vector"
    kinds = [op[0].genome.name for op in ops if isinstance(op, tuple) and hasattr(op[0], "genome")]
    genome = (kinds[0] if kinds else "text") if text else None
    create_of_spec(spec, settings.islands, genome, run_dir, task)


def client_of(llm: Any, run_dir: Path) -> Any:
    """The run's client: qd's ``LLMClient`` as given, or a caller's ``ChatClient`` wrapped in
    qd's ledger, budget, retries and response cache (in the run's ``llm_cache/``, as a config's
    run keeps it), so ``max_llm_calls`` binds for it too and a rerun replays it."""
    from qd.llm import ChatTransport, LLMClient, LLMSettings, ModelSpec

    if isinstance(llm, LLMClient):
        return llm
    settings = LLMSettings(
        base_url=None, models=(ModelSpec(type(llm).__name__),), cache_dir=str(run_dir / "llm_cache")
    )
    return LLMClient(settings, transport=ChatTransport(llm))


def _operators(task: Any, operators: list[Any] | None, client: Any, memory_tokens: int) -> list[Any]:
    """(operator, weight) pairs: built operators as given, names built (LLM operators on the run's
    client for text tasks, their run-memory block capped at ``memory_tokens``, framed for the
    task's ``genome`` kind where it names one; numeric ones within the task's bounds); the
    default: one rewrite or one Gaussian operator."""
    import genomes
    from operators import make_numeric_operator, make_text_operator

    kind = getattr(task, "genome", None)
    framed = {"genome": genomes.get(kind)} if isinstance(kind, str) else {}

    def made(op: Any) -> Any:
        if not isinstance(op, str):
            return op
        if client is not None:
            return make_text_operator(op, client, memory_tokens=memory_tokens, **framed)
        # a numeric operator by name takes the settings of its config (conf/operators/NAME.yaml)
        params = OmegaConf.to_container(OmegaConf.load(conf_dir() / "operators" / f"{op}.yaml").mix[0])
        params = {k: v for k, v in params.items() if k not in ("name", "weight")}
        return make_numeric_operator(op, *getattr(task, "genome_bounds", (-np.inf, np.inf)), **params)

    default = ["rewrite"] if client is not None else ["gaussian"]
    return [
        (made(op[0]), op[1]) if isinstance(op, tuple) else op if hasattr(op, "weight") else (made(op), 1.0)
        for op in (operators or default)
    ]


def _evaluator(task: Any, client: Any) -> Any:
    """The task's own evaluation: in process (numeric), or its stages on the host or in the sandbox;
    a task whose evaluation calls the model (``task.models``: a host task, an agent in the sandbox)
    gets the run's ``client``, within its ``eval_budget`` (a ``CallBudget``; the default one if it
    has none)."""
    from qd.evaluator import HostRunner, InProcessEvaluator, StagedEvaluator
    from qd.llm.gateway import CallBudget

    if task.kind == "vector":
        return InProcessEvaluator(task)
    calls = (
        (client, getattr(task, "eval_budget", None) or CallBudget()) if getattr(task, "models", False) else ()
    )
    if getattr(task, "host_entry", None) is not None:
        return StagedEvaluator(task, HostRunner(task.host_entry), *calls)
    from qd.sandbox import Sandbox

    return StagedEvaluator(task, Sandbox(task.sandbox_entry), *calls)  # an agent calls the model from there


@dataclasses.dataclass(frozen=True)
class Elite:
    """One archive cell's elite: where it is, and the stored candidate (genome, lineage, metrics)."""

    island: int
    cell: int
    fitness: float
    descriptor: np.ndarray
    candidate: Candidate


def elites(run_dir: str | Path) -> list[Elite]:
    """The run's elites, best first: the archive a resume would rebuild (its last checkpoint
    and the store rows after it), so a run still going reads as well as a finished one."""
    from qd.rundir import RunDir

    with RunDir(run_dir) as run:
        snap = run.snapshot()
        return [Elite(i, k, float(snap.fitness[i, k]), snap.descriptor[i, k], c) for i, k, c in run.placed()]
