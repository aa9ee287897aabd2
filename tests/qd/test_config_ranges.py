"""Every numeric config field declares its range in the schema, and qd-run enforces each bound at start.

The schema (qd/config.py) is walked, not listed here: a new numeric field without
a range fails ``test_every_numeric_field_declares_a_range``, and a new bound is
fed its first invalid value by ``test_first_invalid_value_fails_at_start``.
Those calls run ``qd.run.main`` in-process (a subprocess costs seconds each);
two real ``qd-run`` processes check the exit code and stderr end to end.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
from typing import Any, Optional, get_args, get_type_hints

import pytest
from omegaconf import MISSING

import qd.run
from qd.config import RANGE, Config, Range, field_kind
from qd.plan import compose

BASE = ["experiment=sphere"]  # numeric: no LLM server, no sandbox


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    kind: str  # node | nodes | number | numbers
    tp: Any  # the dataclass (node, nodes) or int / float


def _mentions_number(tp: Any) -> bool:
    return tp in (int, float) or any(_mentions_number(a) for a in get_args(tp))


def walk(schema: type = Config, steps: tuple[Step, ...] = ()):
    """Yields (steps, dataclasses.Field) for every numeric field, nested and list-entry ones included."""
    hints = get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, inner = field_kind(hints[f.name])
        here = (*steps, Step(f.name, kind, inner))
        if kind in ("node", "nodes"):
            yield from walk(inner, here)
        elif kind in ("number", "numbers"):
            yield here, f
        elif _mentions_number(hints[f.name]) and not str(hints[f.name]).startswith(("dict", "list[dict")):
            # a numeric annotation the range check would not understand (a tuple, a Union of numbers...)
            yield here, None


def field_name(steps: tuple[Step, ...]) -> str:
    """The name errors use: ``operators.mix[0].weight``, ``archive.bins[0]``."""
    return ".".join(s.name + ("[0]" if s.kind in ("nodes", "numbers") else "") for s in steps)


NUMERIC = list(walk())


def test_every_numeric_field_declares_a_range():
    names = [field_name(steps) for steps, _ in NUMERIC]
    # the walk reaches nested and list-entry fields (else it would prove nothing)
    for expected in (
        "runner.max_llm_calls",
        "sandbox.memory_mb",
        "seed",
        "archive.bins[0]",
        "operators.mix[0].weight",
        "llm.models[0].weight",
        "llm.local.n_ctx",
        "llm.give_up_after_s",
        "descriptor.parts[0].bins[0]",
        "descriptor.parts[0].axes[0].bins",
        "descriptor.parts[0].axes[0].examples[0].position",
    ):
        assert expected in names
    unknown = [field_name(steps) for steps, f in NUMERIC if f is None]
    assert not unknown, f"numeric fields of a type check_ranges does not walk: {unknown}"
    missing = [field_name(steps) for steps, f in NUMERIC if RANGE not in f.metadata]
    assert not missing, f"numeric fields without a declared range (use qd.config.number): {missing}"


@dataclasses.dataclass
class _Entry:
    x: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Schema:
    entries: list[_Entry] = dataclasses.field(default_factory=list)
    n: Optional[int] = None
    pair: tuple[int, int] = (0, 0)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


def test_the_walk_sees_fields_without_a_range():
    found = {field_name(steps): f for steps, f in walk(_Schema)}
    assert set(found) == {"entries[0].x[0]", "n", "pair"}
    assert found["pair"] is None and RANGE not in found["n"].metadata


def first_invalid(rng: Range, tp: type) -> list[tuple[str, Any]]:
    """(bound, the first value beyond it) for each bound of ``rng``; ints step by 1, floats by one ulp."""
    out = []
    if rng.ge is not None:
        out.append((f">= {rng.ge}", rng.ge - 1 if tp is int else math.nextafter(rng.ge, -math.inf)))
    if rng.gt is not None:
        out.append((f"> {rng.gt}", tp(rng.gt)))
    if rng.le is not None:
        out.append((f"<= {rng.le}", rng.le + 1 if tp is int else math.nextafter(rng.le, math.inf)))
    if rng.lt is not None:
        out.append((f"< {rng.lt}", tp(rng.lt) if math.isfinite(rng.lt) else math.inf))
    if tp is float and rng.finite:  # unbounded sides of a finite float: +-inf
        if rng.le is None and rng.lt is None:
            out.append(("finite", math.inf))
        if rng.ge is None and rng.gt is None:
            out.append(("finite", -math.inf))
    return out


def _valid(rng: Range, tp: type) -> Any:
    value = rng.ge if rng.ge is not None else (rng.gt + 1 if rng.gt is not None else 0)
    return tp(value)


def _required(schema: type) -> dict[str, Any]:
    """The mandatory fields of a list entry, filled with valid placeholders."""
    out, hints = {}, get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.default is MISSING:
            kind, tp = field_kind(hints[f.name])
            out[f.name] = _valid(f.metadata[RANGE], tp) if kind == "number" else "x"
    return out


def fmt(value: Any) -> str:
    """A value in hydra's override grammar."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def override(steps: tuple[Step, ...], value: Any) -> str:
    """One override setting the field to ``value``; lists get one entry, with placeholders for its
    mandatory fields."""
    *parents, leaf = steps
    key = []
    for i, s in enumerate(parents):
        key.append(s.name)
        if s.kind == "nodes":  # from here on the value is a literal list of one entry
            entry = _required(s.tp)
            inner = entry
            for t in parents[i + 1 :]:
                nested = {} if t.kind == "node" else _required(t.tp)
                inner[t.name] = nested if t.kind == "node" else [nested]
                inner = nested
            inner[leaf.name] = [value] if leaf.kind == "numbers" else value
            return f"{'.'.join(key)}={fmt([entry])}"
    key.append(leaf.name)
    return f"{'.'.join(key)}={fmt([value] if leaf.kind == 'numbers' else value)}"


CASES = [
    pytest.param(steps, value, id=f"{field_name(steps)}:{bound.replace(' ', '')}")
    for steps, f in NUMERIC
    if f is not None and RANGE in f.metadata
    for bound, value in first_invalid(f.metadata[RANGE], steps[-1].tp)
]


@pytest.fixture(scope="module")
def compose_values():
    """``qd.plan.compose`` for BASE plus value overrides, without re-reading conf/ (0.4 s -> 0.03 s a call).

    Hydra composes BASE once; each call applies its overrides to a copy with
    hydra's own step for value overrides (the one ``compose`` ends with), so the
    override grammar and the schema's type checks are hydra's.
    ``test_quick_compose_matches_hydra`` checks the two agree.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, bases = OverridesParser.create(), {}

    def quick(overrides: list[str], config_dirs: tuple = (), hydra_node: bool = False):
        assert overrides[: len(BASE)] == BASE and not config_dirs, overrides
        if hydra_node not in bases:  # qd-run composes a single run with hydra's section
            bases[hydra_node] = compose(BASE, hydra_node=hydra_node)
        cfg = copy.deepcopy(bases[hydra_node])
        ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(overrides[len(BASE) :]), cfg)
        return cfg

    return quick


@pytest.fixture
def no_run(monkeypatch, compose_values):
    """Quick composition; and a config that passes the checks would start a run: fail instead."""
    import hydra

    def main(**_):
        return lambda task: lambda: pytest.fail("the config passed the checks and a run would start")

    monkeypatch.setattr(hydra, "main", main)  # a sweep's jobs
    monkeypatch.setattr(qd.run, "_run_single", lambda *_: main()(None)())  # a single run
    monkeypatch.setattr(qd.run, "compose", compose_values)  # what qd-run composes with


def test_quick_compose_matches_hydra(compose_values):
    arg = override(
        next(steps for steps, _ in NUMERIC if field_name(steps).endswith("examples[0].position")), 0.5
    )
    assert compose_values([*BASE, arg]) == compose([*BASE, arg])


def test_every_bound_is_fed():
    assert len(CASES) > 80  # about two per field: a walk that found nothing would pass everything below


@pytest.mark.parametrize("steps, value", CASES)
def test_first_invalid_value_fails_at_start(steps, value, capsys, no_run):
    arg = override(steps, value)
    with pytest.raises(SystemExit) as exit_:
        qd.run.main([*BASE, arg])
    assert exit_.value.code == 2, arg
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, (arg, lines)
    assert lines[0].startswith(f"qd-run: error: {field_name(steps)}: must be "), (arg, lines[0])


@pytest.mark.parametrize(
    "arg, line",
    [
        ("llm.temperature=nan", "qd-run: error: llm.temperature: must be a number, got nan"),
        ("archive.qd_offset=inf", "qd-run: error: archive.qd_offset: must be finite, got inf"),
        ("scheduler.epsilon=1.5", "qd-run: error: scheduler.epsilon: must be in [0, 1], got 1.5"),
        ("scheduler.decay=0", "qd-run: error: scheduler.decay: must be in (0, 1], got 0.0"),
        ("archive.bins=[10,0]", "qd-run: error: archive.bins[1]: must be >= 1, got 0"),
        ("archive.threshold_min=-inf", None),  # -inf: hard thresholds, allowed
        ("runner.max_llm_calls=null", None),  # null: no limit
    ],
)
def test_messages(arg, line, capsys, no_run):
    from qd.config import check_ranges

    cfg = compose([*BASE, arg])
    if line is None:
        check_ranges(cfg)
        return
    with pytest.raises(SystemExit):
        qd.run.main([*BASE, arg])
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_negative_limits_fail_in_real_qd_run(tmp_path):
    # the two commands, as a user types them: both used to start a run
    procs = {
        arg: subprocess.Popen(
            [sys.executable, "-m", "qd.run", "experiment=sphere", arg],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for arg in ("runner.max_llm_calls=-1", "sandbox.memory_mb=-1")
    }
    for arg, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        field = arg.split("=")[0]
        assert proc.returncode == 2, err
        assert err.strip().splitlines() == [
            f"qd-run: error: {field}: must be >= {1 if 'calls' in field else 64}, got -1"
        ], err
    assert not (tmp_path / "outputs").exists()
