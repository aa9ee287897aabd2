"""The kind table (qd.archive.kinds) and the CMA-MAE settings every spec carries.

A toy fourth kind, registered as one entry of ``KINDS``, goes through the public
insert, rebuild and the jitted island migration without any other change.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qd
import qd.archive as qa
from qd.archive.cells import InsertResult
from qd.contract import ConfigError
from qd.search import islands

GRID = qa.GridSpec((4, 4), (0.0, 0.0), (1.0, 1.0))
NOVELTY = qa.NoveltySpec(capacity=8, descriptor_dim=2, k=2)
CVT = qa.CVTSpec(np.asarray([[0.25, 0.25], [0.75, 0.25], [0.5, 0.75]], np.float32))
SPECS = [GRID, NOVELTY, CVT]


# ----------------------------------------------------------- a toy fourth kind


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class NewestSpec:
    """One slot per island holding the island's newest valid candidate, whatever its
    fitness: nothing like a grid, CVT or novelty archive."""

    descriptor_dim: int = 2
    learning_rate: float = 1.0
    threshold_min: float = -math.inf

    @property
    def num_cells(self) -> int:
        return 1


def newest_insert_batch(spec, state, island, descriptor, fitness, genome_id, valid):
    num_islands = state.num_islands
    ok = valid & (island >= 0) & (island < num_islands)
    position = jnp.arange(fitness.shape[0])
    newest = jnp.full(num_islands, -1).at[jnp.where(ok, island, num_islands)].max(position, mode="drop")
    home = jnp.clip(island, 0, num_islands - 1)
    winner = ok & (newest[home] == position)
    target = jnp.where(winner, island, num_islands)

    def put(values, new):
        return values.at[target, 0].set(new, mode="drop")

    new_fitness = put(state.fitness, fitness)
    new_state = qa.ArchiveState(
        fitness=new_fitness,
        descriptor=put(state.descriptor, descriptor),
        genome_id=put(state.genome_id, genome_id),
        threshold=new_fitness,
        threshold_min=state.threshold_min,
    )
    zeros = jnp.zeros_like(island)
    result = InsertResult(
        status=jnp.where(winner, qa.NEW_CELL, qa.NOT_ADDED).astype(jnp.int32),
        improvement=jnp.zeros_like(fitness),
        cell=zeros,
        displaced_id=jnp.where(winner, state.genome_id[home, 0], -1),
        is_elite=winner,
    )
    return new_state, result


def newest_insert(spec, state, island, descriptor, fitness, genome_id, valid=None):
    n = len(fitness)
    batch = (
        np.broadcast_to(np.asarray(island, np.int32), (n,)),
        np.asarray(descriptor, np.float32),
        np.asarray(fitness, np.float32),
        np.asarray(genome_id, np.int32),
        np.ones(n, bool) if valid is None else np.asarray(valid, bool),
    )
    state, result = newest_insert_batch(spec, state, *map(jnp.asarray, batch))
    return state, jax.device_get(result)


def newest_rebuild(spec, num_islands, island, descriptor, fitness, genome_id, valid=None):
    return newest_insert(spec, qa.init(spec, num_islands), island, descriptor, fitness, genome_id, valid)[0]


NEWEST = qa.ArchiveKind(newest_insert, newest_insert_batch, newest_rebuild, has_cells=False)


@pytest.fixture
def newest(monkeypatch: pytest.MonkeyPatch) -> NewestSpec:
    monkeypatch.setitem(qa.KINDS, NewestSpec, NEWEST)
    return NewestSpec()


def test_a_registered_fourth_kind_works_through_the_public_insert_and_rebuild(newest):
    assert qa.kind_of(newest) is NEWEST and not qa.has_cells(newest)
    x = np.asarray([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3], [0.4, 0.4]], np.float32)
    fitness, ids = [5.0, 1.0, 2.0, 9.0], [10, 11, 12, 13]
    state, result = qa.insert(newest, qa.init(newest, 2), [0, 0, 1, 1], x, fitness, ids, [1, 1, 1, 0])
    # The newest valid one per island wins, even when its fitness is lower.
    np.testing.assert_array_equal(np.asarray(result.is_elite), [False, True, True, False])
    np.testing.assert_array_equal(np.asarray(state.genome_id), [[11], [12]])
    rebuilt = qa.rebuild(newest, 2, [0, 0, 1, 1], x, fitness, ids, [1, 1, 1, 0])
    for got, want in zip(rebuilt, state):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Jitted island code reaches the kind through the table as well.
    istate = islands.init(2, 1)._replace(since_migration=jnp.ones(2, jnp.int32))
    state, _, m, moved = islands.migrate(newest, state, istate, jax.random.key(0), "ring", 1, 1)
    np.testing.assert_array_equal(np.asarray(state.genome_id), [[12], [11]])  # swapped
    assert np.asarray(moved.is_elite).all()


def test_a_spec_without_a_kind_is_refused():
    with pytest.raises(TypeError, match="NewestSpec"):
        qa.insert(NewestSpec(), qa.init(NewestSpec()), 0, np.zeros((1, 2)), [1.0], [0])


def test_the_three_kinds_and_their_cells():
    assert qa.kind_of(GRID) is qa.kind_of(CVT) is qa.KINDS[qa.GridSpec]
    assert qa.kind_of(NOVELTY) is qa.KINDS[qa.NoveltySpec] is not qa.kind_of(GRID)
    assert [qa.has_cells(s) for s in SPECS] == [True, False, True]


def test_novelty_spec_is_named_by_isinstance_nowhere_in_qd():
    """The kind table picks the kind from the spec's type: no dispatch on NoveltySpec."""
    found = []
    for path in Path(qd.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                if "NoveltySpec" in ast.unparse(node):
                    found.append(f"{path}:{node.lineno}")
    assert found == []


# ------------------------------------------------------- CMA-MAE settings of a spec


@pytest.mark.parametrize("spec", SPECS, ids=["grid", "novelty", "cvt"])
def test_every_spec_defaults_to_map_elites_and_validates_its_settings(spec):
    assert (spec.learning_rate, spec.threshold_min) == (1.0, -math.inf)
    tuned = dataclasses.replace(spec, learning_rate=0.5, threshold_min=-2)
    assert (tuned.learning_rate, tuned.threshold_min) == (0.5, -2.0)
    assert tuned.num_cells == spec.num_cells
    np.testing.assert_array_equal(np.asarray(qa.init(tuned, 2).threshold), -2.0)
    for bad in ({"learning_rate": 1.5}, {"learning_rate": -0.1}):
        with pytest.raises(ConfigError, match="learning_rate"):
            dataclasses.replace(spec, **bad)
    for bad in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="threshold_min"):
            dataclasses.replace(spec, threshold_min=bad)


def test_with_thresholds_takes_the_settings_and_keeps_the_cells():
    source = dataclasses.replace(GRID, learning_rate=0.25, threshold_min=-1.0)
    phase = qa.with_thresholds(qa.GridSpec((2,), (0.0,), (3.0,)), source)
    assert phase.bins == (2,) and (phase.learning_rate, phase.threshold_min) == (0.25, -1.0)
    fitted = qa.with_thresholds(CVT, source)
    assert fitted.lookup is CVT.lookup and fitted.learning_rate == 0.25


@settings(max_examples=20, deadline=None)
@given(
    learning_rate=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    fitness=st.lists(st.integers(1, 9).map(float), min_size=1, max_size=6),
)
def test_insert_follows_the_spec_learning_rate(learning_rate, fitness):
    """One batch into one empty cell: pyribs's rule t = (1 - lr)^n t0 + (1 - (1 - lr)^n) mean(f)
    with the spec's learning rate and threshold_min (t0 = 0), no argument beside the spec."""
    spec = dataclasses.replace(GRID, learning_rate=learning_rate, threshold_min=0.0)
    n = len(fitness)
    x = np.full((n, 2), 0.1, np.float32)
    state, _ = qa.insert(spec, qa.init(spec), 0, x, fitness, np.arange(n))
    ratio = (1 - learning_rate) ** n
    want = (1 - ratio) * np.mean(fitness)
    assert float(qa.elites(state, 0).threshold[0]) == pytest.approx(want, rel=1e-5, abs=1e-6)
