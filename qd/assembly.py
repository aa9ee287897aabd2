"""The composition root: every run's parts are built here, once, and handed to a driver.

A run is made of built parts: the store it writes, the placement rule, the search step, the
proposer, the budget ledger, the event log and the report, plus the run state they pass along
(loaded from the checkpoint and the store rows after it). :func:`assemble` builds those parts
from Python objects (a task, an archive spec, operators, an evaluator, a chat client) and
returns them as one frozen :class:`Parts`; the host driver (``qd.loop.Engine``) only runs
them, and opens or builds nothing itself. Hydra's config is one front door to this module
(``qd.run.build_engine`` turns a plan into these arguments), ``qd.build(task=..., ...)``
another; both return a :class:`Run`, the interface the host and device drivers share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from qd import archive
from qd import state as run_state
from qd.budget import Budget, Spending
from qd.elite_table import EliteTable
from qd.errors import CheckpointError
from qd.events import EventLog
from qd.fronts import meter_in
from qd.lessons import LessonsWriter
from qd.llm import Ledger
from qd.memory import ChildMemory, MemorySettings
from qd.placement import Placement
from qd.proposers import TextProposer, VectorProposer
from qd.report import Report
from qd.rundir import layout
from qd.rundir.replay import replay
from qd.search.gate import DuplicateIndex
from qd.search.scheduler import make_bandit
from qd.search.step import SearchStep
from qd.search.strategy import Arm, Strategy
from qd.stop_rules import StopRules
from qd.store import Store
from qd.task import objectives_of


@runtime_checkable
class Run(Protocol):
    """What a built run offers its caller, whichever driver runs it (host or device loop)."""

    def run(self) -> dict[str, Any]:
        """Runs until a budget is spent or a stop is asked for; the final summary."""
        ...

    def summary(self) -> dict[str, Any]:
        """The run so far."""
        ...

    def on_close(self, fn: Callable[[], Any]) -> None:
        """Registers ``fn()`` to run at :meth:`close` (stopping a server the run started)."""
        ...

    def close(self) -> None:
        """Closes the store and the evaluator, then the ``on_close`` callbacks."""
        ...


@dataclasses.dataclass(frozen=True)
class Settings:
    """The driver's numbers: how many islands, how much in flight, how often it checkpoints.

    Attributes:
        islands: the island count.
        batch_size: children per proposal at most.
        in_flight: proposals running at once.
        commit_group: proposals per wave at most (None: half of ``in_flight``).
        checkpoint_every: proposals committed between checkpoints.
        seed: the run's seed (every random draw comes from its key).
        initial_population: founder children in flight at most per empty island.
        qd_offset: subtracted from each elite's fitness in the QD score.
        progress: draw a progress line on the terminal.
        stop: the stop rules beside the budgets (``qd.stop_rules``: a target, patience, the guard).
    """

    islands: int = 1
    batch_size: int = 64
    in_flight: int = 1
    commit_group: int | None = None
    checkpoint_every: int = 10
    seed: int = 0
    initial_population: int = 8
    qd_offset: float = 0.0
    progress: bool = True
    stop: StopRules = StopRules()

    @property
    def group(self) -> int:
        return max(1, self.commit_group or self.in_flight // 2)

    @property
    def founder_proposals(self) -> int:
        return max(1, -(-self.initial_population // self.batch_size))


@dataclasses.dataclass(frozen=True)
class Parts:
    """Everything the host driver runs, built (see the module doc); ``state`` is where it starts."""

    settings: Settings
    task: Any
    evaluator: Any
    llm: Any
    store: Store
    placement: Placement
    search: SearchStep
    proposer: Any
    spending: Spending
    events: EventLog
    report: Report
    elites: EliteTable
    strategy: Strategy
    state: run_state.RunState
    checkpoints: Path
    meta: Any = None
    lessons: Any = None  # qd.lessons.LessonsWriter, or None
    tiebreak: Any = None
    on_commit: Callable[[dict], Any] | None = None


def arms_of(operators: list[Any]) -> tuple[list[Arm], np.ndarray]:
    """The operators as arms (an ``Arm``, or an (operator, weight) pair), and their weights."""
    arms = [a if isinstance(a, Arm) else Arm(a[0], None, float(a[1])) for a in operators]
    weights = np.asarray([a.weight for a in arms], np.float64)
    if len(weights) == 0 or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("operators.mix: need at least one operator with a positive weight")
    return arms, weights


def assemble(
    *,
    task: Any,
    spec: Any,
    operators: list[Any],
    evaluator: Any,
    run_dir: str | Path,
    llm: Any = None,
    describer: Any = None,
    strategy: Strategy = Strategy(),
    budget: Budget = Budget(),
    settings: Settings = Settings(),
    memory: MemorySettings = MemorySettings(),
    on_commit: Callable[[dict], Any] | None = None,
) -> Parts:
    """A run's parts in ``run_dir``, resumed from its checkpoint and store if it holds a run.

    Args:
        task: initial genomes and evaluator (a numeric ``Task`` or a ``TextTask``).
        spec: archive tessellation (GridSpec / CVTSpec / NoveltySpec / ParetoSpec, whose fronts
            hold the task's objectives: ``qd.task.objectives_of``).
        operators: the arms, as ``qd.search.strategy.Arm``s or (operator, weight) pairs.
        evaluator: async ``evaluator(genomes) -> Evaluation``.
        llm: the run's ``qd.llm.LLMClient`` (text tasks).
        describer: a ``descriptors.base.Descriptor`` placing text candidates (None: the task's own
            descriptors). Its ``dim`` must match ``spec``.
        strategy: islands, selection, scheduler, meta-prompts, novelty gate, cyclic objectives
            and tie judge (``qd.search.strategy``; the default is plain MAP-Elites).
        memory: run memory (``qd.memory``): what text tasks' LLM prompts show of the run's past.
        on_commit: called with each ``commit`` event (``qd.events``) as it is written.
    """
    arms, weights = arms_of(operators)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = Store(run_dir / layout.STORE)
    text, s = task.kind != "vector", settings
    ports = store.ports()  # what plug-ins get of the store: never the store itself
    meta = strategy.meta(ports.log) if strategy.meta is not None else None
    gate = strategy.gate(ports.cache) if strategy.gate is not None else None
    tiebreak = strategy.tiebreak(llm) if strategy.tiebreak is not None else None
    if describer is not None:
        describer.attach(ports, llm)
    placement = Placement(spec, describer, strategy.cycle, task.kind, s.islands, s.seed, objectives_of(task))
    bandits = strategy.scheduler or (make_bandit("fixed", len(arms), weights=weights),)
    search = SearchStep(strategy, arms, bandits, s.islands, s.qd_offset, meta)
    fresh = run_state.init(placement.spec(), s.islands, bandits, len(arms), s.seed)
    state = _resumed(run_dir / layout.CHECKPOINTS, fresh, placement, meta, s.islands)
    state = state.count(valid=store.count(valid=True, kind=task.kind))
    spent = Ledger.from_rows(store.calls.totals())  # committed LLM calls: what budgets count
    if llm is not None:
        llm.ledger.merge(spent)
    per_child = (
        1
        + placement.calls_per_child
        + evaluator.model_calls
        + (tiebreak.calls_per_item if tiebreak is not None else 0)
    )
    spending = Spending(
        budget, store.count(kind=task.kind), spent, per_child if text else 0, evaluator.model_calls
    )
    recall, lessons = _memory(memory, store, task) if text and memory.on else (None, None)
    proposer = (
        TextProposer(
            task,
            arms,
            evaluator,
            placement=placement,
            spending=spending,
            store=store,
            duplicates=DuplicateIndex(ports.cache),
            gate=gate,
            meta=meta,
            memory=recall,
            batch_size=s.batch_size,
        )
        if text
        else VectorProposer(task, arms, evaluator)
    )
    state = _replayed(store, placement.spec(state), state, placement.objectives)
    cells, fronts = archive.has_cells(spec), bool(placement.objectives)  # a front's inserts do not add up
    meter = meter_in(run_dir, placement.objectives)  # a Pareto run's hypervolume (qd.fronts)
    report = Report(
        s.islands, s.qd_offset, s.islands > 1 and cells, llm, describer, cells and not fronts, budget, meter
    )
    elites = EliteTable.from_store(state.archive, store, None if text else task.genome_dim)
    report.refresh(state.archive)
    return Parts(
        settings=s,
        task=task,
        evaluator=evaluator,
        llm=llm,
        store=store,
        placement=placement,
        search=search,
        proposer=proposer,
        spending=spending,
        events=EventLog(run_dir / layout.EVENTS),
        report=report,
        elites=elites,
        strategy=strategy,
        state=state,
        checkpoints=run_dir / layout.CHECKPOINTS,
        meta=meta,
        lessons=lessons,
        tiebreak=tiebreak,
        on_commit=on_commit,
    )


def _memory(settings: MemorySettings, store: Store, task: Any) -> tuple[ChildMemory, LessonsWriter | None]:
    """The run's memory, rebuilt from the store (a resumed run remembers what it had committed),
    and the writer of its lessons note (None: ``lessons_every`` 0)."""
    import genomes

    ports = store.ports()
    memory = ChildMemory(ports.cache, settings.children)
    memory.rebuild(store.iter(), task.kind)
    if settings.lessons_every <= 0:
        return memory, None
    noun = genomes.of_task(task).noun
    return memory, LessonsWriter(memory, ports.log, settings.lessons_every, settings.model, noun)


def _resumed(
    directory: Path, fresh: run_state.RunState, placement: Placement, meta: Any, islands: int
) -> run_state.RunState:
    """The checkpointed state (``fresh`` if none), with the placement and pool it implies."""
    loaded = run_state.load(directory, fresh)
    if loaded is None:
        return fresh
    loaded = placement.resume(loaded)
    if meta is not None and loaded.meta:
        meta.load_state_dict(loaded.meta)
    shape, want = loaded.archive.genome_id.shape[:2], (islands, placement.spec(loaded).num_cells)
    if shape != want:
        raise CheckpointError(
            f"checkpoint in {directory} holds {shape[0]} islands x {shape[1]} cells but the config "
            f"asks for {want[0]} x {want[1]}; resume with the run's own config.yaml"
        )
    return loaded


def _replayed(store: Store, spec: Any, state: run_state.RunState, objectives: tuple) -> run_state.RunState:
    """``state`` with every store row newer than its checkpoint inserted (``qd.rundir.replay``):
    after ``kill -9`` each evaluated candidate counts once, and the proposal clock stored with
    the rows moves past theirs (a proposal number drawn again would draw the same parents and
    seed: a duplicate of a stored child)."""
    c = state.counters
    r = replay(store, spec, state.archive, state.islands, c.last_id, objectives)
    if r is None:
        return state
    started = max(c.proposals, int(store.meta.get(run_state.PROPOSALS_STARTED, 0)))
    return state._replace(archive=r.archive, islands=r.islands).count(
        last_id=r.last_id, batches=c.batches + 1, insertions=c.insertions + r.offered, proposals=started
    )
