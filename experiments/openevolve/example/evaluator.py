"""OpenEvolve's evaluator contract: ``evaluate(program_path) -> dict of metrics``.

qd calls it inside the sandbox, on a temporary copy of each candidate program.
``combined_score`` is the fitness; the other numbers are stored with the
candidate (and may be chosen as descriptors: ``experiment.params.descriptors``).
"""

import importlib.util
import math

MINIMUM = -1.5186858  # at (-1.7041, 0.6775)
BUDGET = 200


def f(x, y):
    return math.sin(x) * math.cos(y) + math.sin(x * y) + (x * x + y * y) / 20


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("program", program_path)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    calls = 0

    def counted(x, y):
        nonlocal calls
        calls += 1
        return f(x, y)

    x, y = program.search(counted, BUDGET)
    gap = max(f(x, y) - MINIMUM, 0.0)
    return {
        "value_score": 1.0 / (1.0 + gap),  # 1 at the minimum
        "distance": math.hypot(x + 1.7041, y - 0.6775),
        "calls": float(calls),
        "combined_score": 1.0 / (1.0 + gap) - 0.1 * max(calls - BUDGET, 0) / BUDGET,  # over budget costs
    }
