"""What the export kinds share: reading the store a batch at a time, and a row's fields.

Every kind (``qd.export.<kind>``) and the writers (``formats``) import these; the
package's command (``qd.export.write``) imports the kinds and the writers, so
nothing here imports it back.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

BATCH = 500  # candidates read from the store at a time


def batched(items: Iterable[Any], size: int = BATCH) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``size`` (itertools.batched is Python 3.12)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def candidates(run: Any, ids: Iterable[int]) -> Iterator[Any]:
    """The stored candidates ``ids``, in that order, read a batch at a time (never all at once)."""
    for chunk in batched(ids):
        yield from run.store.get(chunk)


def messages(prompt: str | None) -> list[dict[str, str]] | None:
    """A stored operator prompt as chat messages: operators store the JSON of the messages
    they sent; any other text is taken as one user message."""
    if prompt is None:
        return None
    try:
        sent = json.loads(prompt)
    except json.JSONDecodeError:
        sent = None
    if not (isinstance(sent, list) and all(isinstance(m, dict) and "role" in m for m in sent)):
        return [{"role": "user", "content": prompt}]
    return [
        {
            "role": str(m["role"]),
            "content": m.get("content")
            if isinstance(m.get("content"), str)
            else json.dumps(m.get("content"), ensure_ascii=False),
        }
        for m in sent
    ]


def fitness(value: float | None, valid: bool = True) -> float | None:
    """A stored fitness as a row holds it: None when invalid, missing or not finite."""
    return float(value) if valid and value is not None and math.isfinite(value) else None


class PerCell:
    """The ``k`` highest scores offered to each of ``cells`` slots (an island's cell), with
    their ids: what a kind keeps while the store streams by, in memory bounded by the archive
    rather than the run. Offers come in id order; an equal score keeps the earlier id."""

    def __init__(self, cells: int, k: int):
        self.score = np.full((cells, k), -np.inf)
        self.id = np.full((cells, k), -1, np.int64)

    def offer(self, cell: int, score: float, candidate_id: int) -> None:
        row = self.score[cell]
        if score > row[-1]:
            at = int(np.argmax(row < score))  # the first kept score below it: earlier ties stay ahead
            row[at + 1 :] = row[at:-1].copy()
            self.id[cell, at + 1 :] = self.id[cell, at:-1].copy()
            row[at], self.id[cell, at] = score, candidate_id

    def kept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, score, id) of everything kept, best first, ties by id."""
        cell, slot = np.nonzero(self.id >= 0)
        score, ids = self.score[cell, slot], self.id[cell, slot]
        order = np.lexsort((ids, -score))
        return cell[order], score[order], ids[order]
