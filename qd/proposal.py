"""What a proposal returns, and how text proposals are made.

A proposal applies one arm (operator, model) to parents drawn from one island.
For text tasks each child is one LLM call: the parents (and inspirations) are
drawn by the selection rule, the prompt shows a meta instruction when
meta-prompt evolution is on, and the answer passes the novelty gate (asked
again up to ``gate.resample`` times when rejected). Exact duplicates of
evaluated texts copy the stored evaluation; the rest go to the sandbox, then to
the describer. :class:`TextProposals` is the part of ``qd.loop.Engine`` that
does this (a mixin: it uses the engine's archive state, genome table, arms,
strategy and budgets).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import jax
import numpy as np

from operators.llm import Child, Parent, PromptContext
from qd.search import select
from qd.search.gate import rejected, reuse
from qd.llm import Ledger, LLMError
from qd.store import Candidate


def sample_index(child: int, attempt: int = 0, stream: int = 0) -> int:
    """A run-unique index per LLM call (the client's cache key and sampling seed):
    ``child`` for a child's first answer; gate resamples and instruction mutations
    get their own ranges above 2**32."""
    return child if attempt == 0 and stream == 0 else ((stream * 1024 + attempt) << 32) | child


@dataclasses.dataclass
class Draft:
    """An operator's child before evaluation, and where it came from."""

    child: Any  # operators.llm.Child (failed calls too: Child.unanswered), or a Seed
    parent_ids: list[int]
    instruction: int | None = None  # meta instruction shown in its prompt
    rejection: dict[str, Any] | None = None  # the candidate's fields when the novelty gate turned it away
    resample: bool = False  # asked again after a rejection (an extra LLM call)

    @property
    def usable(self) -> bool:
        return self.child.text is not None and self.rejection is None


@dataclasses.dataclass
class Proposal:
    """A finished proposal: its candidates, and what the commit credits.

    ``parents`` is i64[B, 2]: (island, cell) of each candidate's first parent,
    -1 for seeds; ``instructions`` the meta instruction id behind each candidate.
    ``fits`` is the describer fit count it was described under (None if unfitted).
    """

    candidates: list[Candidate]
    fits: int | None
    arm: int | None  # None for seed proposals (no arm was pulled)
    parents: np.ndarray
    instructions: list[int | None]
    resamples: int = 0  # gate resamples among the candidates (reserved LLM calls)
    calls: Ledger = dataclasses.field(default_factory=Ledger)  # the LLM calls made for it, committed with it


@dataclasses.dataclass(frozen=True)
class Seed:
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


def as_parent(candidate: Candidate) -> Any:
    """An elite as an LLM operator shows it: code, score, metrics and evaluator feedback."""
    notes = [f"error: {candidate.error}"] if candidate.error else []
    for name, value in (candidate.artifacts or {}).items():
        notes.append(f"{name}:\n{value}")
    return Parent(candidate.id, candidate.text, candidate.fitness, candidate.metrics, "\n".join(notes) or None)


class TextProposals:
    """Text children of one proposal, mixed into ``qd.loop.Engine``.

    Reads the engine's ``task``, ``state``, ``_genomes``, ``arms``, ``strategy``,
    ``meta``, ``gate``, ``store``, ``_duplicates``, ``evaluator``, ``describer``
    and budgets (``_llm_calls_left``, ``_uncommitted``); a resample reserves
    its call in ``_extra_calls`` until the commit.
    """

    async def _propose_text(
        self, arm: int, island: int, size: int, seq: int, seeding: bool, seed: int,
        parent_key: jax.Array, inspire_key: jax.Array,
    ) -> Proposal:
        """LLM children of selected elites (or the task's seeds on an empty island),
        gated, deduplicated, evaluated and described."""
        if seeding:
            texts = self.task.initial(np.random.default_rng(seed), size)
            drafts = [Draft(Seed(text), []) for text in texts]
            parents = np.full((len(drafts), 2), -1, np.int64)
        else:
            drafts, parents = await self._llm_children(arm, island, size, seq, seed, parent_key, inspire_key)
        dup = self._duplicates.lookup([d.child.text if d.usable else None for d in drafts])
        originals = dict(zip(dup.stored, self.store.get(dup.stored.values())))
        todo = [j for j, d in enumerate(drafts) if d.usable and j not in dup]
        ev = await self.evaluator([drafts[j].child.text for j in todo]) if todo else None
        at = {j: k for k, j in enumerate(todo)}
        out = []
        for j, d in enumerate(drafts):
            child, k = d.child, at.get(j)
            if d.rejection is not None:
                fields = d.rejection
            elif j in originals:  # an exact duplicate: the stored evaluation, not a new one
                fields = reuse(originals[j])
            elif j in dup.earlier:
                fields = reuse(out[dup.earlier[j]])
            elif k is not None:
                fields = dict(
                    fitness=float(ev.fitness[k]), descriptor=ev.descriptor[k], valid=bool(ev.valid[k]),
                    metrics=ev.metrics[k], error=ev.error[k], artifacts=ev.artifacts[k],
                    eval_seconds=ev.seconds[k],
                )
            else:
                fields = dict(fitness=math.nan, descriptor=None, valid=False, error=child.error)
            out.append(Candidate(
                kind="text", island=island, text=child.text, parent_ids=d.parent_ids,
                operator=child.operator, model=child.model, prompt=child.prompt,
                response=child.response, tokens_in=child.tokens_in, tokens_out=child.tokens_out,
                cost=child.cost, **fields,
            ))
        fits = self.counters["fits"]
        if self.describer is not None:
            await self._describe(out)
        return Proposal(out, fits if self._fitted else None, None if seeding else arm, parents,
                         [d.instruction for d in drafts], sum(d.resample for d in drafts))

    async def _llm_children(
        self, arm: int, island: int, size: int, seq: int, seed: int, parent_key: jax.Array,
        inspire_key: jax.Array,
    ) -> tuple[list[Draft], np.ndarray]:
        """One operator call per child, all at once (plus gate resamples); a failed call fails its child.

        Returns the drafts and i64[len, 2] (island, cell) of each one's first parent.
        """
        a, s = self.arms[arm], self.strategy.selection
        op = a.operator
        _, cells = self._parents(parent_key, island, size * op.num_parents)
        cells = cells.reshape(size, op.num_parents)
        if op.num_inspirations:
            source, spot = (np.asarray(x, np.int64) for x in select.inspirations(
                self.state, inspire_key, island, cells[:, 0], op.num_inspirations, s.inspirations))
        elites = self._gate_elites(island)

        async def child(j: int) -> list[Draft]:
            parents = [as_parent(self._genomes[island, c]) for c in cells[j]]
            ids = [int(p.id) for p in parents]  # now: a refit may move them before the answer
            shown = [as_parent(self._genomes[i, c]) for i, c in zip(source[j], spot[j]) if c >= 0] \
                if op.num_inspirations else []
            rng = np.random.default_rng([seed, j])
            instruction = self.meta.pick(rng) if self.meta is not None else None
            drafts: list[Draft] = []
            for attempt in range(1 + self._resamples()):
                context = self.prompt_context(
                    island=island, sample_index=sample_index(seq * self.batch_size + j, attempt),
                    rng=rng, model=a.model, instruction=instruction.text if instruction else None,
                )
                failed = False
                try:
                    answers = await op(parents, shown, context)
                except LLMError as err:  # this child fails; a client that is down stops the run
                    answers, failed = [Child.unanswered(op.name, str(err))], True
                drafts += [Draft(c, ids, instruction.id if instruction else None, resample=attempt > 0)
                           for c in answers]
                if failed or not await self._gate(drafts[-len(answers):], parents, elites) \
                        or not self._may_resample():
                    break
            return drafts

        # Every child finishes before a bug in one is raised, so none is left running.
        results = await asyncio.gather(*(child(j) for j in range(size)), return_exceptions=True)
        drafts, firsts = [], []
        for j, result in enumerate(results):
            if isinstance(result, BaseException):
                raise result
            drafts += result
            firsts += [(island, cells[j, 0])] * len(result)
        return drafts, np.asarray(firsts, np.int64).reshape(-1, 2)

    def _resamples(self) -> int:
        gate = self.gate
        return gate.resample if gate is not None else 0

    def _may_resample(self) -> bool:
        """Reserves one more LLM call for a gate resample if the budgets leave room."""
        if self._should_stop() or self._llm_calls_left(self._uncommitted()) < 1:
            return False
        self._extra_calls += 1
        return True

    def _gate_elites(self, island: int) -> list[Candidate]:
        """The island's elites as the gate compares with them (none if it does not)."""
        gate = self.gate
        if gate is None or "elites" not in gate.against:
            return []
        filled = np.flatnonzero(np.asarray(self.state.genome_id[island]) >= 0)
        return [self._genomes[island, c] for c in filled]

    async def _gate(self, drafts: list[Draft], parents: list[Any], elites: list[Candidate]) -> bool:
        """Marks drafts too close to the island's elites or their parents; True if any was."""
        gate = self.gate
        usable = [d for d in drafts if d.usable]
        if gate is None or not usable:
            return False
        verdicts = await gate.check([d.child.text for d in usable], [[p.text for p in parents]] * len(usable),
                                    [e.text for e in elites])
        for d, v in zip(usable, verdicts):
            if v.rejected:
                d.rejection = rejected(v, [p.id for p in parents], [e.id for e in elites])
        return any(v.rejected for v in verdicts)

    def prompt_context(self, **fields: Any) -> Any:
        """What an LLM operator is told about the task besides its parents."""
        return PromptContext(task=self.task.description, language=self.task.language, **fields)
