"""Find the minimum of a bumpy 2-D function (OpenEvolve's function_minimization, shrunk)."""

import random


# EVOLVE-BLOCK-START
def search(f, budget=200):
    """Random search on [-5, 5] x [-5, 5]: the best (x, y) of ``budget`` calls to f(x, y)."""
    rng = random.Random(0)
    best = None
    for _ in range(budget):
        x, y = rng.uniform(-5, 5), rng.uniform(-5, 5)
        value = f(x, y)
        if best is None or value < best[0]:
            best = (value, x, y)
    return best[1], best[2]


# EVOLVE-BLOCK-END
