"""Runs inside the sandbox: the candidate program's ``f`` at the given points.

This is the untrusted side. It only computes; the held-out targets live in
``task.py`` on the host, out of the candidate's reach.

Only the program's imports and function definitions are kept: small models
often ramble on after ``f`` with top-level test code (``input()``, prints,
loops), and that is not what is being evolved.
"""

import ast
import math


def run(text: str, xs: list[float]) -> list[float | None]:
    tree = ast.parse(text)
    tree.body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
    namespace: dict = {"__name__": "candidate", "math": math}  # the prompt offers math
    exec(compile(tree, "candidate.py", "exec"), namespace)
    f = namespace.get("f")
    if not callable(f):
        raise NameError("the program defines no function f(x)")
    values = []
    for x in xs:
        y = f(x)
        values.append(float(y) if isinstance(y, (int, float)) and math.isfinite(y) else None)
    return values
