"""ship(fn): a function as a module text that runs without the caller's process, or one line why not."""

from __future__ import annotations

import json
import math
import os.path as osp
import subprocess
import sys
import textwrap
from collections import OrderedDict as Ordered
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qd.contract import ConfigError
from qd.shipping import Shipped, ship

SCALE = 2.5
TABLE = {"a": [1, 2.5, None], "b": (True, b"x", "y")}
LIVE = np.zeros(3)  # an array: not source, so it cannot be shipped


class Base:
    offset = 1


class Shape(Base):
    def area(self, side):
        return side * side + self.offset


def square(x):
    return x * x


def countdown(n):
    return 0 if n <= 0 else 1 + countdown(n - 1)  # a helper that calls itself


def ping(n):
    return pong(n - 1) if n > 0 else "ping"


def pong(n):
    return ping(n - 1) if n > 0 else "pong"  # two helpers that call each other


def uses_everything(path):
    text = Path(path).read_text()
    kept = Ordered(a=1)
    scale = SCALE  # a local named like nothing global; the global SCALE is read once
    return {
        "score": square(len(text)) * scale + math.sqrt(4.0) + Shape().area(2) + countdown(3),
        "feedback": repr(TABLE) + osp.basename(path) + ping(3) + str(len(kept)),
    }


def shadows(path):
    LIVE = 1.0  # noqa: N806 (a local shadowing an unshippable global is not a read of it)
    return LIVE


def reads_live(path):
    return float(LIVE.sum())


def run_shipped(shipped: Shipped, *args):
    """``shipped``'s function called in a fresh namespace: nothing of this module is there."""
    namespace = {"__name__": "shipped"}
    exec(compile(shipped.source, "<shipped>", "exec"), namespace)
    return namespace[shipped.name](*args)


def test_a_function_ships_with_its_imports_constants_helpers_and_classes(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("def f(x):\n    return x\n")
    shipped = ship(uses_everything)
    assert shipped.name == "uses_everything"
    assert run_shipped(shipped, str(program)) == uses_everything(str(program))
    lines = shipped.source.splitlines()
    assert "import math" in lines and "from pathlib import Path" in lines
    assert "from collections import OrderedDict as Ordered" in lines
    assert "import posixpath as osp" in lines or "import os.path as osp" in lines
    assert f"SCALE = {SCALE!r}" in lines and f"TABLE = {TABLE!r}" in lines
    assert "LIVE" not in shipped.source and "numpy" not in shipped.source  # only what it reads
    # a helper is defined once, a base class before the class built on it
    assert shipped.source.count("def countdown") == 1
    assert shipped.source.index("class Base") < shipped.source.index("class Shape")


def test_the_shipped_module_runs_in_a_fresh_isolated_interpreter(tmp_path):
    (tmp_path / "evaluator.py").write_text(ship(uses_everything).source)
    (tmp_path / "program.py").write_text("x = 1\n")
    code = "import evaluator, json; print(json.dumps(evaluator.uses_everything('program.py')))"
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {code}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == uses_everything(str(tmp_path / "program.py"))


def test_a_local_that_shadows_a_global_is_not_shipped():
    shipped = ship(shadows)  # the global LIVE (an array) would be refused
    assert "np.zeros" not in shipped.source and "numpy" not in shipped.source
    assert run_shipped(shipped, "p") == 1.0


def test_a_closure_over_literals_ships_its_values():
    def make(k):
        offset = [1, 2]

        def evaluate(path):
            return k * SCALE + sum(offset)

        return evaluate

    assert run_shipped(ship(make(4)), "p") == 4 * SCALE + 3


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=8)
        | st.binary(max_size=8)
        | st.floats(allow_nan=False, allow_infinity=False),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )
)
def test_any_literal_closed_over_arrives_equal(value):
    def evaluate(path):
        return value

    assert run_shipped(ship(evaluate), "p") == value


def test_a_shipped_value_passes_through():
    shipped = ship(square)
    assert ship(shipped) is shipped


def closes_over_live():
    live = np.ones(2)

    def evaluate(path):
        return live

    return evaluate


@pytest.mark.parametrize(
    "fn, problem",
    [
        (reads_live, "reads_live reads 'LIVE', a ndarray that cannot be shipped"),
        (closes_over_live(), "evaluate reads 'live', a ndarray that cannot be shipped"),
        (lambda path: 1.0, "a lambda cannot be shipped"),
        (len, "len (builtin_function_or_method) is not a Python function"),
        (Shape().area, "Shape.area is a bound method"),
        ("evaluate", "str) is not a Python function"),
    ],
)
def test_what_cannot_be_shipped_is_refused_in_one_line_naming_evaluate(fn, problem):
    with pytest.raises(ConfigError) as e:
        ship(fn)
    message = str(e.value)
    assert e.value.field == "evaluate" and problem in message and "\n" not in message
    assert e.value.fix


def test_a_decorated_function_and_one_without_source_are_refused(tmp_path):
    import functools

    @functools.lru_cache
    def cached(path):
        return 1.0

    with pytest.raises(ConfigError, match="not a Python function"):
        ship(cached)
    namespace: dict = {}
    exec("def typed_in(path):\n    return 1.0\n", namespace)  # no file, no linecache entry
    with pytest.raises(ConfigError, match="the source of typed_in cannot be read"):
        ship(namespace["typed_in"])


def test_a_function_of_main_ships_from_a_script(tmp_path):
    """The notebook case: ``evaluate`` and its helpers live in ``__main__``."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import math
            from qd.shipping import ship

            WEIGHT = 3

            def helper(n):
                return math.floor(n * WEIGHT)

            def evaluate(path):
                return {"score": helper(len(open(path).read()))}

            print(ship(evaluate).source)
            """
        )
    )
    source = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    ).stdout
    program = tmp_path / "p.txt"
    program.write_text("abcd")
    assert "WEIGHT = 3" in source and "def helper" in source and "import math" in source
    assert "qd.shipping" not in source  # what evaluate does not read stays behind
    assert run_shipped(Shipped(source, "evaluate"), str(program)) == {"score": 12}
