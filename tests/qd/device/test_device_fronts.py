"""The device loop over a Pareto archive (qd.device.fronts): QDax's MOME task, fused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qd.archive import pareto
from qd.archive.grid import GridSpec
from qd.device import fronts
from qd.device.step import DeviceOperator, device_loop
from qd.task import load_task

SPEC = pareto.ParetoSpec(GridSpec((4, 4), (-2.0, -2.0), (4.0, 4.0)), front_size=3, num_objectives=2)


@pytest.mark.slow
def test_a_numeric_pareto_run_keeps_the_fronts_of_every_candidate_with_their_genomes():
    from operators import make_numeric_operator

    task = load_task("mo_rastrigin", {"dim": 6})
    ops = [
        make_numeric_operator("isoline", -2.0, 4.0, iso_sigma=0.05, line_sigma=0.2),
        make_numeric_operator("gaussian", -2.0, 4.0, sigma=0.3),
    ]
    loop = device_loop(
        SPEC,
        task.objectives_jax,
        [DeviceOperator(o.draw, o.apply, o.num_parents, o.params, 1.0) for o in ops],
        2,
        16,
        6,
        task.initial(np.random.default_rng(0), 16),
    )
    state, stats, c = loop.run(loop.init(3), 8, 200, 8, True)
    assert int(state.evaluations) == int(stats.valid) == 200

    # The fronts are those of inserting every candidate, generation by generation.
    want = pareto.init(SPEC, 2)
    for g in range(8):
        want, _ = pareto.insert(SPEC, want, c.island[g], c.descriptor[g], c.fitness[g], c.id[g], c.valid[g])
    for got, expected in zip(state.archive, want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))

    # Each member carries its own genome and parents into whichever slot it now holds.
    ids = np.asarray(state.archive.genome_id)
    member = ids >= 0
    values, descriptor, _ = task.objectives_jax(jnp.asarray(state.genomes)[member])
    np.testing.assert_allclose(np.asarray(values), np.asarray(state.archive.objectives)[member], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(descriptor), np.asarray(state.archive.descriptor)[member])
    kept = np.nonzero(np.asarray(c.id).reshape(-1)[:, None] == ids[member][None, :])
    np.testing.assert_array_equal(
        np.asarray(c.parents).reshape(-1, 2)[kept[0]], np.asarray(state.parents)[member][kept[1]]
    )
    assert (np.asarray(state.parents)[~member] == -1).all() and (
        np.asarray(state.genomes)[~member] == 0
    ).all()
    # Every filled cell is on its island's list once: parents are drawn from it.
    for island in range(2):
        listed = np.asarray(state.occupied[island, : int(state.num_occupied[island])])
        assert sorted(listed) == list(np.nonzero(member[island].any(axis=1))[0])


@pytest.mark.slow
def test_a_drawn_parent_is_a_member_of_its_cell_and_every_member_is_drawn():
    genome_id = jnp.asarray([[[4, 7, -1], [9, -1, -1], [1, 2, 3]]], jnp.int32)
    cell = jnp.asarray([[0, 1, 2] * 400], jnp.int32)
    slot = fronts.pick_slots(jax.random.key(0), genome_id, jnp.zeros((1, 1), jnp.int32), cell)
    drawn = np.asarray(genome_id[0, cell[0], slot[0]])
    assert (drawn >= 0).all()
    counts = {i: int((drawn == i).sum()) for i in (4, 7, 9, 1, 2, 3)}
    assert counts[9] == 400 and min(counts.values()) > 100, counts


@pytest.mark.slow
def test_qd_run_puts_a_pareto_run_on_the_device_and_stores_its_fronts(tmp_path):
    import qd
    from qd.plan import compose
    from qd.rundir import checkpoint
    from qd.store import Store

    cfg = compose(
        [
            "experiment=mo_rastrigin",
            "archive=pareto",
            "runner.loop=device",
            "experiment.params.dim=6",
            "runner.batch_size=32",
            "runner.max_evaluations=640",
            "runner.progress=false",
        ]
    )
    engine = qd.build(cfg, tmp_path)
    try:
        summary = engine.run()
    finally:
        engine.close()
    assert summary["loop"] == "device" and summary["evaluations"] == 640
    state, _, _ = checkpoint.load(tmp_path / "checkpoints")
    ids = np.asarray(state.genome_id)
    assert isinstance(state, pareto.ParetoState) and (ids >= 0).sum() > 64  # fronts, not one per cell
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        rows = {c.id: c for c in store.iter()}
    for island, cell, slot in zip(*np.nonzero(ids >= 0)):
        row = rows[int(ids[island, cell, slot])]
        got = [-row.metrics["rastrigin"], -row.metrics["rastrigin_lag"]]
        np.testing.assert_allclose(got, np.asarray(state.objectives)[island, cell, slot], rtol=1e-6)
