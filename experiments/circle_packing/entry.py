"""Runs inside the sandbox: the candidate's ``pack()``, returned as plain numbers.

The untrusted side only produces circles; every check happens on the host
(``task.py``), so a program cannot vouch for its own packing.
"""

import math


def run(text: str) -> list[list[float | None]]:
    namespace: dict = {"__name__": "candidate"}
    exec(compile(text, "candidate.py", "exec"), namespace)
    pack = namespace.get("pack")
    if not callable(pack):
        raise NameError("the program defines no function pack()")
    circles = [list(c) for c in pack()]
    return [
        [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None for v in c] for c in circles
    ]
