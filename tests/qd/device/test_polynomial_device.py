"""The device loop varies with QDax's MOME operators (operators.polynomial) over a Pareto archive."""

from __future__ import annotations

import numpy as np
import pytest

from operators import make_numeric_operator
from qd.archive import pareto
from qd.archive.grid import GridSpec
from qd.device.step import DeviceOperator, device_loop
from qd.task import load_task

DIM, BATCH, GENERATIONS = 6, 16, 8


@pytest.mark.slow
def test_a_pareto_device_run_makes_every_child_by_polynomial_crossover_or_mutation():
    task = load_task("mo_rastrigin", {"dim": DIM})
    lower, upper = task.genome_bounds
    ops = [
        make_numeric_operator("polynomial_crossover", lower, upper, proportion=0.5),
        make_numeric_operator("polynomial_mutation", lower, upper, eta=1.0, proportion=0.5),
    ]
    spec = pareto.ParetoSpec(GridSpec((4, 4), (lower,) * 2, (upper,) * 2), front_size=3, num_objectives=2)
    loop = device_loop(
        spec,
        task.objectives_jax,
        [DeviceOperator(o.draw, o.apply, o.num_parents, o.params, 0.5) for o in ops],
        1,
        BATCH,
        DIM,
        task.initial(np.random.default_rng(0), BATCH),
    )
    state, stats, c = loop.run(loop.init(1), GENERATIONS, BATCH * GENERATIONS, GENERATIONS, True)
    assert int(state.evaluations) == int(stats.valid) == BATCH * GENERATIONS
    genome = np.asarray(c.genome).reshape(-1, DIM)
    assert genome.min() >= lower and genome.max() <= upper
    ids, parents = np.asarray(c.id).reshape(-1), np.asarray(c.parents).reshape(-1, 2)
    by_id = dict(zip(ids.tolist(), genome))
    crossed = mutated = 0
    for child, (a, b) in zip(genome[BATCH:], parents[BATCH:]):  # the first generation: the founders
        first, second = by_id[int(a)], by_id[int(b)]
        if ((child == first) | (child == second)).all():  # an exchange of genes
            crossed += 1
        else:  # a mutation of the first parent: at most int(0.5 * DIM) genes moved
            assert (child != first).sum() <= DIM // 2
            mutated += 1
    assert crossed > 20 and mutated > 20, (crossed, mutated)
    assert (np.asarray(state.archive.genome_id) >= 0).sum() > 16  # fronts fill, not one per cell
