"""``dpo``: preference pairs (TRL's conversational ``prompt``/``chosen``/``rejected``) from a run.

A preference pair is only a fair lesson when both answers were written for the same
prompt, so pairs come from two places where that holds:

- ``siblings``: children of the same first parent by the same operator whose stored
  operator prompts are identical (the model saw exactly the same messages), both
  valid; chosen and rejected are the model's two answers;
- ``cell`` (option ``task_pairs``): a cell's current elite against a valid candidate
  of the same island and cell that it beat; the prompt is the task's description
  (what every candidate of the run was written for), chosen and rejected the genome
  texts.

``margin`` is the stored fitness of the chosen minus the rejected's: above 0 and at
least ``min_margin``. A pair whose two texts are identical teaches nothing and is
skipped. At most ``max_pairs_per_prompt`` pairs come from one sibling group or one
cell (every cell's pairs share the task prompt, so a run-wide cap there would keep
just a few cells), the widest margins first, ties broken by ids, so the output is
the same on every export of the same run.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

from qd import history
from qd.export import messages
from qd.rundir import RunDir

COLUMNS = {
    "prompt": "messages", "chosen": "messages", "rejected": "messages", "margin": "float64", "source": "string",
    "chosen_id": "int64", "rejected_id": "int64", "island": "int64", "cell": "int64", "operator": "string",
    "model": "string",
}
OPTIONS: dict[str, Any] = {"min_margin": 0.0, "max_pairs_per_prompt": 4, "task_pairs": True}


class _Seen(NamedTuple):
    """What pairing needs of a candidate, kept for every one while the store is read once
    (digests instead of texts, so memory does not grow with the texts)."""

    id: int
    fitness: float
    text: str  # digest of the genome text
    response: str  # digest of the model's answer ("" when it has none)


def rows(run: RunDir, options: dict) -> Iterator[dict]:
    """Sibling pairs (groups in the order their first members were stored), then cell pairs
    (by island, then cell)."""
    opts = {**OPTIONS, **options}
    fates = history.fates(run)
    cell_of = dict(zip(fates["id"].tolist(), fates["cell"].tolist()))
    seen, siblings, cells = _read(run, cell_of)
    for group in siblings.values():
        for hi, lo in _keep([_order(a, b) for a, b in itertools.combinations(group, 2)], opts, "response"):
            chosen, rejected = run.store.get([hi.id, lo.id])
            yield _row(messages(chosen.prompt), chosen.response, rejected.response, hi, lo, "siblings",
                       chosen, cell_of[hi.id])
    if opts["task_pairs"]:
        yield from _cell_rows(run, opts, seen, cells)


def _read(run: RunDir, cell_of: dict[int, int]) -> tuple[dict[int, _Seen], dict[tuple, list[_Seen]],
                                                           dict[tuple[int, int], list[_Seen]]]:
    """One pass over the store: every valid text candidate with a fitness, its sibling group
    (first parent, operator, prompt digest) and its (island, cell)."""
    seen: dict[int, _Seen] = {}
    siblings: dict[tuple, list[_Seen]] = defaultdict(list)
    cells: dict[tuple[int, int], list[_Seen]] = defaultdict(list)
    for c in run.store.iter():
        if c.kind != "text" or not c.valid or c.fitness is None or not math.isfinite(c.fitness):
            continue
        s = seen[c.id] = _Seen(c.id, float(c.fitness), _digest(c.text or ""),
                               "" if c.response is None else _digest(c.response))
        if c.parent_ids and c.prompt is not None and c.response is not None:
            siblings[(c.parent_ids[0], c.operator or "", _digest(c.prompt))].append(s)
        if cell_of[c.id] >= 0:
            cells[(c.island, cell_of[c.id])].append(s)
    return seen, siblings, cells


def _cell_rows(run: RunDir, opts: dict, seen: dict[int, _Seen],
               cells: dict[tuple[int, int], list[_Seen]]) -> Iterator[dict]:
    """Each filled cell's elite against the candidates of its island and cell that it beat."""
    from omegaconf import OmegaConf

    from qd.task import load_task

    snap = run.snapshot()
    cfg = run.config()
    task = None  # loaded only when some cell has a pair
    for island, cell in zip(*snap.filled()):
        elite = seen.get(int(snap.genome_id[island, cell]))
        if elite is None:  # a vector genome: no text to prefer
            continue
        pairs = _keep([(elite, s) for s in cells.get((int(island), int(cell)), ()) if s.id != elite.id],
                      opts, "text")
        if not pairs:
            continue
        if task is None:
            task = load_task(cfg.experiment.task, OmegaConf.to_container(cfg.experiment.params, resolve=True))
        prompt = [{"role": "user", "content": task.description}]
        chosen, *rejected = run.store.get([elite.id] + [lo.id for _, lo in pairs])
        for (hi, lo), r in zip(pairs, rejected):
            yield _row(prompt, chosen.text, r.text, hi, lo, "cell", chosen, int(cell), island=int(island))


def _order(a: _Seen, b: _Seen) -> tuple[_Seen, _Seen]:
    """(better, worse); equal fitness gives a margin of 0, which :func:`_keep` drops."""
    return (a, b) if a.fitness >= b.fitness else (b, a)


def _keep(pairs: list[tuple[_Seen, _Seen]], opts: dict, field: str) -> list[tuple[_Seen, _Seen]]:
    """The pairs worth a lesson (a positive margin of at least ``min_margin``, two different
    ``field`` texts), widest margin first, ties by (chosen id, rejected id), at most
    ``max_pairs_per_prompt``."""
    kept = [(hi, lo) for hi, lo in pairs
            if hi.fitness - lo.fitness > 0 and hi.fitness - lo.fitness >= opts["min_margin"]
            and getattr(hi, field) != getattr(lo, field)]
    kept.sort(key=lambda p: (p[1].fitness - p[0].fitness, p[0].id, p[1].id))
    return kept[:int(opts["max_pairs_per_prompt"])]


def _row(prompt: list[dict], chosen: str, rejected: str, hi: _Seen, lo: _Seen, source: str, made: Any,
         cell: int, island: int | None = None) -> dict:
    return {
        "prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}], "margin": hi.fitness - lo.fitness,
        "source": source, "chosen_id": hi.id, "rejected_id": lo.id,
        "island": made.island if island is None else island, "cell": cell, "operator": made.operator or "",
        "model": made.model or "",
    }


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
