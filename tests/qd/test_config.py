import itertools

import pytest

from qd.run import _compose, check_config

GROUPS = {
    "experiment": ["sphere", "arm"],
    "archive": ["grid", "cvt"],
    "islands": ["single", "ring4"],
    "operators": ["gaussian", "isoline", "mixed"],
}


@pytest.mark.parametrize("choice", [dict(zip(GROUPS, c)) for c in itertools.product(*GROUPS.values())])
def test_every_config_combination_composes_and_validates(choice):
    # experiment must come first: it overrides archive/operators defaults.
    overrides = [f"experiment={choice['experiment']}"] + [f"{g}={v}" for g, v in choice.items() if g != "experiment"]
    cfg = _compose(overrides)
    check_config(cfg)
    assert cfg.archive.kind == choice["archive"]
    assert len(cfg.archive.lower) == 2


def test_defaults_are_the_sphere_main_job():
    cfg = _compose([])
    assert cfg.experiment.name == "sphere" and cfg.archive.bins == [100, 100]
    assert cfg.runner.max_evaluations == 100_000
