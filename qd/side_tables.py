"""The store's side tables: what a run keeps beside its candidates, in the same SQLite file.

Each class owns one table and implements one port: a plug-in is handed the one it
uses (``qd.contract.Cache``, ``qd.contract.Judgments``), never the whole store, and
the engine's budget reads and writes the LLM call ledger through :class:`CallTable`.
They share the store's connection (``qd.database.Database``), so a batch's LLM
calls commit in the same transaction as the candidates they made.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence

import numpy as np

from qd.database import Database


class CacheTable:
    """Derived values (embeddings, judge answers, text hashes) by kind and key, kept across
    resumes so re-describing a stored candidate is cheap (``qd.contract.Cache``)."""

    def __init__(self, db: Database):
        self._db = db

    def get(self, kind: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of ``kind`` cached for the keys present."""
        found: dict[str, bytes] = {}
        keys = list(dict.fromkeys(keys))
        for start in range(0, len(keys), 900):  # SQLite binds at most 999 parameters
            chunk = keys[start : start + 900]
            found.update(
                self._db.rows(
                    f"SELECT key, value FROM cache WHERE kind = ? AND key IN ({', '.join('?' * len(chunk))})",
                    (kind, *chunk),
                )
            )
        return found

    def put(self, kind: str, values: dict[str, bytes]) -> None:
        with self._db.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO cache (kind, key, value) VALUES (?, ?, ?)",
                [(kind, k, v) for k, v in values.items()],
            )


class JudgmentTable:
    """Similarity judgments by candidate id, from a model or from people (``qd judge``):
    what a learned descriptor trains on (``qd.contract.Judgments``)."""

    def __init__(self, db: Database):
        self._db = db

    def read(self) -> np.ndarray:
        """i64[N, 4]: every judgment as (anchor, first, second, closer), oldest first."""
        rows = self._db.rows("SELECT anchor, first, second, closer FROM judgments ORDER BY seq")
        return np.asarray(rows, np.int64).reshape(-1, 4)

    def add(self, rows: Sequence[tuple[int, int, int, int]], source: str) -> None:
        """Records judgments (anchor, first, second, closer); ``closer`` is 0 if the anchor
        is closer to ``first``, 1 if to ``second``."""
        now = time.time()
        with self._db.transaction() as db:
            db.executemany(
                "INSERT INTO judgments (created, anchor, first, second, closer, source) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(now, int(a), int(b), int(c), int(k), source) for a, b, c, k in rows],
            )

    def count(self) -> int:
        return self._db.rows("SELECT COUNT(*) FROM judgments")[0][0]


class CallTable:
    """The LLM call ledger: each row counts calls of one (role, model) made after candidate
    ``after_id``, so what a budget has spent is durable with what it bought."""

    def __init__(self, db: Database):
        self._db = db

    def add(self, calls: Sequence[tuple]) -> None:
        """Records LLM calls made apart from a candidate batch (a refit's judgments, a meta mutation)."""
        with self._db.transaction() as db:
            ((last,),) = db.execute("SELECT COALESCE(MAX(id), -1) FROM candidates").fetchall()
            self.insert(db, last, calls)

    @staticmethod
    def insert(db: sqlite3.Connection, after_id: int, calls: Sequence[tuple]) -> None:
        """Writes ``calls`` (``qd.llm.Ledger.rows()``) inside the caller's transaction."""
        db.executemany(
            "INSERT INTO llm_calls (after_id, role, model, calls, cached, failed, retries, tokens_in, "
            "tokens_out, cost, reasoning_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(int(after_id), *row) for row in calls],
        )

    def totals(self) -> list[tuple]:
        """Every recorded LLM call count as (role, model, calls, cached, failed, retries,
        tokens_in, tokens_out, cost, reasoning_tokens), summed per (role, model):
        ``qd.llm.Ledger.from_rows`` (a read-only store from before reasoning tokens: 0)."""
        reasoning = "reasoning_tokens" if "reasoning_tokens" in self._db.columns("llm_calls") else "0"
        return self._db.rows(
            "SELECT role, model, SUM(calls), SUM(cached), SUM(failed), SUM(retries), SUM(tokens_in), "
            f"SUM(tokens_out), SUM(cost), SUM({reasoning}) FROM llm_calls GROUP BY role, model "
            "ORDER BY role, model"
        )


class MetaTable:
    """Facts about the run as JSON values by key (its loop, what its store keeps)."""

    def __init__(self, db: Database):
        self._db = db

    def get(self, key: str, default: object = None) -> object:
        rows = self._db.rows("SELECT value FROM meta WHERE key = ?", (key,))
        return default if not rows else json.loads(rows[0][0])

    def set(self, key: str, value: object) -> None:
        with self._db.transaction() as db:
            MetaTable.put(db, {key: value})

    @staticmethod
    def put(db: sqlite3.Connection, facts: Mapping[str, object]) -> None:
        """Writes ``facts`` inside the caller's transaction (with the rows they describe)."""
        db.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(key, json.dumps(value)) for key, value in facts.items()],
        )


class TraceTable:
    """The model calls each candidate's evaluation made (an agent's), in order, by candidate id."""

    def __init__(self, db: Database):
        self._db = db

    @staticmethod
    def insert(db: sqlite3.Connection, candidates: Sequence, ids: Sequence[int]) -> None:
        """Writes the ``trace`` of each of ``candidates`` (stored under ``ids``) inside the caller's
        transaction."""
        rows = [
            (i, n, json.dumps(call)) for c, i in zip(candidates, ids) for n, call in enumerate(c.trace or ())
        ]
        if rows:
            db.executemany("INSERT INTO trace (candidate, n, call) VALUES (?, ?, ?)", rows)

    def of(self, candidate_id: int) -> list[dict]:
        """The model calls candidate ``candidate_id``'s evaluation made, in order (each a dict:
        ``n``, ``messages``, ``sampling``, ``text`` or ``error``, ``model``, tokens, ``cached``)."""
        try:
            rows = self._db.rows(
                "SELECT call FROM trace WHERE candidate = ? ORDER BY n", (int(candidate_id),)
            )
        except sqlite3.OperationalError:  # a read-only store from before traces
            return []
        return [json.loads(call) for (call,) in rows]
