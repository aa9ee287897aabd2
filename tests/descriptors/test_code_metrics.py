"""AST code metrics: known values on a small program, None (never an error) on bad input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from descriptors.base import Combined
from descriptors.code_metrics import AXIS_NAMES, METRICS, CodeMetricsDescriptor, code_metrics

PROGRAM = """import math
from os import path

def f(x):
    # a comment line does not count
    if x > 0 and x < 2:
        for i in range(3):
            x += 1.5
    return math.sqrt(abs(x))

g = lambda y: y * 2
"""


def test_known_program():
    m = code_metrics(PROGRAM)
    assert set(m) == set(METRICS)
    assert m["lines"] == 8 and m["functions"] == 2 and m["imports"] == 2
    assert m["loops"] == 1 and m["calls"] == 3 and m["constants"] == 5  # 0, 2, 3, 1.5, 2
    assert m["cyclomatic"] == 1 + 2 + 1  # if, for, one extra `and` operand
    assert m["nesting"] == 3  # def > if > for


@pytest.mark.parametrize("source", ["def f(:\n", "x = (\n", "\x00", "(" * 200 + ")" * 200])
def test_unparsable_or_pathological_source_gives_none_or_metrics(source):
    m = code_metrics(source)
    assert m is None or set(m) == set(METRICS)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_never_raises(source):
    m = code_metrics(source)
    assert m is None or all(isinstance(v, int) and v >= 0 for v in m.values())


def test_axes_are_named_for_the_metric_they_measure():
    assert set(AXIS_NAMES) == set(METRICS)
    nodes = CodeMetricsDescriptor(["nodes", "constants"], [0, 0], [80, 10])
    assert nodes.axis_names == ("AST nodes", "numeric constants")
    both = Combined([nodes, CodeMetricsDescriptor(["loops"], [0], [5])])
    assert both.axis_names == ("AST nodes", "numeric constants", "loops")


def test_a_repeated_text_reads_the_same_metrics_into_a_fresh_dict():
    """A cascade scores a text once per stage: the second read is the first's values, and a caller
    that changes its dict changes no one else's."""
    first = code_metrics(PROGRAM)
    first["nodes"] = -1
    again = code_metrics(PROGRAM)
    assert again["nodes"] > 0 and again == code_metrics(PROGRAM) and again is not code_metrics(PROGRAM)


@pytest.mark.parametrize(
    "source",
    [
        "async def g():\n    async for a in b:\n        async with c as d:\n"
        "            await e(a or d or 1)\n",
        "match x:\n    case 1 if y:\n        pass\n    case _:\n        z = [i for i in r if i]\n",
        "try:\n    import a\nexcept E:\n    assert True, 2j\nwhile x:\n    x = 1 if y else 2.0\n",
    ],
)
def test_every_node_kind_is_counted_once(source):
    """One walk of the tree counts what separate passes would (checked against ast.walk here)."""
    import ast

    nodes = list(ast.walk(ast.parse(source)))
    m = code_metrics(source)
    assert m["nodes"] == len(nodes)
    assert m["calls"] == sum(isinstance(n, ast.Call) for n in nodes)
    assert m["loops"] == sum(
        isinstance(n, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)) for n in nodes
    )
    assert m["constants"] == sum(
        isinstance(n, ast.Constant) and type(n.value) in (int, float, complex) for n in nodes
    )
    assert m["cyclomatic"] > 1 and m["nesting"] >= 1 and m["imports"] == source.count("import ")


def test_asked_metrics_only_and_no_tokenization_unless_tokens_are_asked(monkeypatch):
    """A caller naming its metrics gets those, the same values as the full set; the tokenizer
    (a third of the cost) runs only when ``tokens`` is among them."""
    import descriptors.code_metrics as cm

    full = code_metrics(PROGRAM)
    source = PROGRAM + "\nh = 1\n"  # a text not in the caches
    monkeypatch.setattr(cm, "_token_count", lambda s: pytest.fail("tokenized although tokens not asked"))
    some = code_metrics(source, ("nodes", "constants"))
    assert some == {"nodes": full["nodes"] + 4, "constants": full["constants"] + 1}
    monkeypatch.setattr(cm, "_token_count", lambda s: 7)
    assert code_metrics(source, ("tokens", "loops")) == {"tokens": 7, "loops": 1}
    assert code_metrics("def f(:\n", ("nodes",)) is None
