"""``events.jsonl``: one JSON object per line, what a run did, in order. Schema version 1.

Every line has ``v`` (the schema version, 1), ``event`` (its kind) and ``time``
(Unix seconds). The kinds and their fields:

- ``commit`` — one per proposal, written when its candidates are stored and
  inserted. The driver commits the proposals of a wave together (one store
  transaction, one insert, one write of all their lines): ``step`` and
  ``batches`` (proposals committed so far, this one included), ``evaluations``
  (candidates stored so far, up to this proposal's), ``batch`` (its candidates),
  ``added`` (those whose insert status was a new cell or an improvement, each
  judged against the archive before the insert, so two in one cell both count),
  ``wave`` (proposals committed with it, itself included), ``elapsed_s``,
  ``evals_per_s`` (this session); the rest describe the run after the whole
  wave: ``global`` (archive stats over all islands:
  ``qd_score``, ``coverage``, ``num_elites``, ``max_fitness``, ``mean_fitness``,
  ...), ``islands`` (the same per island), ``union`` (several cell islands:
  merged cell by cell), ``llm`` (the ledger's totals with ``per_role`` and
  ``per_model``), ``descriptor`` (a describer's ``name``, ``dim``, ``fits``),
  ``stop_reason`` (when stopping on an error), and for proposals that pulled an
  arm ``arm``, ``credit`` (archive improvement) and ``cost`` (in the scheduler's unit).
- ``refit`` — a describer fit and the rebuild: ``fits``, ``candidates``, ``placed``, ``elites``,
  ``seconds``.
- ``rotate`` — a CycleQD phase change: ``phase``, ``quality``, ``candidates``, ``placed``,
  ``elites``, ``seconds``.
- ``reset`` — islands emptied for stagnation: ``islands``, ``reseeded_from``.
- ``meta`` — an instruction mutation: ``child``, ``parent``, ``failures``, ``members``
  (``[id, uses, mean credit]``), or ``error``.
- ``lessons`` — a run-memory lessons note (``qd.lessons``): ``id`` (its store row), ``note``, or
  ``error``.
- ``stop`` — a stop rule met (``qd.stop_rules``): ``rule`` (a target fitness, patience), or
  ``guard`` (the broken-evaluator guard's line).

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
KINDS = ("commit", "refit", "rotate", "reset", "meta", "lessons", "stop")


class EventLog:
    """Appends events to ``path``, dropping a line torn by a crash first."""

    def __init__(self, path: Path):
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
        self._file = open(path, "a")

    def write(
        self,
        kind: str,
        fields: dict[str, Any] | list[dict[str, Any]],
        shared: dict[str, Any] | None = None,
    ) -> Any:
        """Writes an event of ``kind`` and returns it as written; given a list of ``fields``,
        one event per entry, each followed by the ``shared`` fields (encoded once), in one
        write, and returns the list."""
        head = {"v": VERSION, "event": kind, "time": time.time()}
        tail = json.dumps(shared)[1:] if shared else None  # '"key": value, ...}'
        events, lines = [], []
        for f in [fields] if isinstance(fields, dict) else fields:
            own = json.dumps({**head, **f})
            lines.append(own if tail is None else f"{own[:-1]}, {tail}")
            events.append({**head, **f, **(shared or {})})
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        return events[0] if isinstance(fields, dict) else events

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict[str, Any]]:
    """Every event in ``path`` as version 1 (version-0 commit lines get ``event: commit``)."""
    return [upgrade(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def upgrade(event: dict[str, Any]) -> dict[str, Any]:
    """A decoded line as version 1 (in place)."""
    event.setdefault("v", 0)
    event.setdefault("event", "commit")
    return event
