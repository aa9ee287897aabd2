import numpy as np
import pytest

from qd.contract import ConfigError
from qd.task import load_task


def test_sphere_scores_100_at_the_shifted_optimum_and_0_at_the_worst_corner():
    task = load_task("sphere", {"dim": 100})
    x = np.stack([np.full(100, 5.12 * 0.4), np.full(100, -5.12)]).astype(np.float32)
    ev = task.evaluate(x)
    np.testing.assert_allclose(ev.fitness, [100.0, 0.0], atol=1e-3)
    assert ev.valid.all() and ev.descriptor.shape == (2, 2)
    np.testing.assert_allclose(ev.descriptor[0], [50 * 2.048] * 2, rtol=1e-5)


def test_sphere_descriptors_fold_out_of_range_coordinates():
    task = load_task("sphere", {"dim": 2})
    ev = task.evaluate(np.array([[10.24, 1.0]], np.float32))
    np.testing.assert_allclose(ev.descriptor, [[0.5, 1.0]], rtol=1e-6)


def test_rastrigin_and_bad_params():
    task = load_task("sphere", {"dim": 4, "function": "rastrigin"})
    assert task.evaluate(np.full((1, 4), 2.048, np.float32)).fitness[0] == pytest.approx(100.0)
    with pytest.raises(ConfigError, match="experiment.params.dim"):
        load_task("sphere", {"dim": 3})
    with pytest.raises(ConfigError, match="experiment.params"):
        load_task("sphere", {"dimension": 3})
    with pytest.raises(ConfigError, match="experiment.task: no experiment 'nope'"):
        load_task("nope", {})


def test_sphere_marks_non_finite_genomes_invalid():
    task = load_task("sphere", {"dim": 2})
    ev = task.evaluate(np.array([[np.nan, 0.0], [0.0, 0.0]], np.float32))
    assert ev.valid.tolist() == [False, True]


def test_arm_end_effector_and_fitness():
    task = load_task("arm", {"dof": 4})
    straight = np.zeros((1, 4), np.float32)
    folded = np.array([[np.pi / 2, 0, 0, 0]], np.float32)
    ev = task.evaluate(np.concatenate([straight, folded]))
    np.testing.assert_allclose(ev.descriptor, [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)
    assert ev.fitness[0] == 0 and ev.fitness[1] < 0
    assert task.initial(np.random.default_rng(0), 5).shape == (5, 4)
