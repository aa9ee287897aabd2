"""Runs inside the sandbox: the user's OpenEvolve evaluator on one candidate program.

An OpenEvolve evaluator imports and runs the program it is given, so it runs
here, never on the host: the candidate is written to ``program.py`` in the run's
fresh working directory (the sandbox's private tmpfs) and ``evaluate(path)`` is
called on it. The evaluator's source comes with the stage's arguments (read on
the host), so it works even where the sandbox cannot read the user's folder (a
private ``/tmp``, a 0700 home); the folder still goes on ``sys.path`` for the
evaluator's own imports where it is readable.

Only JSON goes back: the numbers as metrics, anything else as short strings for
the next prompts. The host (``task.py``) turns them into a fitness.
"""

import linecache
import math
import os
import sys
import types


def run(text: str, evaluator: str, evaluator_path: str, function: str = "evaluate") -> dict:
    program = os.path.abspath("program.py")
    with open(program, "w") as f:
        f.write(text)
    sys.path.insert(0, os.path.dirname(evaluator_path))
    module = types.ModuleType("evaluator")
    module.__file__ = evaluator_path
    sys.modules["evaluator"] = module
    linecache.cache[evaluator_path] = (
        len(evaluator),
        None,
        evaluator.splitlines(True),
        evaluator_path,
    )  # tracebacks
    exec(compile(evaluator, evaluator_path, "exec"), module.__dict__)
    result = getattr(module, function)(program)
    metrics = getattr(
        result, "metrics", result
    )  # a dict, or OpenEvolve's EvaluationResult(metrics, artifacts)
    if not isinstance(metrics, dict):
        raise TypeError(
            f"{function}() returned {type(result).__name__}, not a dict of metrics "
            "(or an object with .metrics)"
        )
    numbers, notes = {}, {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):  # bools count as 0/1, as in OpenEvolve
            numbers[str(key)] = float(value)
        else:
            notes[str(key)] = str(value)[:500]
    for key, value in (getattr(result, "artifacts", None) or {}).items():
        notes[str(key)] = (value.decode(errors="replace") if isinstance(value, bytes) else str(value))[:2000]
    return {"metrics": numbers, "artifacts": notes}
