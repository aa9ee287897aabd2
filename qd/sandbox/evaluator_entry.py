"""Runs inside the sandbox: a user's evaluator function on one candidate program.

An evaluator imports and runs the program it is given (OpenEvolve's convention:
``evaluate(program_path)``), so it runs here, never on the host: the candidate is
written to ``program.py`` in the run's fresh working directory (the sandbox's private
tmpfs) and ``evaluate(path)`` is called on it. The evaluator's source comes with the
stage's arguments (read or shipped on the host: an OpenEvolve ``evaluator.py``, or a
Python function made into a module by ``qd.shipping``), so it works even where the
sandbox cannot read the user's folder (a private ``/tmp``, a 0700 home). A file's folder
still goes on ``sys.path`` for the evaluator's own imports where it is readable; a
shipped module is written beside the candidate as ``evaluator.py`` (its tracebacks then
show its lines).

Where the evaluation calls the model (an agent's evaluator, ``evaluate(program_path, llm)``),
``llm`` is the sandbox's channel to the run's model on the host.

Only JSON goes back (:func:`outcome`): the numbers as metrics (a bare number is the
metric ``score``), anything else as short strings for the next prompts. The host turns
them into a fitness (``qd.callable_tasks.score_metrics``). Standard library only.
"""

import linecache
import math
import os
import sys
import types

NOTE_CHARS = 500  # a non-numeric metric (``feedback``), as the next prompts show it
ARTIFACT_CHARS = 2000  # an OpenEvolve ``EvaluationResult``'s artifact


def run(text: str, evaluator: str, evaluator_path: str = "", function: str = "evaluate", llm=None) -> dict:
    program = os.path.abspath("program.py")
    with open(program, "w") as f:
        f.write(text)
    if not evaluator_path:  # a shipped module: a file beside the candidate
        evaluator_path = os.path.abspath("evaluator.py")
        with open(evaluator_path, "w") as f:
            f.write(evaluator)
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
    evaluate = getattr(module, function)
    return outcome(evaluate(program) if llm is None else evaluate(program, llm), function)


def outcome(result, function: str = "evaluate") -> dict:
    """``{"metrics": numbers, "artifacts": notes}`` of what an evaluator returned: a number, a
    dict of metrics, or an object with ``.metrics`` (and ``.artifacts``: OpenEvolve's
    ``EvaluationResult``)."""
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        result = {"score": result}
    metrics = getattr(result, "metrics", result)
    if not isinstance(metrics, dict):
        raise TypeError(
            f"{function}() returned {type(result).__name__}, not a number or a dict of metrics "
            "(or an object with .metrics)"
        )
    numbers, notes = {}, {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):  # bools count as 0/1, as in OpenEvolve
            numbers[str(key)] = float(value)
        else:
            notes[str(key)] = str(value)[:NOTE_CHARS]
    for key, value in (getattr(result, "artifacts", None) or {}).items():
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        notes[str(key)] = text[:ARTIFACT_CHARS]
    return {"metrics": numbers, "artifacts": notes}
