"""The ground floor: what the engine and its plug-ins (``operators/``, ``descriptors/``) share.

Operators and descriptors import only this module and ``qd.archive`` from the
engine, so they never reach into the loop, the store or the LLM client; the
engine imports them. Everything here is plain data, a protocol or a plug-in's base class:

- ``ConfigError``: a bad setting, with a field path (``ConfigError.under``
  prefixes it where a builder knows the plug-in's place in the config);
- ``Candidate``: one evaluated genome as the store keeps it;
- ``Parent``, ``Child``, ``PromptContext``: what an LLM operator reads and returns;
- ``Attempt``, ``RunMemory``: what the run remembers for its LLM operators (the children
  already tried from a parent with their fates, and the run's lessons note);
- ``Trial``, ``Workbench``: an agent operator's trial of a draft on the first evaluation stage;
- ``ChatClient``, ``Completion`` and the ``LLMError`` family: what a plug-in may
  ask of the run's model client and what it gets back;
- ``Item``, ``Described``, ``Descriptor``: what a descriptor reads, returns and is;
- ``Operator``, ``TextOperator``: the operator shapes the proposers call;
- ``Evaluator``: what the engine asks of an evaluator besides calling it;
- ``Cache``, ``Judgments``, ``CandidateLog`` and their bundle ``Ports``: the
  narrow views of the run's store a plug-in may keep (``qd.store.Store.ports``).

Optional plug-in members (``Descriptor.calls_per_item``, ``cell_spec``,
``attach``; ``Operator.num_inspirations``; ``Evaluator.model_calls``) get their
defaults from the base classes here, which every plug-in subclasses: the engine
reads them as plain attributes and never probes for them.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np


class ConfigError(ValueError):
    """A bad config field: ``field`` is the dotted key, ``fix`` says what to do."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}" + (f" ({fix})" if fix else ""))

    def under(self, prefix: str) -> ConfigError:
        """The same error with its field placed under ``prefix`` (a builder knows where
        a plug-in's settings live: ``descriptor.parts[1]`` + ``bins``)."""
        return ConfigError(f"{prefix}.{self.field}" if prefix else self.field, self.problem, self.fix)


class LLMError(Exception):
    """A call that did not succeed; the message is one line with the cause and the fix."""


class CallFailed(LLMError):
    """This call failed (retries spent, or a request the server rejects, e.g. HTTP 400):
    only its child fails; the run goes on."""


class LLMDown(LLMError):
    """No call can succeed: the server refuses the key or the model (401/403/404), or
    no call has succeeded for ``give_up_after_s``. The client stays down, and the run stops."""


@dataclasses.dataclass
class Completion:
    """One answer. ``seconds`` is the wall time of the whole call, retries included.

    ``top_logprobs`` (only when asked for with ``logprobs=True``): one dict per
    generated token, mapping each top alternative token to its logprob; None when
    not asked for or when the server sent none (callers fall back to ``text``).
    """

    text: str
    model: str
    tokens_in: int
    tokens_out: int
    cost: float
    cached: bool
    finish_reason: str | None
    seconds: float
    top_logprobs: list[dict[str, float]] | None = None
    reasoning_tokens: int = 0  # of ``tokens_out``, those a reasoning model spent thinking

    def provenance(self, messages: list[dict]) -> dict[str, Any]:
        """What a stored row keeps of the call that made it (``Candidate`` fields): model, the
        messages sent as JSON, the answer, tokens and cost."""
        return dict(
            model=self.model,
            prompt=json.dumps(messages, ensure_ascii=False),
            response=self.text,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            cost=self.cost,
        )


@dataclasses.dataclass
class Candidate:
    """One evaluated candidate. ``vector`` (f32[n]) for numeric genomes, else ``text``."""

    kind: str
    island: int
    fitness: float
    descriptor: np.ndarray
    valid: bool
    text: str | None = None
    vector: np.ndarray | None = None
    parent_ids: Sequence[int] = ()
    operator: str | None = None
    model: str | None = None
    prompt: str | None = None
    response: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    metrics: dict | None = None
    error: str | None = None
    eval_seconds: float | None = None
    artifacts: dict | None = None  # evaluator feedback (output tails, task artifacts)
    id: int | None = None
    created: float | None = None
    genome: str | None = (
        None  # the genome kind (``genomes``): program, agent, prompt, ...; vector; instruction
    )
    trace: list[dict] | None = None  # model calls its evaluation made (written to the store's trace table)
    instruction: int | None = None  # store id of the meta instruction its prompt showed (``operators.meta``)

    @classmethod
    def logged(cls, kind: str, text: str | None, operator: str, **fields: Any) -> Candidate:
        """A row a plug-in logs beside the genomes (a meta instruction, a lessons note), so its
        prompt, answer and cost are kept like a child's: no fitness or descriptor, island 0,
        valid when it has text."""
        return cls(kind, 0, None, None, text is not None, text=text, operator=operator, genome=kind, **fields)


@dataclasses.dataclass
class Parent:
    """A program shown to the model, with what its evaluation said."""

    id: int
    text: str
    fitness: float | None
    metrics: dict | None = None
    feedback: str | None = None  # evaluator feedback: error reason, stderr tail, artifacts


@dataclasses.dataclass
class Child:
    """One answer turned into a candidate; ``text`` is None when unusable (``error`` says why)."""

    text: str | None
    error: str | None
    operator: str  # "rewrite", "diff", "crossover", "inspiration" or "diff>rewrite" (the fallback)
    model: str | None
    prompt: str | None  # JSON of the messages sent
    response: str | None
    tokens_in: int
    tokens_out: int
    cost: float

    @classmethod
    def unanswered(cls, operator: str, error: str) -> Child:
        """A child whose call failed (``error`` is the client's one-line reason): stored, never evaluated."""
        return cls(None, error, operator, None, None, None, 0, 0, 0.0)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A child made from a parent earlier in the run, and what became of it.

    Run memory shows these to the model so a mutation that failed is not proposed
    again (GEPA's "doesn't remember rejected proposals"). ``fate`` is one of
    ``failed`` (no usable answer, or its evaluation failed: ``reason`` says why),
    ``rejected`` (the novelty gate turned it away), ``duplicate`` (an exact copy of an
    evaluated text), ``worse`` (evaluated, entered no cell), ``kept`` (entered the
    archive) or ``trial`` (an agent's draft run on the first evaluation stage only, never
    placed: its score, or its error in ``reason``).
    """

    id: int
    operator: str
    fate: str
    fitness: float  # NaN where it never scored
    parent_fitness: float | None
    reason: str | None = None
    text: str | None = None  # the child's genome; clip before showing


class RunMemory(Protocol):
    """What an LLM operator may read of the run's past (``PromptContext.memory``), never the store.

    It answers from what was committed when the proposal started, so a replay from the
    cache shows the same block in the same prompt.
    """

    def children(self, parent_id: int, limit: int) -> list[Attempt]:
        """The ``limit`` most recent children of ``parent_id``, newest first."""
        ...

    def lessons(self) -> str | None:
        """The run's latest lessons note (a ``meta``-role call's summary), or None."""
        ...


@dataclasses.dataclass
class PromptContext:
    """What the operator needs besides the programs."""

    task: str  # shown to the model; must not leak hidden targets
    language: str = "python"
    island: int = 0
    sample_index: int = 0  # unique per child in the run: the client's cache key and seed
    rng: np.random.Generator | None = None  # model choice; None: the client's default
    model: str | None = None  # the scheduler's choice; overrides ``rng``
    instruction: str | None = None  # a mutation instruction (``operators.meta``) shown in the prompt
    # Reserves one more model call against the run's budget (False: none left); an operator
    # asks before each call beyond its first (debug rounds). None: no extra calls.
    reserve_call: Callable[[], bool] | None = None
    memory: RunMemory | None = None  # the run's memory (``qd.memory``); None: shown nothing
    workbench: Workbench | None = None  # runs drafts on the first stage (``agent``'s trials); None: none


def sample_index(child: int, attempt: int = 0, stream: int = 0) -> int:
    """A run-unique index per LLM call (the client's cache key and sampling seed):
    ``child`` for a child's first answer; gate resamples and instruction mutations
    get their own ranges above 2**32. Every part that calls the model draws from this
    one numbering, so no two calls of a run share a cache key."""
    return child if attempt == 0 and stream == 0 else ((stream * 1024 + attempt) << 32) | child


class ChatClient(Protocol):
    """What a plug-in may ask of the run's model client (``qd.llm.LLMClient`` is one)."""

    def pick_model(self, rng: np.random.Generator) -> str: ...

    async def complete(
        self,
        messages: list[dict],
        *,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        sample_index: int = 0,
        stop: list[str] | None = None,
        role: str = "operator",
    ) -> Completion: ...


@dataclasses.dataclass(frozen=True)
class Item:
    """What a descriptor sees of one evaluated candidate.

    Attributes:
        text: the genome (program, prompt).
        fitness: the evaluator's fitness.
        metrics: the evaluator's metrics, or None.
        id: the store id once stored (None while a fresh child is described).
    """

    text: str
    fitness: float = float("nan")
    metrics: dict | None = None
    id: int | None = None


class Described(NamedTuple):
    """A batch's descriptors.

    Attributes:
        values: f32[B, D]; NaN rows where the candidate is invalid or the
            descriptor is not fitted yet.
        valid: bool[B]; False makes the candidate invalid (stored with ``error``);
            True with NaN values means "valid but not placeable yet" (unfitted).
        error: B one-line reasons (None where valid).
    """

    values: np.ndarray
    valid: np.ndarray
    error: list[str | None]


class Cache(Protocol):
    """Derived values by kind and key, kept across resumes (embeddings, judge answers)."""

    def get(self, kind: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of ``kind`` cached for the keys present."""
        ...

    def put(self, kind: str, values: dict[str, bytes]) -> None: ...


class Judgments(Protocol):
    """Similarity judgments (anchor, first, second, closer) by candidate id: what a learned
    descriptor trains on; ``closer`` is 0 if the anchor is closer to ``first``, 1 if to ``second``."""

    def read(self) -> np.ndarray:
        """i64[N, 4]: every judgment, oldest first."""
        ...

    def add(self, rows: Sequence[tuple[int, int, int, int]], source: str) -> None: ...

    def count(self) -> int: ...


class CandidateLog(Protocol):
    """The run's candidates by id (a plug-in that keeps its own rows there: meta instructions)."""

    def get(self, ids: Iterable[int]) -> list[Candidate]:
        """Candidates by id, in the order asked (a missing id raises KeyError)."""
        ...

    def add(self, candidates: Sequence[Candidate]) -> list[int]:
        """Commits a batch in one transaction; sets and returns their ids."""
        ...


@dataclasses.dataclass(frozen=True)
class Ports:
    """The store's ports a describer may keep (``Descriptor.attach``)."""

    cache: Cache
    judgments: Judgments
    log: CandidateLog


class Descriptor(abc.ABC):
    """Turns evaluated candidates into archive coordinates (``descriptors/`` implements it).

    Attributes:
        name: what the axes are called in logs, e.g. ``"embedding"``.
        dim: D, the number of axes this descriptor contributes.
        lower, upper: (D,) bounds of each axis (the archive's grid bounds).
        calls_per_item: LLM calls ``describe`` may make per new item, which the
            LLM budget reserves for each child in flight (default 0).
        extra: the optional dependency (an extra of ``pyproject.toml``) its work
            imports, which the plan checks is installed; None (the default): the core.
    """

    name: str
    dim: int
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    calls_per_item: int = 0
    extra: str | None = None

    @abc.abstractmethod
    async def describe(self, items: Sequence[Item]) -> Described:
        """Descriptors for a batch; must not raise for a bad candidate (mark it invalid)."""

    def attach(self, ports: Ports | None, llm: ChatClient | None = None) -> None:
        """Takes the run's store ports (None: nothing cached) and model client before the run
        starts; a descriptor that caches nothing and asks no model needs neither."""

    def cell_spec(self) -> Any:
        """Its own tessellation (e.g. CVT centroids fitted in embedding space), or None: the
        archive's configured one."""
        return None

    @property
    def axis_names(self) -> tuple[str, ...]:
        """A name per axis, saved with the run (``archive.json``) for ``qd plot``, ``qd explore``
        and ``qd show`` to label the axes with; ``name0``, ``name1``, ... unless a kind that
        measures something nameable (a code metric, a judged quality) says what."""
        return tuple(f"{self.name}{j}" for j in range(self.dim))


class Evaluator(abc.ABC):
    """Scores a batch of genomes: ``await evaluator(genomes) -> qd.task.Evaluation``.

    Attributes:
        model_calls: model calls one evaluation may make (a child reserves them
            against ``runner.max_llm_calls``; default 0).
        down: None, or why no evaluation can run any more (a Ray cluster that lost
            every node): the engine stops the run with it, as with a dead client.
    """

    model_calls: int = 0
    down: str | None = None

    @abc.abstractmethod
    async def __call__(self, genomes: Any) -> Any: ...

    async def first_stage(self, genomes: Any) -> Any:
        """The cheapest evaluation it offers (an agent's trial, ``Workbench``): a cascade's
        first stage; by default the whole evaluation."""
        return await self(genomes)

    def close(self) -> None:
        """Stops what it started (worker processes, the sandbox); by default nothing."""


class Operator:
    """A variation: what the proposers read off it besides calling it.

    A numeric operator (``operators.NumericOperator``) is called
    ``await op(key, parents f32[B, num_parents, n], context) -> f32[B, n]``; an
    LLM operator is a :class:`TextOperator`.

    Attributes:
        name: its name in events and the store's ``operator`` column.
        num_parents: elites each child is made from.
        num_inspirations: further elites shown beside the parents (default 0).
    """

    name: str
    num_parents: int
    num_inspirations: int = 0


class TextOperator(Operator, abc.ABC):
    """An LLM variation of text genomes: one call per child (the answers, failed ones raise ``LLMError``)."""

    @abc.abstractmethod
    async def __call__(
        self, parents: list[Parent], inspirations: list[Parent], context: PromptContext
    ) -> list[Child]: ...


@dataclasses.dataclass(frozen=True)
class Trial:
    """A draft run on the first evaluation stage: what an agent operator's ``trial`` tool shows.

    ``feedback`` holds the evaluator's error and output tails, as a parent's does.
    """

    valid: bool
    fitness: float  # NaN where it did not score
    metrics: dict | None = None
    feedback: str | None = None


class Workbench(Protocol):
    """Where an agent operator tries a draft before it submits a child (``PromptContext.workbench``).

    The run stores every trial as a candidate of its own (never placed in the archive) and
    counts it against ``runner.max_evaluations``, so a trial is paid for like any evaluation.
    """

    async def trial(self, text: str) -> Trial | None:
        """``text`` run on the first evaluation stage; None when the budgets leave no evaluation."""
        ...
