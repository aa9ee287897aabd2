import itertools

import pytest

from qd.plan import compose, plan

GROUPS = {
    "experiment": ["sphere", "arm"],
    "archive": ["grid", "cvt"],
    "islands": ["single", "ring4"],
    "operators": ["gaussian", "isoline", "mixed", "polynomial"],
}


@pytest.mark.parametrize("choice", [dict(zip(GROUPS, c)) for c in itertools.product(*GROUPS.values())])
def test_every_config_combination_composes_and_validates(choice):
    # experiment must come first: it overrides archive/operators defaults.
    overrides = [f"experiment={choice['experiment']}"] + [
        f"{g}={v}" for g, v in choice.items() if g != "experiment"
    ]
    cfg = compose(overrides)
    plan(cfg)
    assert cfg.archive.kind == choice["archive"]
    assert len(cfg.archive.lower) == 2


def test_defaults_are_the_function_fit_main_job_on_the_embedded_llm():
    cfg = compose([])
    assert cfg.experiment.name == "function_fit" and cfg.llm.provider == "local"
    assert [o.name for o in cfg.operators.mix][0] == "rewrite"
    assert cfg.runner.max_llm_calls > 0 and cfg.runner.evaluator == "auto"
    plan(cfg)


@pytest.mark.parametrize("experiment", ["function_fit", "circle_packing"])
@pytest.mark.parametrize("llm", ["local", "openai", "vllm", "ollama"])
def test_text_experiments_compose_with_every_llm_provider(experiment, llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    cfg = compose([f"experiment={experiment}", f"llm={llm}"])
    plan(cfg)
    assert cfg.operators.mix and cfg.llm.models


@pytest.mark.parametrize(
    "experiment, local", [("function_fit", 4), ("openevolve", 4), ("circle_packing", 8), ("red_team", 3)]
)
def test_an_experiments_in_flight_is_for_this_machine_and_a_cluster_sizes_its_own(experiment, local):
    """An experiment's in-flight number holds on runner=local; on runner=ray it is unset (the
    cluster's CPUs size it), and a number the user gives wins on either."""
    assert compose([f"experiment={experiment}"]).runner.in_flight == local
    assert compose([f"experiment={experiment}", "runner=ray"]).runner.in_flight is None
    assert compose([f"experiment={experiment}", "runner=ray", "runner.in_flight=6"]).runner.in_flight == 6
    assert compose(["experiment=agent_design", "runner=ray"]).runner.in_flight == 1  # sequential by design
