import sqlite3

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qd.store import Candidate, Store


def make(i: int, island: int = 0, valid: bool = True) -> Candidate:
    return Candidate(
        kind="vector",
        island=island,
        fitness=float(i),
        descriptor=np.array([i, -i], np.float32),
        valid=valid,
        vector=np.arange(3, dtype=np.float32) + i,
        parent_ids=[i - 1] if i else [],
        operator="gaussian",
        metrics={"m": i},
        error=None if valid else "boom",
        tokens_in=i,
        tokens_out=2 * i,
        cost=0.5 * i,
        eval_seconds=0.01,
    )


def test_add_assigns_ascending_ids_and_roundtrips(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        ids = store.add([make(0), make(1), make(2, valid=False)])
        assert ids == [0, 1, 2]
        assert store.add([make(3)]) == [3]
        got = store.get([2, 0])
        assert [c.id for c in got] == [2, 0]
        assert got[0].error == "boom" and not got[0].valid
        np.testing.assert_array_equal(got[1].vector, np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(got[1].descriptor, [0, -0])
        assert got[1].metrics == {"m": 0} and got[1].parent_ids == []
        assert store.count() == 4 and store.last_id() == 3
        assert [c.id for c in store.iter(after_id=1)] == [2, 3]
        with pytest.raises(KeyError, match="no candidate with id 9"):
            store.get([9])


def test_wal_mode_allows_a_reader_while_writing(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as writer:
        writer.add([make(0)])
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        reader = Store(path, readonly=True)
        writer.add([make(1)])
        assert reader.count() == 2
        reader.close()


def test_survives_reopen(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.add([make(0), make(1)])
        store.meta.set("seed", 3)
    with Store(tmp_path / "s.sqlite") as store:
        assert store.count() == 2 and store.meta.get("seed") == 3
        assert store.add([make(2)]) == [2]


def test_placements_interleave_migrations_in_history_order(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.add([make(0), make(1)])
        store.add_migrations(after_id=1, genome_id=[1], island=[2])
        store.add([make(2, valid=False)])
        offers = store.placements()
        assert offers["id"].tolist() == [0, 1, 1, 2]
        assert offers["island"].tolist() == [0, 0, 2, 0]
        assert offers["valid"].tolist() == [True, True, True, False]
        assert offers["descriptor"].shape == (4, 2)
        later = store.placements(after_id=1)
        assert later["id"].tolist() == [2]


def test_readonly_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no store at"):
        Store(tmp_path / "nope.sqlite", readonly=True)


def test_threads_share_one_store_without_breaking_transactions(tmp_path):
    # The engine commits candidates in one thread while describers cache embeddings
    # and judge answers in others, all on the same connection.
    from concurrent.futures import ThreadPoolExecutor

    def commit(i: int) -> None:
        store.add([make(i), make(i)])

    def cache(i: int) -> None:
        store.cache.put("k", {f"{i}.{j}": b"x" for j in range(20)})
        assert store.cache.get("k", [f"{i}.0"]) == {f"{i}.0": b"x"}

    with Store(tmp_path / "s.sqlite") as store, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(commit if i % 2 else cache, i) for i in range(400)]
        for f in futures:
            f.result()
        assert store.count() == 400 and len(store.cache.get("k", [f"{i}.3" for i in range(0, 400, 2)])) == 200
        assert [c.id for c in store.iter(page=7)] == list(range(400))


def test_columns_come_a_page_at_a_time_in_id_or_parent_order(tmp_path):
    """``columns`` streams (pages of ``page`` rows), by id or by first parent then id: the
    sorted scan an export groups siblings with, without holding the run."""
    parents = [[], [], [0], [1], [0, 1], [1], [0], []]
    with Store(tmp_path / "s.sqlite") as store:
        store.add(
            [
                Candidate(
                    fitness=1.0,
                    descriptor=np.zeros(2),
                    valid=True,
                    kind="text",
                    text=str(i),
                    parent_ids=p,
                    island=0,
                )
                for i, p in enumerate(parents)
            ]
        )
        pages = list(store.columns(("id", "text"), page=3))
        assert [len(p) for p in pages] == [3, 3, 2]
        assert [row for p in pages for row in p] == [(i, str(i)) for i in range(8)]
        by_parent = [i for p in store.columns(("id",), page=2, by_parent=True) for (i,) in p]
        assert by_parent == [
            0,
            1,
            7,
            2,
            4,
            6,
            3,
            5,
        ]  # founders (no parent) first, then by first parent, then id
        assert list(store.columns(("id",), kinds=("vector",))) == []
        with pytest.raises(ValueError, match="no column 'nope'"):
            list(store.columns(("nope",)))


CALL = (
    "operator",
    "m",
    1,
    0,
    0,
    0,
    10,
    5,
    0.5,
    3,
)  # (role, model, calls, cached, failed, retries, tokens in, out, cost, reasoning tokens)


def test_llm_calls_commit_with_their_batch_or_alone_and_sum_per_role_and_model(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.add([make(0)], calls=[CALL, ("judge", "m", 2, 1, 0, 1, 4, 2, 0.0, 0)])
        store.calls.add([CALL])  # a refit's or a meta mutation's calls, after candidate 0
        with pytest.raises(ValueError):  # a batch that fails commits none of its calls either
            store.add([make(1)], calls=[CALL], ids=[0])
        assert store.calls.totals() == [
            ("judge", "m", 2, 1, 0, 1, 4, 2, 0.0, 0),
            ("operator", "m", 2, 0, 0, 0, 20, 10, 1.0, 6),
        ]
        assert store.count() == 1


def test_judgments_keep_their_order_and_count(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        assert store.judgments.read().shape == (0, 4) and store.judgments.count() == 0
        store.judgments.add([(0, 1, 2, 0), (3, 4, 5, 1)], "llm")
        store.judgments.add([(6, 7, 8, 1)], "human")
        np.testing.assert_array_equal(store.judgments.read(), [[0, 1, 2, 0], [3, 4, 5, 1], [6, 7, 8, 1]])
        assert store.judgments.count() == 3


def test_a_store_from_before_the_later_columns_opens_for_reading_and_writing(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)  # the first schema: no genome or instruction column
    db.execute(
        "CREATE TABLE candidates (id INTEGER PRIMARY KEY, created REAL NOT NULL, kind TEXT NOT NULL, "
        "text TEXT, vector BLOB, parent_ids TEXT NOT NULL, island INTEGER NOT NULL, operator TEXT, "
        "model TEXT, prompt TEXT, response TEXT, tokens_in INTEGER NOT NULL DEFAULT 0, tokens_out "
        "INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0, fitness REAL, descriptor BLOB, "
        "valid INTEGER NOT NULL, metrics TEXT, error TEXT, eval_seconds REAL, artifacts TEXT)"
    )
    db.execute(
        "INSERT INTO candidates (id, created, kind, text, parent_ids, island, valid) "
        "VALUES (0, 0, 'text', 'x', '[]', 0, 1)"
    )
    db.commit()
    db.close()
    with Store(path, readonly=True) as store:
        (old,) = store.get([0])
        assert (old.genome, old.instruction) == ("program", None) and store.traces.of(0) == []
    with Store(path) as store:
        assert store.add([make(1)]) == [1] and store.get([0])[0].genome == "program"
        assert store.meta.get("store", "all") == "all" and store.keeps_every_candidate()


def test_a_store_from_before_reasoning_tokens_reads_them_as_none_and_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    with Store(path):
        pass
    db = sqlite3.connect(path)  # the llm_calls table as it was: no reasoning_tokens column
    db.execute("DROP TABLE llm_calls")
    db.execute(
        "CREATE TABLE llm_calls (seq INTEGER PRIMARY KEY, after_id INTEGER NOT NULL, role TEXT NOT NULL, "
        "model TEXT NOT NULL, calls INTEGER NOT NULL, cached INTEGER NOT NULL, failed INTEGER NOT NULL, "
        "retries INTEGER NOT NULL, tokens_in INTEGER NOT NULL, tokens_out INTEGER NOT NULL, "
        "cost REAL NOT NULL)"
    )
    db.execute("INSERT INTO llm_calls VALUES (1, -1, 'operator', 'm', 1, 0, 0, 0, 10, 5, 0.5)")
    db.commit()
    db.close()
    with Store(path, readonly=True) as store:
        assert store.calls.totals() == [("operator", "m", 1, 0, 0, 0, 10, 5, 0.5, 0)]
    with Store(path) as store:
        store.calls.add([CALL])
        assert store.calls.totals() == [("operator", "m", 2, 0, 0, 0, 20, 10, 1.0, 3)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(0, 12),
    genome_dim=st.integers(1, 4),
    num_parents=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_add_vectors_writes_the_rows_add_writes(tmp_path_factory, n, genome_dim, num_parents, seed):
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(100, n, replace=False)) + 5
    cols = {
        "id": ids,
        "island": rng.integers(0, 3, n),
        "genome": rng.normal(size=(n, genome_dim)).astype(np.float32),
        "fitness": np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)).astype(np.float32),
        "descriptor": rng.normal(size=(n, 2)).astype(np.float32),
        "valid": rng.random(n) < 0.8,
        "parents": np.where(rng.random((n, num_parents)) < 0.3, -1, rng.integers(0, 5, (n, num_parents))),
    }
    folder = tmp_path_factory.mktemp("stores")
    with Store(folder / "columns.sqlite") as bulk, Store(folder / "objects.sqlite") as one_by_one:
        bulk.add_vectors(cols, "gaussian")
        one_by_one.add(
            [
                Candidate(
                    kind="vector",
                    genome="vector",
                    island=int(cols["island"][j]),
                    fitness=float(cols["fitness"][j]),
                    descriptor=cols["descriptor"][j],
                    valid=bool(cols["valid"][j]),
                    vector=cols["genome"][j],
                    parent_ids=[int(p) for p in cols["parents"][j] if p >= 0],
                    operator="gaussian",
                )
                for j in range(n)
            ],
            ids=ids.tolist(),
        )
        got, want = list(bulk.iter()), list(one_by_one.iter())
        assert [c.id for c in got] == ids.tolist()
        for a, b in zip(got, want):
            a.created = b.created = None
            assert a.fitness == b.fitness or (a.fitness is None and b.fitness is None)
            for field in ("vector", "descriptor"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
                setattr(a, field, None)
                setattr(b, field, None)
            a.fitness = b.fitness = None
            assert a == b
        if n:
            with pytest.raises(ValueError, match="ascending and above the last id"):
                bulk.add_vectors({k: v[:1] for k, v in cols.items()}, None)
