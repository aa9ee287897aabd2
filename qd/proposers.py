"""Proposals: children of parents from one island, made by one arm, evaluated and placed.

A proposer is started with a small :class:`Ticket` (which island, how many
children, which arm, its keys) and an ``qd.elite_table.ArchiveView``. It reads the
view while it starts, synchronously, then returns the awaitable that makes the
children, evaluates them and (text) describes them. The driver commits the
finished :class:`Proposal`; no proposer sees the driver.

- :class:`VectorProposer`: numeric operators on vector genomes, evaluated by the task.
- :class:`TextProposer`: one LLM call per child; the novelty gate may turn an
  answer away and ask again; exact duplicates of evaluated texts copy the
  stored evaluation; the rest run in the sandbox, then go to the describer.

An empty island first gets children of the task's initial genomes (its
*founders*): vectors varied once by the operator, texts as they are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import jax
import numpy as np

import genomes
from qd.contract import Candidate, Child, LLMError, Parent, PromptContext, sample_index
from qd.elite_table import ArchiveView
from qd.evaluator import failed_batch
from qd.llm import Ledger, tally
from qd.search import select
from qd.search.gate import rejected, reuse
from qd.task import evaluating_children, reads_parents
from qd.workbench import TrialBench


@dataclasses.dataclass(frozen=True)
class Ticket:
    """What one proposal is to make; everything random about it comes from its wave's keys.

    ``founding``: the island is empty, so its children come from the task's
    initial genomes and no arm is credited; ``genome_seed`` seeds those genomes
    and the per-child prompt randomness. ``picks``: its parents (``size *
    num_parents``, in child order) and each child's inspirations (``size x
    num_inspirations``) as host arrays; None for founders. ``op_key`` is its
    operator's key, made from ``op_data`` only when asked (text operators never do).
    """

    seq: int
    island: int
    size: int
    arm: int
    founding: bool
    genome_seed: int
    picks: select.Picks | None
    keys: Callable[[np.ndarray], jax.Array] = dataclasses.field(repr=False)
    op_data: np.ndarray = dataclasses.field(repr=False)
    fits: int = 0  # the describer fits when it started: described under an older fit, it is redone

    @property
    def op_key(self) -> jax.Array:
        return self.keys(self.op_data)


_wrap = jax.jit(jax.random.wrap_key_data, static_argnames="impl")  # a third of the eager primitive's cost
_last_key: list[Any] = [None, None]  # the last run key read, and its data


def _key_data(key: jax.Array) -> np.ndarray:
    """The run key's data on the host, read once per key (the key changes only when islands move)."""
    if _last_key[0] is not key:
        _last_key[:] = key, np.asarray(jax.random.key_data(key))
    return _last_key[1]


class _LazyGenerator:
    """``np.random.default_rng(seed)``, made the first time it is used.

    A child's prompt randomness (``PromptContext.rng``: a weighted model choice, a meta
    instruction, a plug-in operator's draws) is most often never drawn from (one model,
    no meta prompts), and making a generator is among the dearest steps of a child's
    set-up in the event loop (~50 us of ~1.2 ms per candidate at C=64, cold caches).
    Its methods and attributes are the generator's, and ``isinstance(rng,
    np.random.Generator)`` holds; the stream is the one the eager generator gives (a copy
    or a pickle is the generator itself)."""

    __slots__ = ("_seed", "_rng")

    def __init__(self, seed: Any):
        self._seed, self._rng = seed, None

    @property
    def __class__(self) -> type:  # (isinstance reads it)
        return np.random.Generator

    def _generator(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    def __getattr__(self, name: str) -> Any:
        if name in _LazyGenerator.__slots__:  # (unset: an instance made without __init__)
            raise AttributeError(name)
        return getattr(self._generator(), name)

    def __reduce__(self) -> Any:  # copied or pickled: the generator itself, in its state
        return self._generator().__reduce__()


class Wave:
    """The draws of a wave of up to ``n`` proposals, the next ones of the run ``state``, all
    reading ``view``, with the arms of ``search`` (``qd.search.step.SearchStep``);
    :meth:`ticket` hands them out in order.

    Everything comes from one numpy generator seeded with the run key's data and the
    wave's first proposal number (both in every checkpoint; no two waves share that
    number), drawn in a fixed order when the first ticket is asked for: each proposal's
    genome seed and operator key, its arm (with one arm, none is drawn; else
    ``SearchStep.choose``, one dispatch), then every parent and inspiration of the wave
    (``ArchiveView.picks``: uniform rules on the host, the others in one dispatch). So a
    wave costs the loop no jitted dispatch per proposal, and none at all for uniform
    selection among one arm; the run key itself is left as it is.
    """

    def __init__(self, state: Any, n: int, view: ArchiveView, search: Any, batch_size: int):
        self.n, self.island = n, (state.counters.proposals + np.arange(n)) % search.islands
        self._state, self._view, self._search, self._batch_size = state, view, search, batch_size

    def _keys(self, data: np.ndarray) -> jax.Array:
        """Typed keys of the run key's kind from key data drawn on the host."""
        return _wrap(data, impl=jax.random.key_impl(self._state.key))

    def _key_data(self, *shape: int) -> np.ndarray:
        return self._rng.integers(0, 2**32, (*shape, *self._shape), np.uint32)

    @functools.cached_property
    def _draws(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data = _key_data(self._state.key)
        self._rng = np.random.default_rng([*data.tolist(), self._state.counters.proposals])
        self._shape = data.shape
        words = self._key_data(2 * self.n)  # per proposal its operator key, then its seed
        op_data, seeds = words[: self.n], words[self.n :, 0] >> 1
        arms = self._search.choose(self._state, self.island, lambda: self._keys(self._key_data(self.n)))
        return arms, seeds, op_data

    @functools.cached_property
    def _picks(self) -> select.Picks:
        arms = self._draws[0]
        ops = [a.operator for a in self._search.arms]
        num_parents = np.asarray([op.num_parents for op in ops])
        return self._view.picks(
            self._rng,
            lambda n: self._keys(self._key_data(n)),
            self.island,
            num_parents[arms],
            self._batch_size,
            int(num_parents.max()),
            max(op.num_inspirations for op in ops),
        )

    def ticket(self, row: int, seq: int, size: int, founding: bool) -> Ticket:
        arms, seeds, op_data = self._draws
        arm = int(arms[row])
        picks = None
        if not founding:
            op, p = self._search.arms[arm].operator, self._picks
            n, m = size * op.num_parents, op.num_inspirations
            picks = select.Picks(
                p.genome_id[row, :n], p.cell[row, :n], p.source[row, :size, :m], p.spot[row, :size, :m]
            )
        return Ticket(
            seq,
            int(self.island[row]),
            size,
            arm,
            founding,
            int(seeds[row]),
            picks,
            self._keys,
            op_data[row],
            self._state.counters.fits,
        )


@dataclasses.dataclass
class Proposal:
    """A finished proposal: its candidates, and what the commit credits.

    ``parents`` is i64[B, 2]: (island, cell) of each candidate's first parent, -1
    for founders; ``instructions`` the meta instruction id behind each candidate;
    ``fits`` the describer fit it was described under (None if unfitted);
    ``reserved`` the budget units it held (children and gate resamples); ``trials`` the trial
    evaluations it held (an agent operator's, ``qd.workbench``).
    """

    candidates: list[Candidate]
    arm: int | None
    parents: np.ndarray
    instructions: list[int | None]
    reserved: int
    fits: int | None = None
    calls: Ledger = dataclasses.field(default_factory=Ledger)  # its LLM calls, committed with it
    trials: int = 0


class Proposer(Protocol):
    """Starts a proposal: reads ``view`` now, returns the work that finishes it; is told
    which candidates were committed (a text proposer remembers their texts)."""

    def start(self, ticket: Ticket, view: ArchiveView) -> Awaitable[Proposal]: ...

    def committed(self, candidates: list[Candidate], result: Any) -> None: ...


class VectorProposer:
    """Numeric operators on vector genomes; the task's evaluator places them."""

    def __init__(self, task: Any, arms: list[Any], evaluator: Any):
        self.task, self.arms, self.evaluator = task, arms, evaluator

    def start(self, ticket: Ticket, view: ArchiveView) -> Awaitable[Proposal]:
        t = ticket
        op = self.arms[t.arm].operator
        parents = np.full((t.size, 2), -1, np.int64)
        if t.founding:
            # Founders: the task's initial genomes, varied once
            # (as pyribs's emitters start from x0 plus noise).
            initial = self.task.initial(np.random.default_rng(t.genome_seed), t.size)
            parent_ids = np.zeros((t.size, 0), np.int64)
            genomes, name = np.repeat(np.asarray(initial)[:, None], op.num_parents, axis=1), f"init+{op.name}"
        else:
            cells = t.picks.cell.reshape(t.size, op.num_parents)
            parent_ids = t.picks.genome_id.reshape(t.size, op.num_parents)
            parents[:] = np.stack([np.full(t.size, t.island), cells[:, 0]], 1)
            genomes, name = view.genomes(t.island, cells), op.name
        return self._finish(t, op, genomes, name, parent_ids, parents)

    def committed(self, candidates: list[Candidate], result: Any) -> None:
        pass  # vector genomes are never deduplicated

    async def _finish(
        self, t: Ticket, op: Any, genomes: np.ndarray, name: str, parent_ids: np.ndarray, parents: np.ndarray
    ) -> Proposal:
        genomes = await op(t.op_key, genomes, {"island": t.island})
        try:
            ev = await self.evaluator(genomes)
        except Exception as e:  # a broken evaluation: failed candidates, so the run's guard sees it
            ev = failed_batch(self.task.descriptor_dim, len(genomes), e)
        candidates = [
            Candidate(
                kind="vector",
                genome="vector",
                island=t.island,
                fitness=float(ev.fitness[j]),
                descriptor=ev.descriptor[j],
                valid=bool(ev.valid[j]),
                vector=genomes[j],
                parent_ids=parent_ids[j],
                operator=name,
                metrics=ev.metrics[j] if ev.metrics else None,
                error=ev.error[j] if ev.error else None,
            )
            for j in range(len(ev.fitness))
        ]
        return Proposal(candidates, None if t.founding else t.arm, parents, [None] * len(candidates), t.size)


@dataclasses.dataclass(frozen=True)
class InitialGenome:
    """A task's initial text genome, in the shape of an LLM operator's child."""

    text: str
    error: None = None
    operator: str = "init"
    model: None = None
    prompt: None = None
    response: None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


@dataclasses.dataclass
class Draft:
    """An operator's child before evaluation, and where it came from."""

    child: Any  # a Child (failed calls too: Child.unanswered), or an InitialGenome
    parent_ids: list[int]
    instruction: int | None = None  # meta instruction shown in its prompt
    rejection: dict[str, Any] | None = None  # the candidate's fields when the novelty gate turned it away
    resample: bool = False  # asked again after a rejection (an extra LLM call)
    extra_calls: int = 0  # calls its operator reserved beyond the first (debug rounds), released at commit
    trial: dict[str, Any] | None = None  # an agent's trial: its candidate's fields (``qd.workbench``)

    @property
    def usable(self) -> bool:
        return self.child.text is not None and self.rejection is None and self.trial is None


def as_parent(candidate: Candidate) -> Parent:
    """An elite as an LLM operator shows it: code, score, metrics and evaluator feedback."""
    notes = [f"error: {candidate.error}"] if candidate.error else []
    for name, value in (candidate.artifacts or {}).items():
        notes.append(f"{name}:\n{value}")
    return Parent(
        candidate.id, candidate.text, candidate.fitness, candidate.metrics, "\n".join(notes) or None
    )


@dataclasses.dataclass(frozen=True)
class Shown:
    """What a text proposal's children are shown, read from the view when it starts."""

    parents: list[list[Parent]]  # per child
    inspirations: list[list[Parent]]  # per child
    elites: list[Candidate]  # the island's elites, when the gate compares with them
    first_cells: np.ndarray  # i64[B]: cell of each child's first parent
    memory: Any = None  # the parents' children as committed now (``qd.memory.Recalled``), or None


class TextProposer:
    """LLM children of selected elites (or an empty island's founders), gated,
    deduplicated, evaluated in the sandbox and placed by the describer.

    Args:
        task, arms, evaluator: the run's.
        placement: ``qd.placement.Placement`` (describes children).
        spending: ``qd.budget.Spending`` (gate resamples reserve their call there).
        duplicates: ``qd.search.gate.DuplicateIndex`` of evaluated texts.
        store: reads the stored originals of duplicates.
        gate, meta: the novelty gate and the instruction pool, or None.
        memory: the run's ``qd.memory.ChildMemory`` (prompts show parents' children), or None.
        batch_size: fixes each child's place in the sample-index stream.
    """

    def __init__(
        self,
        task: Any,
        arms: list[Any],
        evaluator: Any,
        *,
        placement: Any,
        spending: Any,
        duplicates: Any,
        store: Any,
        gate: Any = None,
        meta: Any = None,
        memory: Any = None,
        batch_size: int = 1,
    ):
        self.task, self.arms, self.evaluator, self.placement = task, arms, evaluator, placement
        self.spending, self.duplicates, self.store = spending, duplicates, store
        self.gate, self.meta, self.memory, self.batch_size = gate, meta, memory, batch_size
        self.genome = genomes.of_task(task)

    def start(self, ticket: Ticket, view: ArchiveView) -> Awaitable[Proposal]:
        return self._finish(ticket, None if ticket.founding else self._show(ticket, view))

    def committed(self, candidates: list[Candidate], result: Any) -> None:
        """``result``: the archive's ``InsertResult`` for ``candidates`` (what run memory keeps)."""
        self.duplicates.remember(candidates)  # later exact duplicates reuse their evaluations
        if self.memory is not None:
            self.memory.committed(candidates, result.status)

    def _show(self, t: Ticket, view: ArchiveView) -> Shown:
        op = self.arms[t.arm].operator
        cells, source, spot = t.picks.cell.reshape(t.size, op.num_parents), t.picks.source, t.picks.spot
        shown = [
            [as_parent(view.genomes(i, c)) for i, c in zip(source[j], spot[j]) if c >= 0]
            for j in range(t.size)
        ]
        gated = self.gate is not None and "elites" in self.gate.against
        parents = [[as_parent(view.genomes(t.island, c)) for c in row] for row in cells]
        recalled = (
            self.memory.recall(p.id for row in parents for p in row) if self.memory is not None else None
        )
        return Shown(parents, shown, view.island_elites(t.island) if gated else [], cells[:, 0], recalled)

    async def _finish(self, t: Ticket, shown: Shown | None) -> Proposal:
        with tally() as calls:
            if shown is None:
                texts = self.task.initial(np.random.default_rng(t.genome_seed), t.size)
                drafts, parents = [Draft(InitialGenome(text), []) for text in texts], np.full((t.size, 2), -1)
            else:
                drafts, parents = await self._children(t, shown)
            candidates = await self._evaluate(t.island, drafts, shown)
            fits = t.fits if self.placement.fitted else None
            await self.placement.describe(candidates)
        reserved = t.size + sum(d.resample + d.extra_calls for d in drafts)
        return Proposal(
            candidates,
            None if t.founding else t.arm,
            np.asarray(parents, np.int64).reshape(-1, 2),
            [d.instruction for d in drafts],
            reserved,
            fits,
            calls,
            sum(d.trial is not None for d in drafts),
        )

    @functools.cached_property
    def _cascade_reads_parents(self) -> bool:
        """Decided once (a task's stages are fixed), so a run whose cascade never asks for the
        children's parents builds no parents map per proposal."""
        return reads_parents(self.task)

    async def _evaluate(self, island: int, drafts: list[Draft], shown: Shown | None) -> list[Candidate]:
        """Candidates of the drafts: stored evaluations for duplicates, the sandbox for the rest
        (a cascade may read each child's parents: ``qd.task.parents_of``)."""
        dup = self.duplicates.lookup([d.child.text if d.usable else None for d in drafts])
        originals = dict(zip(dup.stored, self.store.get(dup.stored.values())))
        todo = [j for j, d in enumerate(drafts) if d.usable and j not in dup]
        parents = {}
        if shown is not None and self._cascade_reads_parents:
            shown_by_id = {p.id: p for ps in shown.parents for p in ps}
            parents = {
                drafts[j].child.text: [shown_by_id[i] for i in drafts[j].parent_ids if i in shown_by_id]
                for j in todo
            }
        with evaluating_children(parents):
            ev = await self.evaluator([drafts[j].child.text for j in todo]) if todo else None
        at = {j: k for k, j in enumerate(todo)}
        out = []
        for j, d in enumerate(drafts):
            child, k = d.child, at.get(j)
            if d.rejection is not None or d.trial is not None:
                fields = d.rejection or d.trial
            elif j in originals:  # an exact duplicate: the stored evaluation, not a new one
                fields = reuse(originals[j])
            elif j in dup.earlier:
                fields = reuse(out[dup.earlier[j]])
            elif k is not None:
                fields = dict(
                    fitness=float(ev.fitness[k]),
                    descriptor=ev.descriptor[k],
                    valid=bool(ev.valid[k]),
                    metrics=ev.metrics[k],
                    error=ev.error[k],
                    artifacts=ev.artifacts[k],
                    eval_seconds=ev.seconds[k],
                    trace=ev.traces[k] if ev.traces else None,
                )
            else:
                fields = dict(fitness=math.nan, descriptor=None, valid=False, error=child.error)
            out.append(
                Candidate(
                    kind="text",
                    genome=self.genome.name,
                    island=island,
                    text=child.text,
                    parent_ids=d.parent_ids,
                    operator=child.operator,
                    model=child.model,
                    prompt=child.prompt,
                    response=child.response,
                    tokens_in=child.tokens_in,
                    tokens_out=child.tokens_out,
                    cost=child.cost,
                    instruction=d.instruction,
                    **fields,
                )
            )
        return out

    async def _children(self, t: Ticket, shown: Shown) -> tuple[list[Draft], list[tuple[int, int]]]:
        """One operator call per child, all at once (plus gate resamples); a failed call fails its child.

        Returns the drafts and (island, cell) of each one's first parent.
        """
        # Every child finishes before a bug in one is raised, so none is left running.
        results = (
            [await self._child(t, shown, 0)]
            if t.size == 1  # (a task and a gather less per proposal)
            else await asyncio.gather(
                *(self._child(t, shown, j) for j in range(t.size)), return_exceptions=True
            )
        )
        drafts, firsts = [], []
        for j, result in enumerate(results):
            if isinstance(result, BaseException):
                raise result
            drafts += result
            firsts += [(t.island, shown.first_cells[j])] * len(result)
        return drafts, firsts

    async def _child(self, t: Ticket, shown: Shown, j: int) -> list[Draft]:
        arm = self.arms[t.arm]
        parents = shown.parents[j]
        ids = [int(p.id) for p in parents]
        rng = _LazyGenerator([t.genome_seed, j])
        instruction = self.meta.pick(rng) if self.meta is not None else None
        drafts: list[Draft] = []
        extra: list[int] = []  # calls an operator reserved beyond its first (debug rounds)

        def reserve_call() -> bool:
            ok = self.spending.try_reserve_call()
            extra.extend([1] * ok)
            return ok

        for attempt in range(1 + (self.gate.resample if self.gate is not None else 0)):
            bench = TrialBench(self.evaluator, self.spending, f"{arm.operator.name}>trial")
            context = PromptContext(
                task=self.task.description,
                language=self.genome.language,
                island=t.island,
                sample_index=sample_index(t.seq * self.batch_size + j, attempt),
                rng=rng,
                model=arm.model,
                instruction=instruction.text if instruction else None,
                reserve_call=reserve_call,
                workbench=bench,
                memory=shown.memory,
            )
            failed = False
            try:
                answers = await arm.operator(parents, shown.inspirations[j], context)
            except LLMError as err:  # this child fails; a client that is down stops the run
                answers, failed = [Child.unanswered(arm.operator.name, str(err))], True
            shown_id = instruction.id if instruction else None
            drafts += [Draft(c, ids, shown_id, trial=fields) for c, fields in bench.tried]
            drafts += [Draft(c, ids, shown_id, resample=attempt > 0) for c in answers]
            if (
                failed
                or not await self._gate(drafts[-len(answers) :], parents, shown.elites)
                or not self.spending.try_reserve_call()
            ):
                break
        drafts[-1].extra_calls += len(extra)
        return drafts

    async def _gate(self, drafts: list[Draft], parents: list[Parent], elites: list[Candidate]) -> bool:
        """Marks drafts too close to the island's elites or their parents; True if any was."""
        usable = [d for d in drafts if d.usable]
        if self.gate is None or not usable:
            return False
        verdicts = await self.gate.check(
            [d.child.text for d in usable],
            [[p.text for p in parents]] * len(usable),
            [e.text for e in elites],
        )
        for d, v in zip(usable, verdicts):
            if v.rejected:
                d.rejection = rejected(v, [p.id for p in parents], [e.id for e in elites])
        return any(v.rejected for v in verdicts)
