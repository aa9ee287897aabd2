"""The ledger of LLM calls: counts by (role, model), and the per-proposal tally.

Apart from the client (``qd.llm.client``) so that what only counts calls (budgets,
the loop, the store's replay) never imports ``openai``, ~0.7 s of a numeric run's start.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Sequence

from qd.contract import Completion

# Who makes calls. "agent": calls made inside an evaluation (an agent's own, or a prompt's
# fixed solver), through ``qd.llm.gateway.ModelGateway``.
ROLES = ("operator", "judge", "meta", "agent", "heldout")  # heldout: a test split scored after a run


@dataclasses.dataclass
class Usage:
    """Counts of one (role, model): answered calls (cache hits included), failures, tokens, cost.

    ``reasoning_tokens`` are the part of ``tokens_out`` a reasoning model spent
    thinking (billed as output, never shown): apart, so a run can see where its
    budget went. Last, so that rows from stores without it read as 0.
    """

    calls: int = 0
    cached: int = 0
    failed: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    reasoning_tokens: int = 0

    def merge(self, other: Usage) -> None:
        self.calls += other.calls
        self.cached += other.cached
        self.failed += other.failed
        self.retries += other.retries
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost += other.cost
        self.reasoning_tokens += other.reasoning_tokens

    def as_dict(self) -> dict[str, int | float]:
        return dict(vars(self))  # (dataclasses.asdict deep-copies: ten times the cost, every commit)


USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Usage))  # the counts of a ledger row, in order

_CURRENT_TALLY: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("qd_llm_tally", default=None)


def current_tally() -> Ledger | None:
    """The ledger of the innermost :func:`tally` (or :func:`counting`) around this context, if any."""
    return _CURRENT_TALLY.get()


@contextlib.contextmanager
def tally() -> Iterator[Ledger]:
    """Also counts, in a fresh ledger, every call made from this context and the tasks it starts.

    The engine wraps each proposal (and each refit or meta mutation) in one, and
    commits that ledger with the proposal's candidates: the calls a run has paid for
    are then exactly those in the store, however the process died.
    """
    ledger = Ledger()
    with counting(ledger):
        yield ledger


@contextlib.contextmanager
def counting(ledger: Ledger | None) -> Iterator[Ledger | None]:
    """Makes ``ledger`` the current tally for this block (None: no tally), in this context only.

    For calls made on a proposal's behalf from somewhere its context does not reach
    (a worker thread, a task started elsewhere): capture :func:`current_tally` where
    the proposal runs, and count each call inside ``with counting(captured):``.
    """
    token = _CURRENT_TALLY.set(ledger)
    try:
        yield ledger
    finally:
        _CURRENT_TALLY.reset(token)


class Ledger:
    """Running totals by (role, model), which the loop reads for budgets and progress.

    ``calls`` counts answered calls (cache hits count, so a replay spends the same
    budget, and an answer with no text after reasoning, which is paid for); ``failed``
    calls that gave up or came back with no text; ``in_flight`` HTTP attempts under way.
    """

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], Usage] = {}
        self.in_flight = 0

    def _cell(self, role: str, model: str) -> Usage:
        return self.cells.setdefault((role, model), Usage())

    def add(self, c: Completion, role: str = "operator") -> None:
        """Count one answered call, cached or not, exactly the same way."""
        u = self._cell(role, c.model)
        u.calls += 1
        u.cached += int(c.cached)
        u.tokens_in += c.tokens_in
        u.tokens_out += c.tokens_out
        u.cost += c.cost
        u.reasoning_tokens += c.reasoning_tokens

    def fail(self, role: str, model: str, spent: Completion | None = None) -> None:
        """Count one failed call. ``spent``: an answer paid for but of no use (all reasoning, no
        text), counted as a call too, with its tokens and cost, so that call, token and cost
        budgets bind on a run of them as on any other answers."""
        u = self._cell(role, model)
        u.failed += 1
        if spent is not None:
            u.calls += 1
            u.tokens_in += spent.tokens_in
            u.tokens_out += spent.tokens_out
            u.cost += spent.cost
            u.reasoning_tokens += spent.reasoning_tokens

    def retry(self, role: str, model: str) -> None:
        self._cell(role, model).retries += 1

    def merge(self, other: Ledger) -> None:
        for key, u in other.cells.items():
            self._cell(*key).merge(u)

    @classmethod
    def merged(cls, ledgers: Iterable[Ledger]) -> Ledger:
        """One ledger of all of ``ledgers``' cells."""
        out = cls()
        for ledger in ledgers:
            out.merge(ledger)
        return out

    def total(self) -> Usage:
        """All cells summed."""
        out = Usage()
        for u in self.cells.values():
            out.merge(u)
        return out

    def split(self, by: str) -> dict[str, Usage]:
        """Cells summed per ``"role"`` or per ``"model"``, sorted by name."""
        at = ("role", "model").index(by)
        groups: dict[str, Usage] = {}
        for key, u in self.cells.items():
            groups.setdefault(key[at], Usage()).merge(u)
        return dict(sorted(groups.items()))

    @property
    def calls(self) -> int:
        return self.total().calls

    @property
    def tokens(self) -> int:
        t = self.total()
        return t.tokens_in + t.tokens_out

    @property
    def cost(self) -> float:
        return self.total().cost

    def as_dict(self) -> dict:
        """Totals, then ``per_role`` and ``per_model`` splits (the summary and events.jsonl)."""
        t = self.total()
        return {
            "calls": t.calls,
            "cached_calls": t.cached,
            "failed_calls": t.failed,
            "retries": t.retries,
            "tokens_in": t.tokens_in,
            "tokens_out": t.tokens_out,
            "reasoning_tokens": t.reasoning_tokens,
            "cost": t.cost,
            "in_flight": self.in_flight,
            "per_role": {k: u.as_dict() for k, u in self.split("role").items()},
            "per_model": {k: u.as_dict() for k, u in self.split("model").items()},
        }

    def rows(self) -> list[tuple]:
        """One row per cell, for the store:
        (role, model, calls, cached, failed, retries, tokens_in, tokens_out, cost, reasoning_tokens)."""
        return [(*key, *dataclasses.astuple(u)) for key, u in self.cells.items()]

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence]) -> Ledger:
        ledger = cls()
        for role, model, *counts in rows:
            ledger._cell(role, model).merge(Usage(*counts))
        return ledger
