"""The Pareto archive kind (qd.archive.pareto) against a brute-force Python reference.

Batches are padded to one shape (64), so every example of a property shares one
compilation per (K, objectives). Objective values come from a small integer set, so
ties, equal vectors and equal crowding distances are common.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qd.archive import cells, kinds, pareto
from qd.archive.cvt import CVTSpec
from qd.archive.grid import GridSpec
from qd.archive.state import init as grid_init
from qd.contract import ConfigError

ISLANDS = 2
LINE = GridSpec((3,), (0.0,), (3.0,))  # cells 0, 1, 2 hold descriptors in [c, c + 1)
FRONTS = pareto.ParetoSpec(LINE, front_size=3, num_objectives=2)
SINGLE = pareto.ParetoSpec(LINE, front_size=1, num_objectives=1)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ the reference


def _dominates(a: tuple, b: tuple) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def _crowding(front: list[tuple]) -> dict[int, np.float32]:
    """NSGA-II crowding distance per id, neighbours in (value, id) order, float32 as the
    archive rounds, objectives summed in order."""
    parts: dict[int, list[np.float32]] = {member[0]: [] for member in front}
    for m in range(len(front[0][1])):
        order = sorted(front, key=lambda member: (member[1][m], member[0]))
        span = np.float32(order[-1][1][m] - order[0][1][m])
        for i, member in enumerate(order):
            if i in (0, len(order) - 1):
                part = np.float32(np.inf)
            elif span > 0:
                part = np.float32(np.float32(order[i + 1][1][m] - order[i - 1][1][m]) / span)
            else:
                part = np.float32(0.0)
            parts[member[0]].append(part)
    total = {}
    for gid, values in parts.items():
        crowding = values[0]
        for value in values[1:]:
            crowding = np.float32(crowding + value)
        total[gid] = crowding
    return total


def reference_insert(fronts: dict, batch: list[tuple], front_size: int) -> tuple[bool, dict]:
    """Applies one batch to ``fronts`` ({(island, cell): [(id, values, descriptor)]}).

    Returns whether a front had to drop a non-dominated member (crowding decided), and
    the expected InsertResult fields, by name, as lists over the batch."""
    before = {key: list(members) for key, members in fronts.items()}
    pools: dict[tuple[int, int], list[tuple]] = {}
    result = {name: [] for name in ("status", "improvement", "displaced_id", "is_elite")}
    entered: dict[int, tuple[tuple[int, int], tuple]] = {}
    for position, (island, descriptor, values, gid, ok) in enumerate(batch):
        usable = ok and gid >= 0 and 0 <= island < ISLANDS and all(math.isfinite(v) for v in values)
        if not usable or not math.isfinite(descriptor):
            continue
        key = (island, min(max(int(descriptor + 1e-6), 0), 2))
        pool = pools.setdefault(key, list(fronts.get(key, [])))
        if all(member[0] != gid for member in pool):
            pool.append((gid, values, descriptor))
            entered[position] = (key, pool[-1])
    truncated = False
    for key, pool in pools.items():
        front = [a for a in pool if not any(_dominates(b[1], a[1]) for b in pool)]
        crowding = _crowding(front)
        kept = sorted(front, key=lambda member: (-crowding[member[0]], member[0]))[:front_size]
        truncated |= len(front) > front_size
        fronts[key] = sorted(kept, key=lambda member: member[0])
    for position, (island, descriptor, values, gid, ok) in enumerate(batch):
        usable = ok and gid >= 0 and 0 <= island < ISLANDS and all(math.isfinite(v) for v in values)
        if not usable or not math.isfinite(descriptor):
            for name, empty in (
                ("status", 0),
                ("improvement", 0.0),
                ("displaced_id", -1),
                ("is_elite", False),
            ):
                result[name].append(empty)
            continue
        key = (island, min(max(int(descriptor + 1e-6), 0), 2))
        old = before.get(key, [])
        covered = any(all(o >= v for o, v in zip(member[1], values)) for member in old)
        result["status"].append(0 if covered else (1 if old else 2))
        result["improvement"].append(
            np.float32(values[0]) - np.float32(max(m[1][0] for m in old) if old else 0.0)
        )
        elite = position in entered and entered[position][1] in fronts[key]
        result["is_elite"].append(elite)
        gone = [m[0] for m in old if m not in fronts[key] and _dominates(values, m[1])]
        result["displaced_id"].append(min(gone) if elite and gone else -1)
    return truncated, result


def dense(fronts: dict, spec: pareto.ParetoSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    shape = (ISLANDS, spec.num_cells, spec.front_size)
    ids = np.full(shape, -1, np.int32)
    values = np.full((*shape, spec.num_objectives), -np.inf, np.float32)
    descriptors = np.zeros((*shape, 1), np.float32)
    for (island, cell), members in fronts.items():
        for slot, (gid, value, descriptor) in enumerate(members):
            ids[island, cell, slot] = gid
            values[island, cell, slot] = value
            descriptors[island, cell, slot, 0] = descriptor
    return ids, values, descriptors


def arrays(batch: list[tuple]) -> tuple[np.ndarray, ...]:
    island, descriptor, values, gid, ok = zip(*batch)
    return (
        np.asarray(island, np.int32),
        np.asarray(descriptor, np.float32)[:, None],
        np.asarray(values, np.float32),
        np.asarray(gid, np.int32),
        np.asarray(ok, bool),
    )


def assert_same(state: pareto.ParetoState, fronts: dict, spec: pareto.ParetoSpec) -> None:
    ids, values, descriptors = dense(fronts, spec)
    np.testing.assert_array_equal(np.asarray(state.genome_id), ids)
    np.testing.assert_array_equal(np.asarray(state.objectives), values)
    np.testing.assert_array_equal(np.asarray(state.descriptor), descriptors)


# ------------------------------------------------------------------ strategies

VALUE = st.sampled_from([0.0, 1.0, 2.0, 3.0])


@st.composite
def histories(draw, objectives: int, increasing_ids: bool = False) -> list[list[tuple]]:
    """Batches of candidates (island, descriptor, values, id, valid): ties everywhere,
    some invalid (flag, NaN value or descriptor, island out of range), some candidates
    or ids again."""
    batches, next_id, seen = [], 0, []
    for _ in range(draw(st.integers(1, 3))):
        batch = []
        for _ in range(draw(st.integers(1, 16))):
            if seen and not increasing_ids and draw(st.integers(0, 5)) == 0:
                batch.append(draw(st.sampled_from(seen)))  # a candidate again (a replay)
                continue
            values = tuple(draw(VALUE) for _ in range(objectives))
            if objectives == 2 and draw(st.integers(0, 3)) > 0:
                values = (values[0], 3.0 - values[0])  # a trade-off: fronts fill up
            if draw(st.integers(0, 15)) == 0:
                values = (math.nan, *values[1:])
            if seen and not increasing_ids and draw(st.integers(0, 7)) == 0:
                gid = draw(st.sampled_from(seen))[3]  # an id again, with other values
            else:
                gid = next_id if increasing_ids else draw(st.integers(0, 500))
                next_id += 1
            descriptor = draw(st.sampled_from([0.5, 0.5, 0.5, 1.0, 2.5, math.nan]))
            island = draw(st.sampled_from([0, 0, 0, 1, 2]))
            batch.append((island, descriptor, values, gid, draw(st.integers(0, 9)) > 0))
            seen.append(batch[-1])
        batches.append(batch)
    return batches


# ------------------------------------------------------------------ properties


@pytest.mark.slow
@SETTINGS
@given(histories(objectives=2))
def test_insert_matches_the_brute_force_reference(history: list[list[tuple]]) -> None:
    state, fronts, truncated = pareto.init(FRONTS, ISLANDS), {}, False
    for batch in history:
        crowded, expected = reference_insert(fronts, batch, FRONTS.front_size)
        truncated |= crowded
        state, result = kinds.insert(FRONTS, state, *arrays(batch))
        assert_same(state, fronts, FRONTS)
        for name, values in expected.items():
            np.testing.assert_array_equal(getattr(result, name), values, err_msg=name)
    event(f"crowding decided: {truncated}")
    rows: dict[int, tuple] = {}
    one_row_per_id = all(rows.setdefault(c[3], c) == c for batch in history for c in batch)
    if not truncated and one_row_per_id:
        # Without crowding, a front is the union's non-dominated set: rebuilding the
        # run from its store in one batch gives the same fronts as its history. A store
        # holds one row per id: a history giving an id other values has no store to
        # rebuild from (a batch keeps an id's first row, its history the later one).
        rebuilt = kinds.rebuild(FRONTS, ISLANDS, *arrays([c for batch in history for c in batch]))
        assert_same(rebuilt, fronts, FRONTS)


@pytest.mark.slow
@SETTINGS
@given(histories(objectives=1, increasing_ids=True))
def test_one_elite_on_one_objective_is_the_grid_insert(history: list[list[tuple]]) -> None:
    front_state, grid_state = pareto.init(SINGLE, ISLANDS), grid_init(LINE, ISLANDS)
    for batch in history:
        island, descriptor, values, gid, ok = arrays(batch)
        front_state, front = pareto.insert(SINGLE, front_state, island, descriptor, values, gid, ok)
        grid_state, grid = cells.insert(LINE, grid_state, island, descriptor, values[:, 0], gid, ok)
        np.testing.assert_array_equal(
            np.asarray(front_state.objectives)[..., 0, 0], np.asarray(grid_state.fitness)
        )
        np.testing.assert_array_equal(
            np.asarray(front_state.genome_id)[..., 0], np.asarray(grid_state.genome_id)
        )
        np.testing.assert_array_equal(
            np.asarray(front_state.descriptor)[:, :, 0], np.asarray(grid_state.descriptor)
        )
        for name in ("status", "improvement", "displaced_id", "is_elite"):
            np.testing.assert_array_equal(getattr(front, name), getattr(grid, name), err_msg=name)
        np.testing.assert_array_equal(front.cell[grid.status > 0], grid.cell[grid.status > 0])


# ------------------------------------------------------------------ wiring


def test_crowding_ties_go_to_the_earlier_id() -> None:
    # Four equal vectors: in (value, id) order ids 1 and 9 are the ends (infinite),
    # 3 and 5 tie at 0, and the earlier id, 3, takes the last slot.
    batch = [(0, 0.5, (1.0, 1.0), gid, True) for gid in (5, 3, 9, 1)]
    state, result = kinds.insert(FRONTS, pareto.init(FRONTS, ISLANDS), *arrays(batch))
    np.testing.assert_array_equal(np.asarray(state.genome_id)[0, 0], [1, 3, 9])
    assert list(result.is_elite) == [False, True, True, True]


def test_a_cell_wider_than_the_window_matches_the_reference() -> None:
    # One cell takes more candidates than the narrow window holds: the insert runs at
    # the whole batch's width, with the same rule (ids again, dominated, crowded out).
    width = pareto.WINDOWS[0] + 9
    batch = [(0, 0.5, (float(i % 7), float(6 - i % 7)), 100 - i, True) for i in range(width)]
    batch += [(0, 0.5, (0.0, 0.0), 3, True), (1, 1.5, (1.0, 1.0), 4, True), batch[2]]
    fronts: dict = {}
    truncated, expected = reference_insert(fronts, batch, FRONTS.front_size)
    state, result = kinds.insert(FRONTS, pareto.init(FRONTS, ISLANDS), *arrays(batch))
    assert truncated
    assert_same(state, fronts, FRONTS)
    for name, values in expected.items():
        np.testing.assert_array_equal(getattr(result, name), values, err_msg=name)


def test_the_kind_table_routes_a_pareto_spec() -> None:
    assert kinds.kind_of(FRONTS) is kinds.PARETO and kinds.has_cells(FRONTS)
    with pytest.raises(ConfigError, match="front_size"):
        pareto.ParetoSpec(LINE, front_size=0)


def test_reset_empties_only_the_masked_islands() -> None:
    batch = [(0, 0.5, (1.0, 2.0), 1, True), (1, 0.5, (2.0, 1.0), 2, True), (1, 1.5, (0.0, 0.0), 3, True)]
    state, _ = kinds.insert(FRONTS, pareto.init(FRONTS, ISLANDS), *arrays(batch))
    state = pareto.reset(state, jnp.asarray([False, True]))
    fronts: dict = {}
    reference_insert(fronts, batch[:1], FRONTS.front_size)
    assert_same(state, fronts, FRONTS)
    # The emptied island takes candidates again, as a fresh one would.
    state, result = kinds.insert(FRONTS, state, *arrays(batch[1:]))
    assert list(result.status) == [2, 2]
    reference_insert(fronts, batch[1:], FRONTS.front_size)
    assert_same(state, fronts, FRONTS)


@pytest.mark.slow
def test_migration_sends_the_best_first_objectives_through_the_insert() -> None:
    batch = [
        (0, 0.5, (3.0, 0.0), 1, True),
        (0, 0.5, (0.0, 3.0), 2, True),
        (0, 2.5, (2.0, 2.0), 3, True),
        (1, 0.5, (1.0, 1.0), 4, True),
    ]
    state, _ = kinds.insert(FRONTS, pareto.init(FRONTS, ISLANDS), *arrays(batch))
    state, result = pareto.migrate(FRONTS, state, jax.random.key(0), "ring", 2)
    fronts: dict = {}
    reference_insert(fronts, batch, FRONTS.front_size)
    # Island 0 sends ids 1 (3.0) and 3 (2.0); island 1 sends id 4 and an empty slot;
    # id 4 joins island 0's front of ids 1 and 2, as it dominates neither nor is dominated.
    migrants = [(1, d, v, g, True) for _, d, v, g, _ in (batch[0], batch[2])]
    migrants += [(0, 0.5, (1.0, 1.0), 4, True)]
    reference_insert(fronts, migrants, FRONTS.front_size)
    assert_same(state, fronts, FRONTS)
    assert list(np.asarray(result.is_elite)) == [True, True, True, False]


@pytest.mark.slow
def test_cvt_cells_hold_fronts() -> None:
    spec = pareto.ParetoSpec(CVTSpec(np.asarray([[0.0], [1.0]], np.float32)), front_size=2)
    state, result = kinds.insert(
        spec,
        pareto.init(spec, 1),
        0,
        np.asarray([[0.1], [0.2], [0.9]], np.float32),
        np.asarray([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], np.float32),
        np.asarray([7, 8, 9], np.int32),
    )
    np.testing.assert_array_equal(np.asarray(state.genome_id), [[[7, 8], [9, -1]]])
    assert list(result.cell) == [0, 0, 1]
