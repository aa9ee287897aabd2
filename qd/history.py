"""What a run did, computed from its directory (``qd.rundir.RunDir``): the curves over
evaluations, each candidate's fate, the statistics per operator, model and meta
instruction, and lineages with their diffs.

These are the numbers behind ``qd stats``, ``qd lineage``, ``qd plot`` and ``qd
explore``; each is plain data (dicts, lists, arrays) that the command line prints,
the plots draw and the web explorer serves as JSON. Results are memoized on the
``RunDir`` until the run changes, so a live explorer recomputes them only as the
run writes.
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from typing import Any

import numpy as np

from qd.rundir import RunDir

CURVE_STATS = ("qd_score", "coverage", "max_fitness", "num_elites", "mean_fitness")
GROUPS = ("operator", "model", "instruction")


def curves(run: RunDir) -> dict[str, Any]:
    """QD score, coverage, best, elites and mean fitness over evaluations, from the commit events.

    Returns ``{"evaluations": [...], "global": {stat: [...]}, "islands": [{stat: [...]}, ...],
    "union": {stat: [...]}`` (``union`` only for runs that report islands merged)}`` with one
    point per wave (proposals committed together share their numbers).
    """
    return run.memo("curves", lambda: _curves(run.events()))


def _curves(events: list[dict[str, Any]]) -> dict[str, Any]:
    points: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "commit" and "global" in e:
            points[int(e["evaluations"])] = e  # the wave's last line wins: it holds the wave's numbers
    ordered = [points[k] for k in sorted(points)]
    out: dict[str, Any] = {"evaluations": [int(e["evaluations"]) for e in ordered],
                           "global": {s: [_num(e["global"].get(s)) for e in ordered] for s in CURVE_STATS}}
    islands = max((len(e.get("islands", [])) for e in ordered), default=0)
    out["islands"] = [{s: [_num(e["islands"][i].get(s)) if i < len(e.get("islands", [])) else None for e in ordered]
                       for s in CURVE_STATS} for i in range(islands)]
    if any("union" in e for e in ordered):
        out["union"] = {s: [_num(e.get("union", {}).get(s)) for e in ordered] for s in CURVE_STATS}
    return out


def _num(x: Any) -> float | None:
    """A JSON-safe number: None for missing, NaN or infinite values."""
    return float(x) if x is not None and np.isfinite(x) else None


_FATE_COLUMNS = ("id", "island", "operator", "model", "instruction", "valid", "fitness", "descriptor",
                 "tokens_in", "tokens_out", "cost", "parent_ids", "error")


def fates(run: RunDir) -> dict[str, np.ndarray]:
    """Every candidate's columns (no genome text) and what became of it, as arrays in id order.

    ``entered`` is True where the candidate beat its cell's elite (or found an empty cell)
    when it was stored, judged against the candidates before it on its island; a
    CMA-MAE threshold below the elite (``archive.learning_rate`` < 1) is not modelled, and
    migrations and resets are not replayed. ``improvement`` is its fitness minus its
    first parent's (NaN for founders and invalid candidates). ``cell`` is where its
    descriptor falls (-1: invalid, or a novelty archive, where cells are not fixed).
    """
    return run.memo("fates", lambda: _fates(run))


def _fates(run: RunDir) -> dict[str, np.ndarray]:
    rows = run.store.columns(_FATE_COLUMNS)
    n = len(rows)
    col = dict(zip(_FATE_COLUMNS, zip(*rows))) if rows else {c: () for c in _FATE_COLUMNS}
    ids = np.asarray(col["id"], np.int64)
    island = np.asarray(col["island"], np.int64)
    valid = np.asarray(col["valid"], bool)
    fitness = np.asarray([np.nan if f is None else f for f in col["fitness"]], np.float64)
    parent = np.asarray([json.loads(p)[0] if p != "[]" else -1 for p in col["parent_ids"]], np.int64)
    cell = _cells(run, col["descriptor"], valid & np.isfinite(fitness))
    position = {int(i): k for k, i in enumerate(ids)}
    parent_fitness = np.asarray([fitness[position[p]] if p in position else np.nan for p in parent.tolist()])
    entered = np.zeros(n, bool)
    best: dict[tuple[int, int], float] = {}
    for k in np.flatnonzero(cell >= 0).tolist():
        key = (int(island[k]), int(cell[k]))
        if fitness[k] > best.get(key, -np.inf):
            best[key], entered[k] = fitness[k], True
    return {
        "id": ids, "island": island, "valid": valid, "fitness": fitness, "cell": cell, "entered": entered,
        "parent": parent, "improvement": np.where(valid & (parent >= 0), fitness - parent_fitness, np.nan),
        "operator": np.asarray([o or "" for o in col["operator"]], object),
        "model": np.asarray([m or "" for m in col["model"]], object),
        "instruction": np.asarray([-1 if i is None else i for i in col["instruction"]], np.int64),
        "tokens": np.asarray(col["tokens_in"], np.int64) + np.asarray(col["tokens_out"], np.int64),
        "cost": np.asarray(col["cost"], np.float64),
        "error": np.asarray([e is not None for e in col["error"]], bool),
    }


def _cells(run: RunDir, descriptors: tuple, usable: np.ndarray) -> np.ndarray:
    """The cell each usable candidate's descriptor falls in (-1 elsewhere)."""
    spec, dim = run.spec(), run.geometry.dim
    cell = np.full(len(descriptors), -1, np.int64)
    rows = [k for k in np.flatnonzero(usable).tolist() if descriptors[k] is not None]
    if spec is None or not rows or run.geometry.kind == "novelty":
        return cell
    d = np.stack([np.frombuffer(descriptors[k], np.float32) for k in rows if len(descriptors[k]) == 4 * dim])
    keep = [k for k in rows if len(descriptors[k]) == 4 * dim]
    finite = np.isfinite(d).all(1)
    import jax

    cell[np.asarray(keep)[finite]] = np.asarray(jax.jit(spec.index)(d[finite]), np.int64)
    return cell


def operator_stats(run: RunDir, by: tuple[str, ...] = ("operator", "model")) -> list[dict[str, Any]]:
    """Per group of ``by`` (some of ``operator``, ``model``, ``instruction``): candidates,
    valid and entered-archive rates, mean improvement over the first parent, tokens and cost.

    Rows are sorted by candidates, most first; ``instruction`` groups are labelled with
    the instruction's text (``-`` for candidates made without one).
    """
    unknown = [b for b in by if b not in GROUPS]
    if unknown:
        raise ValueError(f"by: unknown grouping {unknown[0]!r}; use some of {list(GROUPS)}")
    f = fates(run)
    texts = _instruction_texts(run) if "instruction" in by else {}
    groups: dict[tuple, list[int]] = defaultdict(list)
    keys = list(zip(*(f[b].tolist() for b in by))) if len(f["id"]) else []
    for k, key in enumerate(keys):
        groups[key].append(k)
    out = []
    for key, members in groups.items():
        m = np.asarray(members)
        gains = f["improvement"][m]
        gains = gains[np.isfinite(gains)]
        label = {b: (texts.get(v, f"#{v}") if v >= 0 else "-") if b == "instruction" else (v or "-")
                 for b, v in zip(by, key)}
        out.append({
            **label, "candidates": len(m), "valid": int(f["valid"][m].sum()),
            "valid_rate": float(f["valid"][m].mean()), "entered": int(f["entered"][m].sum()),
            "entered_rate": float(f["entered"][m].mean()),
            "mean_improvement": float(gains.mean()) if len(gains) else None,
            "tokens": int(f["tokens"][m].sum()), "cost": float(f["cost"][m].sum()),
        })
    return sorted(out, key=lambda r: (-r["candidates"], [str(r[b]) for b in by]))


def _instruction_texts(run: RunDir) -> dict[int, str]:
    return {int(i): (t or "").strip() for i, t in run.store.columns(("id", "text"), kinds=("instruction",))}


def lineage(run: RunDir, candidate_id: int) -> list[dict[str, Any]]:
    """The ancestor chain of ``candidate_id``, oldest first, along each first parent.

    Each step: ``id``, ``operator``, ``model``, ``fitness``, ``valid``, ``island``,
    ``parent_ids`` (a crossover names several), ``elite`` ((island, cell) where it is an
    elite now, or None: evicted ancestors stay in the store and are shown all the same),
    ``text`` (or ``vector``) and ``diff``: the unified diff from its first parent's text.
    An ancestor the store does not hold (an elites-only store) is a step with ``missing``.

    Raises:
        KeyError: no candidate ``candidate_id``.
    """
    parents = first_parents(run)
    if candidate_id not in parents:
        raise KeyError(f"no candidate {candidate_id} in {run.path}")
    ids, at = [], candidate_id
    while at >= 0 and at in parents:  # parents are stored before their children: no cycles
        ids.append(at)
        at = parents[at]
    held = {c.id: c for c in run.store.get(ids)}  # one read for the whole chain
    chain: list[Any] = [held[i] for i in reversed(ids)]
    if at >= 0:  # an ancestor the store does not hold (an elites-only store)
        chain.insert(0, {"id": at, "missing": True})
    snap = run.snapshot()
    isl, cell = np.nonzero(np.isin(snap.genome_id, ids))
    where = {int(snap.genome_id[i, k]): (int(i), int(k)) for i, k in zip(isl, cell)}
    steps, before = [], None
    for c in chain:
        if isinstance(c, dict):
            steps.append(c)
            before = None
            continue
        step = {"id": c.id, "operator": c.operator, "model": c.model,
                "fitness": _num(c.fitness) if c.fitness is not None else None, "valid": c.valid,
                "island": c.island, "parent_ids": list(c.parent_ids), "elite": where.get(c.id),
                "error": c.error}
        if c.kind == "text":
            step["text"] = c.text or ""
            step["diff"] = diff(before.text or "" if before is not None else "", step["text"],
                                f"#{before.id}" if before is not None else "(none)", f"#{c.id}")
        else:
            step["vector"] = [float(x) for x in c.vector]
        steps.append(step)
        before = c
    return steps


def first_parents(run: RunDir) -> dict[int, int]:
    """Each stored candidate's first parent (-1 for founders), read once per run version:
    a lineage walks it without a query per step."""
    def read() -> dict[int, int]:
        rows = run.store.columns(("id", "parent_ids"))
        return {int(i): int(p[1:].split(",", 1)[0].rstrip("]")) if p != "[]" else -1 for i, p in rows}

    return run.memo("first_parents", read)


def diff(old: str, new: str, old_name: str = "parent", new_name: str = "child") -> str:
    """The unified diff from ``old`` to ``new`` ("" when equal)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        old_name, new_name))


def parent_diff(run: RunDir, candidate: Any) -> str | None:
    """The diff of a text candidate from its first parent (None for founders, vectors and missing parents)."""
    if candidate.kind != "text" or not candidate.parent_ids:
        return None
    try:
        (parent,) = run.store.get([candidate.parent_ids[0]])
    except KeyError:
        return None
    return diff(parent.text or "", candidate.text or "", f"#{parent.id}", f"#{candidate.id}")
