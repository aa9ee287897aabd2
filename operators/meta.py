"""Meta-prompt evolution: mutation instructions that co-evolve with the programs.

Each LLM proposal is steered by one instruction from a small pool (shown to the
model through ``PromptContext.instruction``), and the instruction is credited
with the archive improvement of the children it produced. Every
``evolve_every`` picks, an LLM rewrites a good instruction into a new one
(Promptbreeder, Fernando et al. 2023; CodeEvolve); with ``hyper``, every
``hyper_every`` evolutions it first rewrites the mutation prompt that does that
rewriting (Promptbreeder's hyper-mutation). The pool keeps at most ``size``.

Instructions are candidates in the store like programs: ``kind="instruction"``,
operator ``seed`` (the starting pool), ``meta`` (evolved), ``seed>hyper`` (the
starting mutation prompt) or ``meta>hyper`` (an evolved one), with lineage,
prompt, response and cost. An unusable answer is a row with ``text=None``,
``valid=False`` and the reason in ``error``: it cost tokens, so it is recorded,
and the pool moves on. The numbers that change at every pick (uses, credit)
are in ``state_dict`` for the checkpoint; the texts are read back from the store.

Fitness of an instruction is its *mean* credit per use: ``credit`` sums the
improvements of its children and ``uses`` counts its picks. A sum would grow
with use alone, so an old, mediocre instruction would outrank a young, good one
and exploitation would feed on itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

from genomes.answers import MalformedAnswer
from operators.instruction_checks import checked_settings, parse_instruction
from qd.contract import Candidate, CandidateLog, ChatClient, ConfigError

SEED, META, HYPER_SEED, HYPER = "seed", "meta", "seed>hyper", "meta>hyper"  # store ``operator`` values
DEFAULT_SEEDS = (
    "Make one small, targeted change to the part of the program that limits its score most.",
    "Simplify the code: remove redundant steps and prefer fewer magic constants.",
    "Replace the core approach with a different algorithm or formula.",
    "Tune the numeric constants and parameters.",
    "Fix what the evaluator feedback reports first, then handle edge cases.",
    "Make the computation more numerically stable and robust.",
)
DEFAULT_MUTATION_PROMPT = (
    "Improve this instruction: make it more specific and more likely to raise the score."
)

_TASK_CHARS = 600  # the task as shown to the instruction writer


@dataclasses.dataclass
class Instruction:
    """One instruction (or mutation prompt) in the pool and what its children earned."""

    id: int  # store id
    text: str  # one line
    parent_id: int | None
    uses: int = 0  # picks: one per proposal it steered
    credit: float = 0.0  # sum of the archive improvements of those proposals' children

    @property
    def mean(self) -> float:
        """Fitness: credit per use (0 before the first use)."""
        return self.credit / self.uses if self.uses else 0.0


def selection_probabilities(members: Sequence[Instruction], explore: float, temperature: float) -> np.ndarray:
    """f64[M]: the selection probability of each member (see ``InstructionPool``'s docstring)."""
    mean = np.array([m.mean for m in members])
    uses = np.array([m.uses for m in members], np.float64)
    scale = np.abs(mean).max()
    score = mean / scale if scale > 0 else np.zeros_like(mean)
    score += explore * np.sqrt(np.log1p(uses.sum()) / (1.0 + uses))
    z = score / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


class InstructionPool:
    """A population of mutation instructions, picked per proposal and evolved by an LLM.

    ``pick`` samples from a softmax (``temperature``) over each member's score:
    ``mean / max|mean| + explore * sqrt(ln(1 + total uses) / (1 + uses))``.
    Dividing by the largest mean makes the temperature independent of the task's
    fitness scale; the UCB-style bonus gets newborns tried soon. When the pool is
    over ``size``, the member dropped is the worst mean among those with at least
    ``min_uses`` (the oldest on ties; the inexperienced only if none has enough),
    never the newborn.
    """

    def __init__(
        self,
        log: CandidateLog,  # the run's store: the pool's texts and lineage live there
        *,
        seeds: Sequence[str] = DEFAULT_SEEDS,
        mutation_prompt: str = DEFAULT_MUTATION_PROMPT,
        size: int = 12,
        evolve_every: int = 25,
        min_uses: int = 5,
        temperature: float = 0.25,
        explore: float = 0.5,
        hyper: bool = False,
        hyper_every: int = 4,
        task: str = "",
        max_chars: int = 200,
        llm_temperature: float | None = None,
        max_tokens: int = 96,
        templates: dict[str, str] | None = None,
        noun: str = "program",
    ):
        """Checks every setting and template here (:meth:`check_settings`), not at the first call."""
        seeds, mutation_prompt, self.templates = checked_settings(
            seeds=seeds,
            mutation_prompt=mutation_prompt,
            size=size,
            evolve_every=evolve_every,
            min_uses=min_uses,
            temperature=temperature,
            explore=explore,
            hyper_every=hyper_every,
            max_chars=max_chars,
            max_tokens=max_tokens,
            templates=templates,
        )
        self.log = log
        self.size, self.evolve_every, self.min_uses = size, evolve_every, min_uses
        self.temperature, self.explore = temperature, explore
        self.hyper, self.hyper_every = hyper, hyper_every
        self.task = textwrap.shorten(task, _TASK_CHARS, placeholder=" ...") if task.strip() else ""
        self.noun = noun  # what the genomes are called in its prompts (``genomes.GenomeKind.noun``)
        self.max_chars, self.llm_temperature, self.max_tokens = max_chars, llm_temperature, max_tokens
        self._seeds, self._mutation_seed = seeds, mutation_prompt
        self.members: list[Instruction] = []  # in id order; empty until the first pick or evolve
        self.mutation: Instruction | None = None  # the current mutation prompt
        self.since_evolve = 0  # picks since the last evolve
        self.evolutions = 0
        self.failures = 0  # unusable answers (each is a store row with the reason)

    @classmethod
    def check_settings(cls, **settings: Any) -> None:
        """Checks the pool's settings (the constructor's keywords, its defaults for the rest)
        without building a pool.

        Raises:
            ConfigError: ``<field>: ...`` for a bad setting, seed or mutation prompt
                (each must be one line of at most ``max_chars``, seeds distinct),
                or a bad template (see ``operators.llm.load_templates``); a builder
                puts the field under ``meta``.
        """
        try:
            bound = _POOL_SETTINGS.bind(None, None, **settings)
        except TypeError as e:
            raise ConfigError(next(iter(settings), "meta"), f"unknown setting ({e})") from None
        bound.apply_defaults()
        a = bound.arguments
        checked_settings(**{k: a[k] for k in inspect.signature(checked_settings).parameters})

    def pick(self, rng: np.random.Generator) -> Instruction:
        """The instruction for one proposal, counted as a use (deterministic for ``rng``)."""
        members = self._seeded()
        p = selection_probabilities(members, self.explore, self.temperature)
        chosen = members[int(rng.choice(len(members), p=p))]
        chosen.uses += 1
        self.since_evolve += 1
        return chosen

    def credit(self, instruction_id: int, improvement: float) -> None:
        """Adds a child's archive improvement to the instruction that steered it.

        Uses are counted by ``pick``, so children that improved nothing need no
        call. An id no longer in the pool (dropped while its children were in
        flight) is ignored.

        Raises:
            ValueError: a non-finite improvement (it would poison the mean).
        """
        if not math.isfinite(improvement):
            raise ValueError(f"improvement: must be finite, got {improvement}")
        for m in self.members:
            if m.id == instruction_id:
                m.credit += float(improvement)
                return

    def due(self) -> bool:
        """True once ``evolve_every`` picks have been made since the last evolve."""
        return self.since_evolve >= self.evolve_every

    async def evolve(
        self, client: ChatClient, rng: np.random.Generator, sample_index: int, model: str | None = None
    ) -> Instruction | None:
        """Asks the LLM to rewrite a good instruction; the child joins the pool (which is then capped).

        The parent is sampled like ``pick`` without the exploration bonus; ``model``
        None picks one with ``client.pick_model(rng)``. Every ``hyper_every``-th call
        with ``hyper`` first rewrites the mutation prompt (a second LLM call, same
        ``sample_index``, different messages). Returns None when the answer was
        unusable (recorded in the store and in ``failures``).

        Raises:
            LLMError: the model cannot be reached (nothing is added).
        """
        members = self._seeded()
        self.since_evolve = 0  # before awaiting: a concurrent ``due()`` must not start a second one
        self.evolutions += 1
        if model is None:
            model = client.pick_model(rng)
        p = selection_probabilities(members, 0.0, self.temperature)  # no exploration bonus
        parent = members[int(rng.choice(len(members), p=p))]
        assert self.mutation is not None
        if self.hyper and self.evolutions % self.hyper_every == 0:
            messages = self._messages("hyper", mutation=self.mutation.text)
            new = await self._ask(client, messages, model, sample_index, HYPER, self.mutation, [])
            self.mutation = new or self.mutation
        messages = self._messages("mutate", mutation=self.mutation.text, instruction=parent.text)
        child = await self._ask(client, messages, model, sample_index, META, parent, self.members)
        if child is not None:
            self.members.append(child)
            self._cap(child)
        return child

    def state_dict(self) -> dict:
        """The pool's changing numbers, JSON-able; texts and lineage stay in the store."""
        return {
            "members": [{"id": m.id, "uses": m.uses, "credit": m.credit} for m in self.members],
            "mutation_id": None if self.mutation is None else self.mutation.id,
            "since_evolve": self.since_evolve,
            "evolutions": self.evolutions,
            "failures": self.failures,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores the pool saved by ``state_dict``, reading texts and parents from the store.

        Raises:
            KeyError: a saved id is not in the store.
            ValueError: a saved id is not an instruction row.
        """
        ids = [int(m["id"]) for m in state["members"]]
        mutation_id = state["mutation_id"]
        rows = self.log.get(ids + ([] if mutation_id is None else [int(mutation_id)]))
        wrong = [r.id for r in rows if r.kind != "instruction" or r.text is None]
        if wrong:
            raise ValueError(f"state: candidate {wrong[0]} is not a stored instruction")

        def instruction(row: Candidate, uses: int = 0, credit: float = 0.0) -> Instruction:
            return Instruction(row.id, row.text, row.parent_ids[0] if row.parent_ids else None, uses, credit)

        self.members = [
            instruction(r, int(m["uses"]), float(m["credit"])) for r, m in zip(rows, state["members"])
        ]
        self.mutation = None if mutation_id is None else instruction(rows[-1])
        self.since_evolve = int(state["since_evolve"])
        self.evolutions = int(state["evolutions"])
        self.failures = int(state["failures"])

    def _seeded(self) -> list[Instruction]:
        """The members, after writing the seeds and the mutation prompt to the store at first use."""
        if self.mutation is None:
            rows = [_row(text, SEED) for text in self._seeds] + [_row(self._mutation_seed, HYPER_SEED)]
            self.log.add(rows)
            self.members = [Instruction(r.id, r.text, None) for r in rows[:-1]]
            self.mutation = Instruction(rows[-1].id, rows[-1].text, None)
        return self.members

    def _cap(self, newborn: Instruction) -> None:
        if len(self.members) > self.size:
            worst = min(
                (m for m in self.members if m is not newborn),
                key=lambda m: (m.uses < self.min_uses, m.mean, m.id),
            )
            self.members.remove(worst)

    def _messages(self, name: str, **fields: str) -> list[dict]:
        return [
            {
                "role": "user",
                "content": self.templates[name].substitute(task=self.task, noun=self.noun, **fields).strip(),
            }
        ]

    async def _ask(
        self,
        client: ChatClient,
        messages: list[dict],
        model: str,
        sample_index: int,
        operator: str,
        parent: Instruction,
        others: list[Instruction],
    ) -> Instruction | None:
        """One call; its answer stored as a child of ``parent`` (or as the reason it is unusable)."""
        c = await client.complete(
            messages,
            model=model,
            temperature=self.llm_temperature,
            role="meta",
            max_tokens=self.max_tokens,
            sample_index=sample_index,
        )
        text, error = None, None
        try:
            text = parse_instruction(c.text, self.max_chars, parent.text, {m.id: m.text for m in others})
        except MalformedAnswer as err:
            cut = " (answer cut at max_tokens)" if c.finish_reason == "length" else ""
            error = f"{operator}: {err.reason}{cut}"
            self.failures += 1
        row = _row(
            text,
            operator,
            parent_ids=[parent.id],
            **c.provenance(messages),
            error=error,
        )
        await asyncio.to_thread(self.log.add, [row])
        return None if text is None else Instruction(row.id, text, parent.id)


_POOL_SETTINGS = inspect.signature(InstructionPool.__init__)  # (self, log, *, settings...) as written


def _row(text: str | None, operator: str, **fields) -> Candidate:
    """A store row for an instruction (``Candidate.logged``)."""
    return Candidate.logged("instruction", text, operator, **fields)
