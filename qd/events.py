"""``events.jsonl``: one JSON object per line, what a run did, in order. Schema version 1.

Every line has ``v`` (the schema version, 1), ``event`` (its kind) and ``time``
(Unix seconds). The kinds and their fields:

- ``commit`` — after each proposal's candidates are stored and inserted:
  ``step`` (commits so far), ``evaluations``, ``batches``, ``elapsed_s``,
  ``batch`` (candidates in it), ``added`` (those whose insert status was a new
  cell or an improvement, each judged against the archive before the batch, so
  two in one cell both count),
  ``evals_per_s`` (this session), ``global`` (archive stats over all islands:
  ``qd_score``, ``coverage``, ``num_elites``, ``max_fitness``, ``mean_fitness``,
  ...), ``islands`` (the same per island), ``union`` (several cell islands:
  merged cell by cell), ``llm`` (the ledger's totals with ``per_role`` and
  ``per_model``), ``descriptor`` (a describer's ``name``, ``dim``, ``fits``),
  ``stop_reason`` (when stopping on an error), and for proposals that pulled an
  arm ``arm``, ``credit`` (archive improvement) and ``cost`` (in the scheduler's unit).
- ``refit`` — a describer fit and the rebuild: ``fits``, ``candidates``, ``placed``, ``elites``, ``seconds``.
- ``rotate`` — a CycleQD phase change: ``phase``, ``quality``, ``candidates``, ``placed``, ``elites``, ``seconds``.
- ``reset`` — islands emptied for stagnation: ``islands``, ``reseeded_from``.
- ``meta`` — an instruction mutation: ``child``, ``parent``, ``failures``, ``members``
  (``[id, uses, mean credit]``), or ``error``.

New fields may be added within a version; a field's meaning or a kind's
removal changes the version. Lines written before versions existed (no ``v``)
are version 0: the same fields, with commit lines lacking ``event``; :func:`read`
reads both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

VERSION = 1
KINDS = ("commit", "refit", "rotate", "reset", "meta")


class EventLog:
    """Appends events to ``path``, dropping a line torn by a crash first."""

    def __init__(self, path: Path):
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
        self._file = open(path, "a")

    def write(self, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Writes one event of ``kind`` and returns it as written."""
        event = {"v": VERSION, "event": kind, "time": time.time(), **fields}
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()
        return event

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict[str, Any]]:
    """Every event in ``path`` as version 1 (version-0 commit lines get ``event: commit``)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            event = json.loads(line)
            event.setdefault("v", 0)
            event.setdefault("event", "commit")
            out.append(event)
    return out
