"""The narrow ports: plug-ins use only what ``qd.contract``'s ports offer, and nobody probes a
plug-in for an optional member (the contract's base classes give every default)."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
from helpers import run_config, scripted_text_config, stored, varied_program
from scripted_llm import Rule

from qd.contract import Cache, CandidateLog, Judgments, Ports
from qd.store import Store

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"attach", "model_calls", "calls_per_item", "cell_spec", "num_inspirations"}
PORTS = (Cache, Judgments, CandidateLog)


def probes(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls in ``path`` that name an optional plug-in member."""
    return [
        f"{path}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in OPTIONAL
    ]


def test_the_probe_finder_sees_a_probe(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('def f(d):\n    return getattr(d, "cell_spec", None), getattr(d, "name")\n')
    assert probes(source) == [f"{source}:2"]


def test_nothing_probes_a_plugin_for_an_optional_member():
    files = [
        f for package in ("qd", "descriptors", "operators") for f in sorted((ROOT / package).rglob("*.py"))
    ]
    assert len(files) > 50
    assert [p for f in files for p in probes(f)] == []


def test_the_base_classes_give_the_optional_members_and_the_plugins_subclass_them():
    from descriptors.ai_feedback import AIFeedbackDescriptor
    from descriptors.base import Combined, pending
    from descriptors.code_metrics import CodeMetricsDescriptor
    from descriptors.embedding import EmbeddingDescriptor
    from descriptors.learned import LearnedDescriptor
    from operators import LLMOperator, NumericOperator, make_numeric_operator
    from qd.contract import Descriptor, Evaluator, Operator, TextOperator
    from qd.evaluator import InProcessEvaluator, PoolEvaluator, StagedEvaluator

    class Plain(Descriptor):
        name, dim, lower, upper = "plain", 1, (0.0,), (1.0,)

        async def describe(self, items):
            return pending(len(items), 1)

    plain = Plain()
    assert (plain.calls_per_item, plain.cell_spec(), plain.attach(None)) == (0, None, None)
    both = Combined([Plain(), CodeMetricsDescriptor(["nodes"], [0.0], [9.0])])
    assert both.calls_per_item == 0 and both.cell_spec() is None
    assert make_numeric_operator("gaussian", -1.0, 1.0, sigma=0.1).num_inspirations == 0
    assert InProcessEvaluator(None).model_calls == 0
    kinds = [AIFeedbackDescriptor, CodeMetricsDescriptor, EmbeddingDescriptor, LearnedDescriptor, Combined]
    assert all(issubclass(k, Descriptor) for k in kinds)
    assert issubclass(LLMOperator, TextOperator) and issubclass(NumericOperator, Operator)
    assert all(issubclass(e, Evaluator) for e in (InProcessEvaluator, PoolEvaluator, StagedEvaluator))


def members(port: type) -> set[str]:
    return {name for name, value in vars(port).items() if not name.startswith("_") and callable(value)}


def strict(target: object, port: type, used: dict[str, set[str]]) -> object:
    """An object with only ``port``'s methods (each forwarded to ``target``, its use noted in
    ``used``): any other attribute raises AttributeError, and arguments beyond the port's
    signature raise TypeError."""

    def forward(name: str):
        signature = inspect.signature(getattr(port, name))

        def method(*args, **kwargs):
            signature.bind(None, *args, **kwargs)
            used[port.__name__].add(name)
            return getattr(target, name)(*args, **kwargs)

        return staticmethod(method)

    namespace = {name: forward(name) for name in members(port)}
    return type(f"Only{port.__name__}", (), {"__slots__": (), **namespace})()


def test_the_ports_are_the_methods_the_plugins_use():
    assert [members(p) for p in PORTS] == [{"get", "put"}, {"read", "add", "count"}, {"get", "add"}]


def test_each_side_table_is_its_port_and_the_store_is_the_candidate_log(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        ports = store.ports()
        assert isinstance(ports, Ports) and ports.log is store
        assert ports.cache is store.cache and ports.judgments is store.judgments
        for target, port in zip(ports.__dict__.values(), PORTS):
            assert all(callable(getattr(target, name)) for name in members(port))
        used = {p.__name__: set() for p in PORTS}
        only = strict(store.cache, Cache, used)
        only.put("k", {"a": b"1"})
        assert only.get("k", ["a", "b"]) == {"a": b"1"} and used["Cache"] == {"get", "put"}
        with pytest.raises(AttributeError):
            only._db  # noqa: B018 (the attribute access is the test)
        with pytest.raises(AttributeError):
            strict(store, CandidateLog, used).count()
        with pytest.raises(TypeError):
            strict(store, CandidateLog, used).get([0], missing_ok=True)


JUDGE = r"Answer with the digit only\.\nText: (?![\s\S]*Text: )"  # the last turn of a judge chat
PARTS = (
    "descriptor.parts=["
    "{kind: embedding, dims: 1, refit_at: [4], bins: [4]}, "
    "{kind: ai_feedback, axes: [{name: size, question: How long is it, low: short, high: long, bins: 4}]}, "
    "{kind: learned, dims: 1, refit_at: [9], fit_after: [5], bins: [4]}]"
)


def digit(request: dict) -> str:
    return str(len(request["messages"][-1]["content"]) % 10)


def closer(request: dict) -> str:
    return "BC"[int(request.get("seed") or 0) % 2]


@pytest.fixture
def strict_ports(monkeypatch) -> dict[str, set[str]]:
    """Every store's ports expose only their protocol's methods; the methods used, by port."""
    used = {p.__name__: set() for p in PORTS}

    def ports(store: Store) -> Ports:
        return Ports(*(strict(t, p, used) for t, p in zip((store.cache, store.judgments, store), PORTS)))

    monkeypatch.setattr(Store, "ports", ports)
    return used


def test_a_run_with_every_store_using_plugin_needs_only_the_ports(tmp_path, scripted_llm, strict_ports):
    """Embedding, AI-feedback and learned descriptors, meta-instructions and the novelty gate
    in one text run, each given port objects that have nothing but the port's methods."""
    server = scripted_llm(
        [
            Rule("Reply with one letter only", closer),
            Rule(JUDGE, digit),
            Rule("Answer with the new instruction only", reply="Instruction: Add a square term."),
            Rule("", varied_program),
        ]
    )
    cfg = scripted_text_config(
        server.base_url,
        "runner.max_llm_calls=40",
        "runner.initial_population=4",
        "meta=evolve",
        "meta.evolve_every=3",
        "gate=embedding",
        "descriptor=embedding",
        PARTS,
    )
    summary = run_config(cfg, tmp_path)
    assert summary["descriptor"]["name"] == "embedding+ai_feedback+learned"
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "refit" for e in events)
    rows = stored(tmp_path)
    assert any(c.kind == "instruction" and c.operator == "meta" for c in rows)  # an evolved instruction
    assert [c for c in rows if c.kind == "text" and c.valid]
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        assert store.judgments.count() >= 9
    assert strict_ports == {
        "Cache": {"get", "put"},
        "Judgments": {"read", "add"},
        "CandidateLog": {"get", "add"},
    }
