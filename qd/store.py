"""The genome store: every candidate, append-only, in SQLite (WAL: one writer, many readers).

The store is the source of truth. A candidate is committed here *before* it is
inserted into the archive, so a crash never loses an evaluated candidate: on
restart, rows newer than the last checkpoint are replayed into the archive.

``Store`` is the candidate log and its placement history (migrations, resets);
what a run keeps beside them lives in side tables over the same connection
(``qd.side_tables``): ``store.cache``, ``store.judgments``, ``store.calls`` and
``store.meta``. Plug-ins get the narrow ports of ``store.ports()``, never the store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from qd.contract import Candidate, Ports
from qd.database import Database
from qd.side_tables import CacheTable, CallTable, JudgmentTable, MetaTable, TraceTable

RESET_ID = -1  # genome_id of a reset marker in the migrations table

_COLUMNS = (
    "created",
    "kind",
    "text",
    "vector",
    "parent_ids",
    "island",
    "operator",
    "model",
    "prompt",
    "response",
    "tokens_in",
    "tokens_out",
    "cost",
    "fitness",
    "descriptor",
    "valid",
    "metrics",
    "error",
    "eval_seconds",
    "artifacts",
    "genome",
    "instruction",
)
# Columns a scan computes from others: the first parent's fitness, found by its id (the primary key),
# so a reader of each child's improvement needs no table of every candidate's fitness.
_DERIVED = {
    "parent_fitness": "(SELECT p.fitness FROM candidates p WHERE p.id = json_extract(candidates.parent_ids, "
    "'$[0]') AND p.kind IN ('text', 'vector'))",
}
# Stores written before genome kinds have no ``genome`` column: their text rows are programs.
_LEGACY_GENOME = {"text": "program"}


def _blob(x: np.ndarray | None) -> bytes | None:
    return None if x is None else np.asarray(x, np.float32).tobytes()


def _ids_json(ids: Sequence[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in ids) + "]"


class Store:
    """Append-only candidate store at ``path`` (created if missing), with its side tables.

    Implements ``qd.contract.CandidateLog`` (``get``, ``add``); ``cache``,
    ``judgments``, ``calls``, ``meta`` and ``traces`` are the side tables, each over the store's
    one connection (``qd.database.Database``).
    """

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self._db = Database(self.path, readonly)
        self.cache = CacheTable(self._db)
        self.judgments = JudgmentTable(self._db)
        self.calls = CallTable(self._db)
        self.meta = MetaTable(self._db)
        self.traces = TraceTable(self._db)
        # (read-only on a store from before genome kinds or instructions: select NULL for a missing column)
        have = self._db.columns()
        self._select = ", ".join(c if c in have else "NULL" for c in _COLUMNS)

    def ports(self) -> Ports:
        """What a describer may use of the store (``Descriptor.attach``)."""
        return Ports(cache=self.cache, judgments=self.judgments, log=self)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(
        self,
        candidates: Sequence[Candidate],
        calls: Sequence[tuple] = (),
        ids: Sequence[int] | None = None,
        facts: Mapping[str, object] | None = None,
    ) -> list[int]:
        """Commits a batch in one transaction; sets and returns their ids (ascending).

        ``calls`` are the LLM calls that made them (``qd.llm.Ledger.rows()``): paid
        calls become durable with what they produced, never before, never apart.
        ``ids``: the rows' own ids, ascending and above the last (a store that keeps
        some candidates under their evaluation numbers: the device loop's elites);
        by default the next ones. ``facts``: ``meta`` keys that must hold exactly when
        these rows do (the host loop's proposal clock, read by a resume that replays them).
        """
        now = time.time()
        rows = [_row(c, now) for c in candidates]
        with self._db.transaction() as db:
            if ids is None:
                start = self._next_id()
                ids = list(range(start, start + len(rows)))
            elif list(ids) != sorted(set(ids)) or (ids and ids[0] < self._next_id()):
                raise ValueError(_EXPLICIT_IDS)
            db.executemany(
                f"INSERT INTO candidates (id, {', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})",
                [(i, *row) for i, row in zip(ids, rows)],
            )
            TraceTable.insert(db, candidates, ids)
            CallTable.insert(db, ids[-1] if ids else self._next_id() - 1, calls)
            MetaTable.put(db, facts or {})
        ids = [int(i) for i in ids]
        for c, i, row in zip(candidates, ids, rows):
            c.id, c.created = i, row[0]
        return ids

    def add_vectors(self, rows: Mapping[str, np.ndarray], operator: str | None) -> None:
        """Commits vector candidates given as columns (``_vector_rows``) in one transaction, without a
        ``Candidate`` per row: the device loop's rows, by the thousand per call."""
        with self._db.transaction() as db:
            db.executemany(_VECTOR_INSERT, _vector_rows(rows, self._next_id(), operator))

    def _next_id(self) -> int:
        ((last,),) = self._db.rows("SELECT COALESCE(MAX(id), -1) FROM candidates")
        return last + 1

    def add_migrations(self, after_id: int, genome_id: Iterable[int], island: Iterable[int]) -> None:
        """Records elites copied between islands, so ``rebuild`` can replay them."""
        with self._db.transaction() as db:
            db.executemany(
                "INSERT INTO migrations (after_id, genome_id, island) VALUES (?, ?, ?)",
                [(int(after_id), int(g), int(i)) for g, i in zip(genome_id, island)],
            )

    def add_reset(self, after_id: int, islands: Iterable[int]) -> None:
        """Records that ``islands`` were emptied after candidate ``after_id`` (rows of the
        ``migrations`` table with genome_id -1), so replays drop what they held before.
        Record a reset before the migrations that reseed those islands."""
        islands = [int(i) for i in islands]
        self.add_migrations(after_id, [RESET_ID] * len(islands), islands)

    def keeps_every_candidate(self) -> bool:
        """False for a device run's elites-only store (``runner.store=elites``)."""
        return self.meta.get("store", "all") != "elites"

    def count(self, valid: bool = False, kind: str | None = None) -> int:
        """Stored candidates (only the valid ones if ``valid``; only this ``kind`` if given)."""
        where = " AND valid = 1" if valid else ""
        sql = f"SELECT COUNT(*) FROM candidates WHERE kind = COALESCE(?, kind){where}"
        return self._db.rows(sql, (kind,))[0][0]

    def common_errors(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` most common errors of the failed candidates, with their counts, commonest first."""
        sql = (
            "SELECT error, COUNT(*) AS n FROM candidates WHERE valid = 0 AND error IS NOT NULL "
            "GROUP BY error ORDER BY n DESC, MIN(id) LIMIT ?"
        )
        return [(error, count) for error, count in self._db.rows(sql, (n,))]

    def last_id(self) -> int:
        return self._next_id() - 1

    def get(self, ids: Iterable[int], missing_ok: bool = False) -> list[Candidate]:
        """Candidates by id, in the order asked (missing ids raise KeyError, or are left out)."""
        ids = [int(i) for i in ids]
        if not ids:
            return []
        found: dict[int, Candidate] = {}
        for start in range(0, len(ids), 900):  # SQLite binds at most 999 parameters
            chunk = ids[start : start + 900]
            rows = self._db.rows(
                f"SELECT id, {self._select} FROM candidates WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            found.update((row[0], _candidate(row)) for row in rows)
        missing = [i for i in ids if i not in found]
        if missing and not missing_ok:
            raise KeyError(f"store: no candidate with id {missing[0]}")
        return [found[i] for i in ids if i in found]

    def marks(self) -> tuple[int | None, int | None]:
        """The newest candidate id and migration seq: they change whenever the store does."""
        return self._db.rows("SELECT (SELECT MAX(id) FROM candidates), (SELECT MAX(seq) FROM migrations)")[0]

    def columns(
        self,
        names: Sequence[str],
        kinds: Sequence[str] = ("text", "vector"),
        page: int = 10_000,
        by_parent: bool = False,
    ) -> Iterator[list[tuple]]:
        """Some columns of every candidate of ``kinds``, ``page`` rows at a time, in id order (or
        by first parent, then id): scans of a large store in bounded memory (no genomes, prompts
        or answers unless asked for; SQLite sorts on disk past its cache). Besides the stored
        columns, ``parent_fitness``: the first parent's fitness (None: a founder, or a parent
        the store does not hold)."""
        unknown = set(names) - {"id", *_COLUMNS, *_DERIVED}
        if unknown:
            raise ValueError(f"store: no column {sorted(unknown)[0]!r}")
        have = self._db.columns() | {"id"}
        select = ", ".join(_DERIVED.get(c, c if c in have else "NULL") for c in names)
        order = "json_extract(parent_ids, '$[0]'), id" if by_parent else "id"
        cursor = self._db.cursor(
            f"SELECT {select} FROM candidates WHERE kind IN ({', '.join('?' * len(kinds))}) ORDER BY {order}",
            list(kinds),
        )
        while rows := self._db.fetch(cursor, page):
            yield rows

    def iter(self, after_id: int = -1, page: int = 1000) -> Iterable[Candidate]:
        """Candidates newer than ``after_id`` in id order, read a page at a time."""
        while rows := self._db.rows(
            f"SELECT id, {self._select} FROM candidates WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, page),
        ):
            yield from map(_candidate, rows)
            after_id = rows[-1][0]

    def placements(
        self, after_id: int = -1, descriptor_dim: int | None = None, objectives: tuple = ()
    ) -> dict[str, np.ndarray]:
        """Every archive offer in history order: stored candidates and recorded migrations.

        History order: candidate ``id`` sits at ``2 * id``; the migrations and resets
        recorded after it at ``2 * id + 1``, in the order they were recorded. An offer
        to an island that a later reset emptied is left out, and resets are not offers.

        Returns arrays of length N: ``id`` i64, ``island`` i32, ``fitness`` f32,
        ``descriptor`` f32[N, D], ``valid`` bool — what ``qd.archive.rebuild`` takes —
        and ``migrated`` bool (the offer is a migration or reseed, not a new
        candidate); plus ``reset`` i32[K], the sorted islands reset in the range.
        With ``objectives`` (a Pareto archive's, ``qd.task.objectives_of``) ``fitness`` is
        f32[N, M] instead, each offer's maximised objectives read from its metrics
        (``qd.task.objective_matrix``): what a Pareto archive's insert takes.
        Only candidates with ``id > after_id`` (and migrations and resets after them)
        are included. To resume from a state checkpointed at ``after_id``, empty the
        ``reset`` islands first (``qd.archive.reset``), then insert the offers
        (``qd.search.islands.replay`` does both).
        """
        score = "metrics" if objectives else "fitness"
        rows = self._db.rows(
            f"SELECT id, island, {score}, descriptor, valid FROM candidates WHERE id > ? ORDER BY id",
            (after_id,),
        )
        migrants = self._db.rows(
            f"SELECT m.seq, m.after_id, m.genome_id, m.island, c.{score}, c.descriptor, c.valid "
            "FROM migrations m JOIN candidates c ON c.id = m.genome_id "
            "WHERE m.after_id > ? ORDER BY m.seq",
            (after_id,),
        )
        resets = self._db.rows(
            "SELECT seq, after_id, island FROM migrations WHERE genome_id = ? AND after_id > ?",
            (RESET_ID, after_id),
        )
        # Each row: (history position, id, island, fitness, descriptor, valid, migrated).
        order = [((2 * r[0], 0), *r, False) for r in rows]
        order += [((2 * m[1] + 1, m[0]), *m[2:], True) for m in migrants]
        last_reset: dict[int, tuple[int, int]] = {}
        for seq, after, island in resets:
            last_reset[island] = max(last_reset.get(island, (-1, -1)), (2 * after + 1, seq))
        order = [r for r in order if r[0] > last_reset.get(r[2], (-1, -1))]
        order.sort(key=lambda r: r[0])
        blobs = [None if r[4] is None else np.frombuffer(r[4], np.float32) for r in order]
        dim = (
            descriptor_dim
            if descriptor_dim is not None
            else next((d.size for d in blobs if d is not None), 0)
        )
        desc = (
            np.stack(
                [d if d is not None and d.size == dim else np.full(dim, np.nan, np.float32) for d in blobs]
            )
            if order
            else np.zeros((0, dim), np.float32)
        )
        return {
            "id": np.array([r[1] for r in order], np.int64),
            "island": np.array([r[2] for r in order], np.int32),
            "fitness": _objectives([r[3] for r in order], objectives)
            if objectives
            else np.array([np.nan if r[3] is None else r[3] for r in order], np.float32),
            "descriptor": desc.astype(np.float32),
            "valid": np.array([bool(r[5]) for r in order], bool),
            "migrated": np.array([r[6] for r in order], bool),
            "reset": np.array(sorted(last_reset), np.int32),
        }


_EXPLICIT_IDS = "store: explicit ids must be unique, ascending and above the last id"
_VECTOR_COLUMNS = ("id", "created", "kind", "genome", "operator", "island", "vector", "parent_ids")
_VECTOR_COLUMNS += ("fitness", "descriptor", "valid", "metrics")
_VECTOR_INSERT = (
    f"INSERT INTO candidates ({', '.join(_VECTOR_COLUMNS)}) VALUES ({', '.join('?' * len(_VECTOR_COLUMNS))})"
)


def _vector_rows(rows: Mapping[str, np.ndarray], next_id: int, operator: str | None) -> Iterator[tuple]:
    """``Store.add_vectors``'s columns as the values of ``_VECTOR_COLUMNS``, the blobs and the
    parents' JSON as :func:`_row` makes them: ``rows`` maps ``id`` (ascending, from ``next_id``
    on), ``island``, ``genome`` f[N, G], ``fitness``, ``descriptor`` f[N, D], ``valid`` and
    ``parents`` i[N, P] (-1: none) to N rows each, and optionally ``metrics`` (a dict or None
    per row: a Pareto front member's objectives)."""
    ids = np.asarray(rows["id"], np.int64)
    if len(ids) and (np.any(np.diff(ids) <= 0) or ids[0] < next_id):
        raise ValueError(_EXPLICIT_IDS)
    genome, descriptor = (np.ascontiguousarray(rows[k], np.float32) for k in ("genome", "descriptor"))
    parents = (_ids_json([p for p in row if p >= 0]) for row in np.asarray(rows["parents"]).tolist())
    constant = (time.time(), "vector", "vector", operator)
    metrics = (None if m is None else json.dumps(m) for m in rows.get("metrics", [None] * len(ids)))
    for i, island, vector, parent_ids, fitness, desc, valid, metric in zip(
        ids.tolist(),
        np.asarray(rows["island"]).tolist(),
        map(bytes, genome),
        parents,
        np.asarray(rows["fitness"], np.float32).tolist(),
        map(bytes, descriptor),
        np.asarray(rows["valid"], bool).tolist(),
        metrics,
    ):
        yield (i, *constant, island, vector, parent_ids, fitness, desc, valid, metric)


def _row(c: Candidate, now: float) -> tuple:
    """``c`` as the values of ``_COLUMNS``."""
    return (
        c.created if c.created is not None else now,
        c.kind,
        c.text,
        _blob(c.vector),
        _ids_json(c.parent_ids),
        int(c.island),
        c.operator,
        c.model,
        c.prompt,
        c.response,
        c.tokens_in,
        c.tokens_out,
        c.cost,
        None if c.fitness is None else float(c.fitness),
        _blob(c.descriptor),
        bool(c.valid),
        None if c.metrics is None else json.dumps(c.metrics),
        c.error,
        c.eval_seconds,
        None if c.artifacts is None else json.dumps(c.artifacts),
        c.genome,
        c.instruction,
    )


def _candidate(row: tuple) -> Candidate:
    (
        id_,
        created,
        kind,
        text,
        vector,
        parent_ids,
        island,
        operator,
        model,
        prompt,
        response,
        tokens_in,
        tokens_out,
        cost,
        fitness,
        descriptor,
        valid,
        metrics,
        error,
        eval_seconds,
        artifacts,
        genome,
        instruction,
    ) = row
    return Candidate(
        id=id_,
        created=created,
        kind=kind,
        text=text,
        vector=None if vector is None else np.frombuffer(vector, np.float32).copy(),
        parent_ids=json.loads(parent_ids),
        island=island,
        operator=operator,
        model=model,
        prompt=prompt,
        response=response,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=cost,
        fitness=fitness,
        descriptor=None if descriptor is None else np.frombuffer(descriptor, np.float32).copy(),
        valid=bool(valid),
        metrics=None if metrics is None else json.loads(metrics),
        error=error,
        eval_seconds=eval_seconds,
        artifacts=None if artifacts is None else json.loads(artifacts),
        genome=genome or _LEGACY_GENOME.get(kind, kind),
        instruction=instruction,
    )


def _objectives(metrics: list[str | None], objectives: tuple) -> np.ndarray:
    """f32[N, M]: the maximised objectives in stored metrics (JSON text, or None)."""
    from qd.task import objective_matrix

    return objective_matrix(objectives, [None if m is None else json.loads(m) for m in metrics])
