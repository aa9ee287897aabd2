"""Run memory: the children already tried from each parent, with their fates, and the run's tally.

qd stores every failed child with its reason, but a model that never sees them proposes the
same failed mutation again (GEPA's "doesn't remember rejected proposals"). :class:`ChildMemory`
is fed at each commit with what the commit knows (did the child enter the archive) and keeps,
per parent, a ring of its last ``children`` children as ``qd.contract.Attempt``s; a proposal
reads a :class:`Recalled` copy of its parents' rings taken when it starts, so a proposal shows
what was committed before it started, whatever finished meanwhile, and a replay from the cache
shows the same prompt. Beside the rings it keeps the :class:`Tally` the lessons note
(``qd.lessons``) is written from.

Everything here is rebuilt from the store on resume (:meth:`ChildMemory.rebuild`): a child's
fate follows from its row (its error, the gate's similarity, the reused evaluation), except
"entered the archive", which the commit records in the store's cache (kind :data:`KEPT`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from qd.contract import Attempt, Cache, Candidate, ConfigError
from qd.search.gate import REUSED, SIMILARITY, TRIAL

KEPT = "memory.kept"  # cache kind: ids of children that entered the archive (value b"1")
LESSONS = "lessons"  # the ``kind`` of a lessons note's store row
_REASON_CHARS = 80  # a failure reason as the tally counts it
_MIN_TOKENS = 32  # the smallest block cap that holds a line


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """The ``memory`` config group (``qd.config.MemoryConf``), checked by the plan.

    Attributes:
        children: recent children kept and shown per parent (0: none).
        lessons_every: commits between two lessons notes (0: none).
        max_tokens: cap of the memory block in a prompt, in tokens.
        model: the model that writes the lessons note (None: the run's pick).
    """

    children: int = 0
    lessons_every: int = 0
    max_tokens: int = 300
    model: str | None = None

    @property
    def on(self) -> bool:
        return self.children > 0 or self.lessons_every > 0


def plan_memory(conf: Mapping, text: bool) -> MemorySettings:
    """The ``memory`` group checked (``text``: the task's operators are LLM operators).

    Raises:
        ConfigError: memory on for a numeric task, or a block cap too small to hold a line.
    """
    s = MemorySettings(conf["children"], conf["lessons_every"], conf["max_tokens"], conf.get("model"))
    if s.on and not text:
        raise ConfigError(
            "memory",
            "run memory is shown in LLM prompts; this task's operators are numeric",
            "use memory=none",
        )
    if s.on and s.max_tokens < _MIN_TOKENS:
        raise ConfigError(
            "memory.max_tokens",
            f"must be >= {_MIN_TOKENS} with memory on, got {s.max_tokens}",
            "raise it, or use memory=none",
        )
    return s


def fate(c: Candidate, kept: bool) -> tuple[str, str | None]:
    """A stored child's fate (``qd.contract.Attempt.fate``) and its reason, from its row."""
    if c.text is None:
        return "failed", c.error
    if TRIAL in (c.artifacts or {}):
        return "trial", c.error
    if SIMILARITY in (c.metrics or {}) and not c.valid:
        return "rejected", c.error
    if REUSED in (c.artifacts or {}):
        return "duplicate", f"a copy of #{c.artifacts[REUSED]}"
    if not c.valid:
        return "failed", c.error
    return ("kept" if kept else "worse"), None


def reason_key(reason: str | None) -> str:
    """A failure reason as the tally counts it: one line, clipped."""
    line = " ".join((reason or "no reason given").split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Recalled:
    """A ``qd.contract.RunMemory`` as it was when a proposal started: its parents' rings and
    the lessons note then."""

    attempts: dict[int, tuple[Attempt, ...]]
    note: str | None = None

    def children(self, parent_id: int, limit: int) -> list[Attempt]:
        return list(self.attempts.get(int(parent_id), ())[: max(limit, 0)])

    def lessons(self) -> str | None:
        return self.note


@dataclasses.dataclass
class Tally:
    """What paid in this run: children and archive entries per operator and per meta
    instruction, and the failure reasons with their counts."""

    operators: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # name -> [uses, kept]
    instructions: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # id -> [uses, kept]
    failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, c: Candidate, fate_: str, reason: str | None) -> None:
        groups = [(self.operators, c.operator or "-")]
        if c.instruction is not None:
            groups.append((self.instructions, int(c.instruction)))
        for table, key in groups:
            row = table.setdefault(key, [0, 0])
            row[0] += 1
            row[1] += fate_ == "kept"
        if fate_ in ("failed", "rejected"):
            self.failures[reason_key(reason)] += 1

    def common_failures(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` commonest failure reasons, commonest first (first seen first on ties)."""
        return self.failures.most_common(n)


class ChildMemory:
    """Per parent, a ring of its last ``children`` children (newest first) and the run's tally.

    Args:
        cache: the store's cache port: the commit records there which children entered the archive.
        children: ring size per parent (0: no rings, the tally only).
    """

    def __init__(self, cache: Cache, children: int):
        self.cache, self.size = cache, children
        self.rings: dict[int, collections.deque[Attempt]] = {}
        self.fitness: dict[int, float] = {}  # every committed text candidate's, for its children's lines
        self.tally = Tally()
        self.note: str | None = None  # the latest lessons note
        self.noted_at = 0  # commits when it was written

    def recall(self, parent_ids: Iterable[int]) -> Recalled:
        """The rings of ``parent_ids`` and the note as they are now (copied: later commits
        do not change them)."""
        rings = {int(i): tuple(self.rings[int(i)]) for i in parent_ids if int(i) in self.rings}
        return Recalled(rings, self.note)

    def committed(self, candidates: Sequence[Candidate], status: np.ndarray) -> None:
        """Remembers a commit's candidates (stored: they have ids); ``status`` is the insert's
        (``qd.archive.InsertResult.status``: > 0 entered the archive)."""
        kept = np.asarray(status)[: len(candidates)] > 0
        ids = [c.id for c, k in zip(candidates, kept) if k and c.id is not None]
        if ids:
            self.cache.put(KEPT, {str(i): b"1" for i in ids})
        for c, k in zip(candidates, kept):
            self._remember(c, bool(k))

    def noted(self, note: str | None, batches: int) -> None:
        """A lessons note was written at ``batches`` commits (None: its answer was unusable)."""
        self.note, self.noted_at = note if note is not None else self.note, batches

    def rebuild(self, rows: Iterable[Candidate], kind: str) -> None:
        """Reads the store's rows in id order: the ``kind`` candidates (the task's) into the
        rings and tally, the lessons rows into the note."""
        pending: list[Candidate] = []
        for c in rows:
            if c.kind == LESSONS:
                self.noted(c.text, int((c.metrics or {}).get("batches", 0)))
            elif c.kind == kind:
                pending.append(c)
            if len(pending) >= 1000:
                self._replay(pending)
                pending = []
        self._replay(pending)

    def _replay(self, rows: list[Candidate]) -> None:
        kept = self.cache.get(KEPT, [str(c.id) for c in rows])
        for c in rows:
            self._remember(c, str(c.id) in kept)

    def _remember(self, c: Candidate, kept: bool) -> None:
        fitness = math.nan if c.fitness is None else float(c.fitness)
        if c.id is not None:
            self.fitness[int(c.id)] = fitness
        if not c.parent_ids:
            return  # a founder: no parent to remember it by
        fate_, reason = fate(c, kept)
        self.tally.add(c, fate_, reason)
        if self.size <= 0:
            return
        parent = int(c.parent_ids[0])
        attempt = Attempt(
            int(c.id), c.operator or "-", fate_, fitness, self.fitness.get(parent), reason, c.text
        )
        self.rings.setdefault(parent, collections.deque(maxlen=self.size)).appendleft(attempt)
