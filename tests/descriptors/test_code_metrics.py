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
