"""The run's SQLite file: its schema and the one connection every table of it shares.

The store (``qd.store``) and its side tables (``qd.side_tables``) each own some
tables of ``store.sqlite``, but they share one connection, so one transaction can
write a batch of candidates together with the LLM calls that made them. The
engine's threads (commits, describer caches, judges) all use it, so every
statement runs under one lock: sqlite3's connection-level transaction state is
not thread-safe.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    kind TEXT NOT NULL,
    text TEXT,
    vector BLOB,
    parent_ids TEXT NOT NULL,
    island INTEGER NOT NULL,
    operator TEXT,
    model TEXT,
    prompt TEXT,
    response TEXT,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    fitness REAL,
    descriptor BLOB,
    valid INTEGER NOT NULL,
    metrics TEXT,
    error TEXT,
    eval_seconds REAL,
    artifacts TEXT,
    genome TEXT,
    instruction INTEGER
);
CREATE TABLE IF NOT EXISTS migrations (
    seq INTEGER PRIMARY KEY,
    after_id INTEGER NOT NULL,
    genome_id INTEGER NOT NULL,
    island INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cache (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS llm_calls (
    seq INTEGER PRIMARY KEY,
    after_id INTEGER NOT NULL,
    role TEXT NOT NULL,
    model TEXT NOT NULL,
    calls INTEGER NOT NULL,
    cached INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    retries INTEGER NOT NULL,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    cost REAL NOT NULL,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS trace (
    candidate INTEGER NOT NULL,
    n INTEGER NOT NULL,
    call TEXT NOT NULL,
    PRIMARY KEY (candidate, n)
);
CREATE TABLE IF NOT EXISTS judgments (
    seq INTEGER PRIMARY KEY,
    created REAL NOT NULL,
    anchor INTEGER NOT NULL,
    first INTEGER NOT NULL,
    second INTEGER NOT NULL,
    closer INTEGER NOT NULL,
    source TEXT NOT NULL
);
"""
# Candidate columns added after the first stores were written: opening one for writing adds them.
_LATER_COLUMNS = (
    ("candidates", "genome", "TEXT"),
    ("candidates", "instruction", "INTEGER"),
    ("llm_calls", "reasoning_tokens", "INTEGER NOT NULL DEFAULT 0"),
)


class Database:
    """One connection to ``path`` (created with the schema if missing, unless ``readonly``)."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"store: no store at {self.path}")
            uri = f"file:{self.path}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
            return
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        for table, column, sql_type in _LATER_COLUMNS:
            if column not in self.columns(table):
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        self._db.commit()

    def columns(self, table: str = "candidates") -> set[str]:
        """A table's columns (a read-only store from before some has fewer)."""
        return {row[1] for row in self.rows(f"PRAGMA table_info({table})")}

    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def cursor(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        """A statement's cursor, for scans read a page at a time (each page under the lock:
        :meth:`fetch`)."""
        with self._lock:
            return self._db.execute(sql, params)

    def fetch(self, cursor: sqlite3.Cursor, page: int) -> list[tuple]:
        with self._lock:
            return cursor.fetchmany(page)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection, in one transaction (committed on exit, rolled back on an error)."""
        with self._lock, self._db:
            yield self._db

    def close(self) -> None:
        with self._lock:
            self._db.close()
