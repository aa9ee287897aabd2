"""The garbage collector during a run: the heap alive at its start left out of its full passes.

A run keeps what it starts with (the imports, the built parts: ~200k objects for
function_fit) until it ends, and the collector's full passes walk every tracked object:
at a run's pace one came every few thousand candidates and walked mostly those (66 ms
each, about half of the collector's cost in a function_fit run at 64 in flight,
``bench/RESULTS.md``). Frozen (``gc.freeze``), they sit out every pass until the run
ends; refcounting still frees what they drop, and only cycles among them wait for the
end, when they are given back (``gc.unfreeze``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive now, out of the collector's passes until the block ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
