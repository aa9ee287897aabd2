"""A config is validated once into a plan: one error type with a field path, no throwaway
objects while validating, one "off" idiom across the switchable groups."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from helpers import HYDRA_IN_PROCESS, SPHERE_RUN

import qd.run
from qd.contract import ConfigError
from qd.paths import conf_dir
from qd.plan import Plan, compose, plan

TEXT = [
    "experiment=function_fit",
    "llm.provider=server",
    "llm.base_url=http://127.0.0.1:9",
    "llm.api_key_env=null",
]
QUIET, SPHERE = HYDRA_IN_PROCESS, SPHERE_RUN


def test_config_error_under_builds_the_field_path():
    err = ConfigError("bins", "has 3 entries for 2 axes", "give 2")
    placed = err.under("descriptor.parts[1]")
    assert isinstance(placed, ValueError)
    assert (placed.field, placed.problem, placed.fix) == (
        "descriptor.parts[1].bins",
        "has 3 entries for 2 axes",
        "give 2",
    )
    assert str(placed) == "descriptor.parts[1].bins: has 3 entries for 2 axes (give 2)"
    assert err.under("").field == "bins" and err.field == "bins"  # a new error; the original is unchanged
    assert ConfigError("k", "must be >= 1").under("archive").under("x").field == "x.archive.k"


def test_archive_errors_name_their_own_arguments():
    from qd import archive

    with pytest.raises(ConfigError) as err:
        archive.init(archive.GridSpec((4, 4), (0.0, 0.0), (1.0, 1.0)), descriptor_dim=3)
    assert err.value.field == "descriptor_dim" and "archive." not in str(err.value)
    with pytest.raises(ConfigError) as err:
        archive.GridSpec((4,), (1.0,), (1.0,))
    assert err.value.under("cycle").field == "cycle.upper"


def counting(monkeypatch) -> list[int]:
    """Counts the plans ``qd-run`` makes (``qd.run.plan`` is what main, jobs and resumes call)."""
    calls = []

    def counted(cfg):
        calls.append(1)
        return plan(cfg)

    monkeypatch.setattr(qd.run, "plan", counted)
    return calls


def test_qd_run_validates_a_run_and_a_resume_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["qd-run"])  # main() hands hydra its own argv
    calls = counting(monkeypatch)
    run_dir = tmp_path / "run"
    qd.run.main([*SPHERE, f"hydra.run.dir={run_dir}", *QUIET])
    assert len(calls) == 1  # main() planned it up front; the job reused that plan
    assert re.search(rf"^run dir +{re.escape(str(run_dir))}$", capsys.readouterr().out, re.M)

    calls.clear()
    qd.run.main(["--json", f"resume={run_dir}", "runner.max_evaluations=48"])
    assert len(calls) == 1
    assert json.loads(capsys.readouterr().out)["evaluations"] == 48


def test_a_sweep_plans_each_job_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["qd-run"])
    calls = counting(monkeypatch)
    qd.run.main(["-m", *SPHERE, "seed=0,1", f"hydra.sweep.dir={tmp_path}", *QUIET])
    assert capsys.readouterr().out.count("\nQD score ") == 2
    assert len(calls) == 2  # the first job's plan was made up front, the second job made its own


def test_build_engine_plans_a_config_once_and_takes_a_plan_as_is(tmp_path, monkeypatch):
    calls = counting(monkeypatch)
    engine = qd.run.build_engine(compose(SPHERE), tmp_path / "a")
    engine.close()
    assert len(calls) == 1
    engine = qd.run.build_engine(plan(compose(SPHERE)), tmp_path / "b")
    engine.close()
    assert len(calls) == 1


def _refuse(name: str):
    def construct(*args, **kwargs):
        raise AssertionError(f"validation constructed {name}")

    return construct


def test_validation_constructs_no_runtime_object(monkeypatch):
    import descriptors.embedding
    import operators
    import operators.base
    import operators.llm
    import operators.meta
    import qd.llm
    import qd.llm.server
    import qd.sandbox
    import qd.search.gate

    for owner, attr in [
        (qd.search.gate.NoveltyGate, "__init__"),
        (operators.meta.InstructionPool, "__init__"),
        (operators.llm.LLMOperator, "__init__"),
        (operators.llm, "make_llm_operator"),
        (operators, "make_llm_operator"),
        (operators.base, "make_numeric_operator"),
        (operators, "make_numeric_operator"),
        (qd.llm.LLMClient, "__init__"),
        (qd.llm.server.EmbeddedServer, "__init__"),
        (qd.sandbox.Sandbox, "__init__"),
        (descriptors.embedding.Encoder, "__init__"),
    ]:
        monkeypatch.setattr(owner, attr, _refuse(f"{getattr(owner, '__name__', owner)}.{attr}"))
    cfg = compose([*TEXT, "meta=evolve", "gate=embedding", "operators=llm", "scheduler=ucb1"])
    p = plan(cfg)
    assert isinstance(p, Plan) and p.strategy.gate["threshold"] == 1.0 and p.strategy.meta["size"] == 12
    assert [o.name for o in p.operators] == [o.name for o in cfg.operators.mix] and len(p.operators) > 1
    assert all("templates" in o.params for o in p.operators)  # read and checked, for the builder to use
    assert p.llm.settings.base_url == "http://127.0.0.1:9" and p.evaluator == "sandbox"
    assert plan(compose(SPHERE)).operators[0].params == {"sigma": 0.5}


GROUPS = ["descriptor", "meta", "gate", "cycle"]  # the switchable groups: on and off by `enabled`


@pytest.mark.parametrize("group", GROUPS)
def test_every_switchable_group_is_switched_by_enabled(group):
    options = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((conf_dir() / group).glob("*.yaml"))}
    off = "task" if group == "descriptor" else "none"  # descriptor=task: the task's own descriptors
    assert options[off]["enabled"] is False
    assert {name: o.get("enabled") for name, o in options.items() if name != off} == {
        name: True for name in options if name != off
    }


@pytest.mark.parametrize(
    "on, field",
    [
        ([*TEXT, "descriptor=code_metrics"], "describer"),
        ([*TEXT, "meta=evolve"], "meta"),
        ([*TEXT, "gate=embedding"], "gate"),
        (["experiment=skills", "cycle=skills"], "cycle"),
    ],
)
def test_enabled_false_turns_a_group_off_whatever_else_it_sets(on, field):
    group = on[-1].split("=")[0]

    def built(p: Plan):
        return p.describer if field == "describer" else getattr(p.strategy, field)

    assert built(plan(compose(on))) is not None
    off = plan(compose([*on, f"{group}.enabled=false"]))
    assert built(off) is None
    assert off.geometry.source == "archive"  # the task's own descriptors, on the archive's grid


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["experiment=skills", "cycle.enabled=true"],
            "cycle.metrics: is empty (name the metrics to cycle, or use cycle=none)",
        ),
        (
            [*TEXT, "descriptor.enabled=true"],
            "descriptor.parts: is empty (name the parts (e.g. descriptor=embedding), or use descriptor=task)",
        ),
    ],
)
def test_an_enabled_but_empty_group_is_a_one_line_error(overrides, line):
    with pytest.raises(ConfigError) as err:
        plan(compose(overrides))
    assert str(err.value) == line


def test_scheduler_fixed_is_a_rule_not_an_off_switch():
    from qd.config import SchedulerConf

    assert "enabled" not in SchedulerConf.__dataclass_fields__
    p = plan(compose(["experiment=sphere", "operators=mixed"]))
    assert p.strategy.rule == "fixed" and [a.weight for a in p.strategy.arms] == [
        o.weight for o in p.operators
    ]


@pytest.fixture
def no_run(monkeypatch):
    """qd-run's checks only: a config that passed them would start a run, which fails the test."""
    import hydra

    monkeypatch.setattr(
        hydra, "main", lambda **_: lambda task: lambda: pytest.fail("the config passed the checks")
    )


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            [*TEXT, "descriptor=code_metrics", "descriptor.parts.0.bins=[3]"],
            "descriptor.parts[0].bins: has 1 entries for 2 axes (give 2)",
        ),
        (
            [*TEXT, "descriptor=mixed", "descriptor.parts.0.axes.0.question=' '"],
            "descriptor.parts[0].axes[0].question: is empty (give the axis a question)",
        ),
        (
            [*TEXT, "descriptor=embedding", "descriptor.parts.0.projection=umap"],
            "descriptor.parts[0].projection: unknown 'umap' (use pca, random or none)",
        ),
        (
            [*TEXT, "++operators.mix.0.templates.rewite=x.txt"],
            "operators.mix[0].templates.rewite: unknown template (use one of ['crossover', 'debug', 'diff', "
            "'inspiration', 'meta_agent', 'program', 'rewrite', 'system'])",
        ),
        (
            ["experiment=sphere", "operators=isoline", "operators.mix.0.line_sigma=null"],
            "operators.mix[0].line_sigma: required by the isoline operator",
        ),
        ([*TEXT, "meta=evolve", "meta.seeds=[Be brief., Be brief.]"], "meta.seeds[1]: repeats another seed"),
        (
            [*TEXT, "gate=embedding", "gate.against=[parent]"],
            "gate.against: ['parent'] must be a non-empty subset of ['elites', 'parents']",
        ),
        (
            ["experiment=skills", "cycle=skills", "cycle.lower=[0,0,1]"],
            "cycle.upper: must exceed lower for every metric, got [0.0, 0.0, 1.0] / [1.0, 1.0, 1.0]",
        ),
        (
            ["experiment=sphere", "archive.lower=[0,0]", "archive.upper=[0,1]"],
            "archive.upper: must exceed lower in every dimension, got lower=[0.0, 0.0] upper=[0.0, 1.0]",
        ),
        (
            ["experiment=sphere", "archive=cvt", "archive.cells=64", "archive.cvt_samples=10"],
            "archive.cvt_samples: is 10, fewer than archive.cells=64 (sample at least one point per cell)",
        ),
        (
            ["experiment=sphere", "archive=pareto"],
            "archive.kind: a Pareto archive needs objectives; the task declares none (use grid)",
        ),
        ([*TEXT, "archive=pareto", "archive.front_size=0"], "archive.front_size: must be >= 1, got 0"),
        ([*TEXT, "archive=pareto", "archive.reference=[1.0]"], "archive.reference: needs 2 values"),
        ([*TEXT, "archive=pareto", "select=curiosity"], "select.parents: curiosity scores cells, not fronts"),
        (
            ["experiment=sphere", "runner=ray"],
            "runner: runner=ray runs sandboxed evaluations; this run's evaluator is inprocess "
            "(use runner=local: its evaluations are cheap, or trusted host code)",
        ),
        (
            ["experiment=sphere", "runner.name=cloud"],
            "runner.name: unknown runner 'cloud' (use runner=local or runner=ray)",
        ),
    ],
)
def test_a_plug_in_misconfiguration_is_one_line_naming_the_dotted_field(overrides, line, capsys, no_run):
    with pytest.raises(SystemExit) as exit_:
        qd.run.main(overrides)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"qd-run: error: {line}"]


def test_no_error_text_is_parsed_back_into_a_field():
    root = Path(qd.run.__file__).resolve().parents[1]
    sources = [p for d in ("qd", "operators", "descriptors") for p in (root / d).rglob("*.py")]
    assert sources
    for path in sources:
        text = path.read_text()
        assert 'split(": "' not in text and 'partition(": "' not in text, path


def test_runner_ray_without_ray_names_the_extra(monkeypatch, capsys, no_run):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as exit_:
        qd.run.main(["experiment=function_fit", "runner=ray"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        'qd-run: error: runner=ray needs the ray extra: pip install "qd-engine[ray]"'
    ]
