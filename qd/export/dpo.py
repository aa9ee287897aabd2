"""``dpo``: preference pairs (TRL's conversational ``prompt``/``chosen``/``rejected``) from a run.

A preference pair is only a fair lesson when both answers were written for the same
prompt, so pairs come from two places where that holds:

- ``siblings``: children of the same first parent by the same operator whose stored
  operator prompts are identical (the model saw exactly the same messages), both
  valid; chosen and rejected are the model's two answers;
- ``cell`` (option ``task_pairs``): a cell's current elite against a valid candidate
  of the same island and cell that it beat; the prompt is the task's description
  (what every candidate of the run was written for), chosen and rejected the genome
  texts;
- ``front`` (option ``front_pairs``, a Pareto run: then the only pairs): a front member
  against a valid candidate of its island and cell that it dominates, so a pair only
  ever prefers the better on every objective; the prompt is the task's description.

``margin`` is the stored fitness of the chosen minus the rejected's (a front pair's: the
sum of its gains over the objectives, maximised): above 0 and at
least ``min_margin``. A pair whose two texts are identical teaches nothing and is
skipped. At most ``max_pairs_per_prompt`` pairs come from one sibling group or one
cell (every cell's pairs share the task prompt, so a run-wide cap there would keep
just a few cells), the widest margins first, ties broken by ids, so the output is
the same on every export of the same run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from qd import fronts, history
from qd.contract import ConfigError
from qd.export.rows import BATCH, PerCell, batched, messages
from qd.rundir import RunDir

COLUMNS = {
    "prompt": "messages",
    "chosen": "messages",
    "rejected": "messages",
    "margin": "float64",
    "source": "string",
    "chosen_id": "int64",
    "rejected_id": "int64",
    "island": "int64",
    "cell": "int64",
    "operator": "string",
    "model": "string",
}
OPTIONS: dict[str, Any] = {
    "min_margin": 0.0,
    "max_pairs_per_prompt": 4,
    "task_pairs": True,
    "front_pairs": False,
}


class _Seen(NamedTuple):
    """What pairing needs of a candidate (a digest instead of its answer, so a group's memory
    does not grow with its texts)."""

    id: int
    fitness: float
    answer: int  # digest of the model's answer (siblings); 0 for a cell pair's texts, compared apart


def rows(run: RunDir, options: dict) -> Iterator[dict]:
    """Sibling pairs (families by first parent, then groups by their first member's id),
    then cell pairs (by island, then cell); or only front pairs (by island, cell, member).
    The store is read in pages, siblings in the order SQLite sorts them by parent, so
    memory is bounded by the most children one parent has and by the archive's cells,
    not by the run."""
    opts = {**OPTIONS, **options}
    if opts["front_pairs"]:  # a Pareto run: no pair that a fitness alone orders
        yield from _front_rows(run, opts)
        return
    cells = history.Cells(run, BATCH)
    for chunk in batched(_sibling_pairs(run, opts)):
        held = {c.id: c for c in run.store.get([i for pair in chunk for i in (pair[0].id, pair[1].id)])}
        chosen = [held[hi.id] for hi, _ in chunk]
        where = cells(
            tuple(None if c.descriptor is None else c.descriptor.tobytes() for c in chosen),
            np.ones(len(chosen), bool),
        )
        for (hi, lo), c, cell in zip(chunk, chosen, where.tolist()):
            margin = hi.fitness - lo.fitness
            yield _row(
                messages(c.prompt),
                c.response,
                held[lo.id].response,
                hi.id,
                lo.id,
                "siblings",
                c,
                cell,
                margin,
            )
    if opts["task_pairs"]:
        yield from _cell_rows(run, opts)


def _sibling_pairs(run: RunDir, opts: dict) -> Iterator[tuple[_Seen, _Seen]]:
    """The kept pairs of each sibling group, one family (the valid text children of one
    first parent) at a time, as the by-parent scan brings them."""
    family: list[int] = []
    parent = -1
    for rows in run.store.columns(
        ("id", "parent_ids", "valid", "fitness"), kinds=("text",), page=BATCH, by_parent=True
    ):
        for i, parents, valid, f in rows:
            if parents == "[]" or not valid or f is None or not math.isfinite(f):
                continue
            if history.first_parent_id(parents) != parent:
                yield from _family_pairs(run, family, opts)
                family, parent = [], history.first_parent_id(parents)
            family.append(i)
    yield from _family_pairs(run, family, opts)


def _family_pairs(run: RunDir, family: list[int], opts: dict) -> Iterator[tuple[_Seen, _Seen]]:
    """Siblings: the family's children grouped by operator and prompt (digests), in id order."""
    groups: dict[tuple[str, bytes], list[_Seen]] = defaultdict(list)
    for chunk in batched(sorted(family)):
        for c in run.store.get(chunk):
            if c.prompt is not None and c.response is not None:
                groups[(c.operator or "", _digest(c.prompt))].append(
                    _Seen(c.id, float(c.fitness), _digest(c.response))
                )
    for group in sorted(groups.values(), key=lambda g: g[0].id):
        yield from _keep([_order(a, b) for a, b in itertools.combinations(group, 2)], opts)


def _cell_rows(run: RunDir, opts: dict) -> Iterator[dict]:
    """Each filled cell's elite against the candidates of its island and cell that it beat,
    the widest margins kept per cell as the store streams by."""
    snap, g = run.snapshot(), run.geometry
    isl, cell = snap.filled()
    slot = isl.astype(np.int64) * g.cells + cell
    elite = np.full(g.islands * g.cells, -1, np.int64)
    elite_fitness = np.full(g.islands * g.cells, np.nan)
    elite_text = np.zeros(g.islands * g.cells, np.uint64)
    for chunk in batched(list(zip(slot.tolist(), snap.genome_id[isl, cell].tolist()))):
        for (k, _), c in zip(chunk, run.store.get([i for _, i in chunk])):
            if c.kind == "text" and c.valid and c.fitness is not None and math.isfinite(c.fitness):
                elite[k], elite_fitness[k], elite_text[k] = c.id, c.fitness, _digest(c.text or "")
    beaten = PerCell(g.islands * g.cells, int(opts["max_pairs_per_prompt"]))
    for page in history.pages(run, ("text",), page=BATCH):
        for k in np.flatnonzero(page["valid"] & np.isfinite(page["fitness"]) & (page["cell"] >= 0)).tolist():
            at = int(page["island"][k]) * g.cells + int(page["cell"][k])
            margin = elite_fitness[at] - page["fitness"][k]
            if (
                margin > 0
                and margin >= opts["min_margin"]
                and page["text"][k] is not None
                and _digest(page["text"][k]) != elite_text[at]
            ):
                beaten.offer(at, margin, int(page["id"][k]))
    yield from _task_rows(run, beaten, elite, g.cells, "cell")


def _front_rows(run: RunDir, opts: dict) -> Iterator[dict]:
    """Each front member against the valid candidates of its island and cell that it
    dominates (no worse on every objective, better on one), the widest margins kept per
    member as the store streams by. The margin is the sum of the gains over the
    objectives, maximised (``qd.task.objective_matrix``)."""
    from qd.task import objective_matrix

    read = fronts.of_run(run)
    if read is None:
        raise ConfigError("front_pairs", f"{run.path} is no Pareto run (archive=pareto)", "drop the option")
    state, objectives, g = read[0], run.geometry.objectives, run.geometry
    k = state.genome_id.shape[-1]
    members = np.asarray(state.genome_id, np.int64).reshape(-1, k)  # [island * cell, K]
    values = np.asarray(state.objectives, np.float64).reshape(len(members), k, -1)
    texts = np.zeros(members.shape, np.uint64)
    listed = [(row, slot) for row, slot in zip(*np.nonzero(members >= 0))]
    for chunk in batched(listed):
        for (row, slot), c in zip(chunk, run.store.get([int(members[r, s]) for r, s in chunk])):
            texts[row, slot] = _digest(c.text or "") if c.kind == "text" else 0
    beaten = PerCell(members.size, int(opts["max_pairs_per_prompt"]))
    for page in history.pages(run, ("text", "metrics"), page=BATCH):
        usable = np.flatnonzero(page["valid"] & (page["cell"] >= 0)).tolist()
        points = objective_matrix(objectives, [_metrics(page["metrics"][i]) for i in usable])
        for i, point in zip(usable, points.astype(np.float64)):
            if page["text"][i] is None or not np.isfinite(point).all():
                continue
            row = int(page["island"][i]) * g.cells + int(page["cell"][i])
            gains = values[row] - point
            dominates = (members[row] >= 0) & (gains >= 0).all(-1) & (gains > 0).any(-1)
            for slot in np.flatnonzero(dominates & (texts[row] != _digest(page["text"][i]))).tolist():
                margin = float(gains[slot].sum())
                if margin >= opts["min_margin"]:
                    beaten.offer(row * k + slot, margin, int(page["id"][i]))
    yield from _task_rows(run, beaten, members.reshape(-1), g.cells * k, "front")


def _task_rows(
    run: RunDir, beaten: PerCell, chosen: np.ndarray, per_island: int, source: str
) -> Iterator[dict]:
    """The kept pairs as rows with the task's description as the prompt: ``chosen`` is the id
    at each slot of ``beaten``, an island's ``per_island`` slots in a row (cells, or a
    front's members cell by cell)."""
    from qd.export.sft import task_of

    at, margin, rejected = beaten.kept()
    order = np.lexsort(
        (rejected, -margin, at)
    )  # by slot (island, then cell), widest margin first, ties by id
    cell_of = per_island // run.geometry.cells  # slots per cell
    task = None  # loaded only when some slot has a pair
    for start in range(0, len(order), BATCH):
        chunk = order[start : start + BATCH].tolist()
        if task is None:
            task = task_of(run)
        prompt = [{"role": "user", "content": task.description}]
        ids = {int(chosen[at[k]]) for k in chunk} | set(rejected[chunk].tolist())
        held = {c.id: c for c in run.store.get(sorted(ids))}
        for k in chunk:
            hi, lo = held[int(chosen[at[k]])], held[int(rejected[k])]
            yield _row(
                prompt,
                hi.text,
                lo.text,
                hi.id,
                lo.id,
                source,
                hi,
                int(at[k] % per_island) // cell_of,
                float(margin[k]),
                island=int(at[k] // per_island),
            )


def _metrics(text: str | None) -> dict | None:
    return None if text is None else json.loads(text)


def _order(a: _Seen, b: _Seen) -> tuple[_Seen, _Seen]:
    """(better, worse); equal fitness gives a margin of 0, which :func:`_keep` drops."""
    return (a, b) if a.fitness >= b.fitness else (b, a)


def _keep(pairs: list[tuple[_Seen, _Seen]], opts: dict) -> list[tuple[_Seen, _Seen]]:
    """The sibling pairs worth a lesson (a positive margin of at least ``min_margin``, two
    different answers), widest margin first, ties by (chosen id, rejected id), at most
    ``max_pairs_per_prompt``."""
    kept = [
        (hi, lo)
        for hi, lo in pairs
        if hi.fitness - lo.fitness > 0
        and hi.fitness - lo.fitness >= opts["min_margin"]
        and hi.answer != lo.answer
    ]
    kept.sort(key=lambda p: (p[1].fitness - p[0].fitness, p[0].id, p[1].id))
    return kept[: int(opts["max_pairs_per_prompt"])]


def _row(
    prompt: list[dict],
    chosen: str,
    rejected: str,
    chosen_id: int,
    rejected_id: int,
    source: str,
    made: Any,
    cell: int,
    margin: float,
    island: int | None = None,
) -> dict:
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
        "margin": margin,
        "source": source,
        "chosen_id": chosen_id,
        "rejected_id": rejected_id,
        "island": made.island if island is None else island,
        "cell": cell,
        "operator": made.operator or "",
        "model": made.model or "",
    }


def _digest(text: str) -> int:
    """64 bits of the text's hash: equal texts always match (so a pair never repeats a text);
    two different texts that collide only cost a pair."""
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
    )
