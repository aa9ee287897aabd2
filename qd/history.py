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

import dataclasses
import difflib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from qd.rundir import RunDir

CURVE_STATS = ("qd_score", "coverage", "max_fitness", "num_elites", "mean_fitness")
GROUPS = ("operator", "model", "instruction")


def curves(run: RunDir) -> dict[str, Any]:
    """QD score, coverage, best, elites and mean fitness over evaluations, from the commit events.

    Returns ``{"evaluations": [...], "global": {stat: [...]}, "islands": [{stat: [...]}, ...],
    "union": {stat: [...]}, "hypervolume": [...]}`` (``union`` only for runs that report islands
    merged, ``hypervolume`` (the total) only for a Pareto run) with one
    point per wave (proposals committed together share their numbers).
    """
    return run.memo("curves", lambda: _curves(run.events()))


def _curves(events: list[dict[str, Any]]) -> dict[str, Any]:
    points: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "commit" and "global" in e:
            points[int(e["evaluations"])] = e  # the wave's last line wins: it holds the wave's numbers
    ordered = [points[k] for k in sorted(points)]
    out: dict[str, Any] = {
        "evaluations": [int(e["evaluations"]) for e in ordered],
        "global": {s: [_num(e["global"].get(s)) for e in ordered] for s in CURVE_STATS},
    }
    islands = max((len(e.get("islands", [])) for e in ordered), default=0)
    out["islands"] = [
        {
            s: [_num(e["islands"][i].get(s)) if i < len(e.get("islands", [])) else None for e in ordered]
            for s in CURVE_STATS
        }
        for i in range(islands)
    ]
    if any("union" in e for e in ordered):
        out["union"] = {s: [_num(e.get("union", {}).get(s)) for e in ordered] for s in CURVE_STATS}
    if any(e.get("hypervolume") for e in ordered):  # a Pareto run (``qd.fronts``)
        out["hypervolume"] = [_num((e.get("hypervolume") or {}).get("total")) for e in ordered]
    return out


def _num(x: Any) -> float | None:
    """A JSON-safe number: None for missing, NaN or infinite values."""
    return float(x) if x is not None and np.isfinite(x) else None


PAGE = 5000  # candidates per page of a scan
_SCAN = ("id", "island", "valid", "fitness", "descriptor", "parent_ids")


def pages(run: RunDir, names: tuple[str, ...] = (), page: int = PAGE) -> Iterator[dict[str, Any]]:
    """The store's candidates (text and vector) in id order, ``page`` at a time, with what
    became of each: a scan in memory bounded by the page and the archive's cells, so a run of
    any length can be read through (``fates`` keeps the pages; an export streams them).

    Each page: arrays ``id``, ``island``, ``valid``, ``fitness`` (NaN: none), ``parent``
    (the first parent, -1 for founders), ``cell`` (where the descriptor falls; -1: invalid,
    no finite fitness, or a novelty archive, whose cells are not fixed) and ``entered``
    (it beat its cell's elite, or found the cell empty, when it was stored, judged against
    the candidates before it on its island; a CMA-MAE threshold below the elite
    (a CMA-MAE learning rate below 1) is not modelled, and migrations and resets are not
    replayed); and the store's columns ``names`` as lists. ``run.on_read`` is told the progress.
    """
    extra = tuple(n for n in names if n not in _SCAN)
    cells = Cells(run, page)
    best = np.full((run.geometry.islands, max(run.geometry.cells, 1)), -np.inf)
    stored = run.store.last_id() + 1
    for rows in run.store.columns(_SCAN + extra, page=page):
        col = dict(zip(_SCAN + extra, zip(*rows)))
        island = np.asarray(col["island"], np.int64)
        valid = np.asarray(col["valid"], bool)
        fitness = np.asarray([np.nan if f is None else f for f in col["fitness"]], np.float64)
        cell = cells(col["descriptor"], valid & np.isfinite(fitness))
        entered = np.zeros(len(rows), bool)
        for k in np.flatnonzero(cell >= 0).tolist():
            if fitness[k] > best[island[k], cell[k]]:
                best[island[k], cell[k]], entered[k] = fitness[k], True
        ids = np.asarray(col["id"], np.int64)
        if run.on_read is not None:
            run.on_read(int(ids[-1]) + 1, max(stored, int(ids[-1]) + 1))
        yield {
            "id": ids,
            "island": island,
            "valid": valid,
            "fitness": fitness,
            "cell": cell,
            "entered": entered,
            "parent": np.asarray([first_parent_id(p) for p in col["parent_ids"]], np.int64),
            **{n: list(col[n]) for n in extra},
        }


def first_parent_id(parent_ids: str) -> int:
    """The first id of a stored ``parent_ids`` JSON list (-1 for ``[]``), without parsing the JSON."""
    return int(parent_ids[1:].split(",", 1)[0].rstrip("]")) if parent_ids != "[]" else -1


class Cells:
    """The cell each usable candidate's stored descriptor falls in (-1 elsewhere), computed
    by the run's tessellation jitted once for a page's shape."""

    def __init__(self, run: RunDir, page: int):
        import jax

        spec, self.dim, self.page = run.spec(), run.geometry.dim, page
        self.index = None if spec is None or run.geometry.kind == "novelty" else jax.jit(spec.index)

    def __call__(self, descriptors: tuple, usable: np.ndarray) -> np.ndarray:
        cell = np.full(len(descriptors), -1, np.int64)
        rows = [
            k
            for k in np.flatnonzero(usable).tolist()
            if descriptors[k] is not None and len(descriptors[k]) == 4 * self.dim
        ]
        if self.index is None or not rows:
            return cell
        d = np.zeros((-(-len(rows) // self.page) * self.page, self.dim), np.float32)  # padded: one compile
        d[: len(rows)] = np.frombuffer(b"".join(descriptors[k] for k in rows), np.float32).reshape(
            -1, self.dim
        )
        finite = np.isfinite(d[: len(rows)]).all(1)
        cell[np.asarray(rows)[finite]] = np.asarray(self.index(d), np.int64)[: len(rows)][finite]
        return cell


_FATE_COLUMNS = (
    "operator",
    "model",
    "instruction",
    "tokens_in",
    "tokens_out",
    "cost",
    "error",
    "parent_fitness",
)
_FATE_KINDS = {
    "id": np.int64,
    "island": np.int64,
    "valid": bool,
    "fitness": np.float64,
    "cell": np.int64,
    "entered": bool,
    "parent": np.int64,
    "operator": object,
    "model": object,
    "instruction": np.int64,
    "tokens": np.int64,
    "cost": np.float64,
    "error": bool,
    "improvement": np.float64,
}


def fate_pages(run: RunDir) -> Iterator[dict[str, np.ndarray]]:
    """The candidates' columns (no genome text) and what became of each, a page of
    :func:`pages` at a time as arrays, with ``improvement``: its fitness minus its first
    parent's (NaN for founders, invalid candidates and parents the store does not hold;
    the store looks the parent up, so no page needs the ones before it)."""
    for page in pages(run, _FATE_COLUMNS):
        parent_fitness = np.asarray([np.nan if f is None else f for f in page["parent_fitness"]], np.float64)
        yield {
            **{
                name: page[name] for name in ("id", "island", "valid", "fitness", "cell", "entered", "parent")
            },
            "operator": np.asarray([o or "" for o in page["operator"]], object),
            "model": np.asarray([m or "" for m in page["model"]], object),
            "instruction": np.asarray([-1 if i is None else i for i in page["instruction"]], np.int64),
            "tokens": np.asarray(page["tokens_in"], np.int64) + np.asarray(page["tokens_out"], np.int64),
            "cost": np.asarray(page["cost"], np.float64),
            "error": np.asarray([e is not None for e in page["error"]], bool),
            "improvement": np.where(
                page["valid"] & (page["parent"] >= 0), page["fitness"] - parent_fitness, np.nan
            ),
        }


def fates(run: RunDir) -> dict[str, np.ndarray]:
    """Every candidate's :func:`fate_pages` columns at once, in id order: memory grows with
    the store, so the commands read :func:`operator_stats` (bounded) and this serves
    analyses of a run that fits in memory."""
    return run.memo("fates", lambda: _fates(run))


def _fates(run: RunDir) -> dict[str, np.ndarray]:
    parts = list(fate_pages(run))
    return {
        k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, t) for k, t in _FATE_KINDS.items()
    }


@dataclasses.dataclass
class FateTally:
    """Sums over a group of candidates, merged group into group: what a row of
    :func:`operator_stats` reports, kept per (operator, model, instruction) so that a scan
    holds one per combination seen, not one per candidate."""

    candidates: int = 0
    valid: int = 0
    entered: int = 0
    gain_sum: float = 0.0  # the finite improvements over the first parent, summed
    gains: int = 0  # and counted
    tokens: int = 0
    cost: float = 0.0

    def merge(self, other: FateTally) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def row(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "valid": self.valid,
            "valid_rate": self.valid / self.candidates,
            "entered": self.entered,
            "entered_rate": self.entered / self.candidates,
            "mean_improvement": self.gain_sum / self.gains if self.gains else None,
            "tokens": self.tokens,
            "cost": self.cost,
        }


def tallies(run: RunDir) -> dict[tuple[str, str, int], FateTally]:
    """A :class:`FateTally` per (operator, model, instruction) seen, from one scan of the store
    that keeps a page at a time (memoized until the run changes)."""
    return run.memo("tallies", lambda: _tallies(run))


def _tallies(run: RunDir) -> dict[tuple[str, str, int], FateTally]:
    out: dict[tuple[str, str, int], FateTally] = defaultdict(FateTally)
    for f in fate_pages(run):
        groups: dict[tuple, list[int]] = defaultdict(list)
        for k, key in enumerate(zip(*(f[b].tolist() for b in GROUPS))):
            groups[key].append(k)
        for key, members in groups.items():
            m = np.asarray(members)
            gains = f["improvement"][m]
            gains = gains[np.isfinite(gains)]
            out[key].merge(
                FateTally(
                    candidates=len(m),
                    valid=int(f["valid"][m].sum()),
                    entered=int(f["entered"][m].sum()),
                    gain_sum=float(gains.sum()),
                    gains=len(gains),
                    tokens=int(f["tokens"][m].sum()),
                    cost=float(f["cost"][m].sum()),
                )
            )
    return dict(out)


def operator_stats(run: RunDir, by: tuple[str, ...] = ("operator", "model")) -> list[dict[str, Any]]:
    """Per group of ``by`` (some of ``operator``, ``model``, ``instruction``; none: one row
    of every candidate): candidates, valid and entered-archive rates, mean improvement over
    the first parent, tokens and cost, merged from :func:`tallies`.

    Rows are sorted by candidates, most first; ``instruction`` groups are labelled with
    the instruction's text (``-`` for candidates made without one).
    """
    unknown = [b for b in by if b not in GROUPS]
    if unknown:
        raise ValueError(f"by: unknown grouping {unknown[0]!r}; use some of {list(GROUPS)}")
    texts = _instruction_texts(run) if "instruction" in by else {}
    groups: dict[tuple, FateTally] = defaultdict(FateTally)
    for key, tally in tallies(run).items():
        groups[tuple(key[GROUPS.index(b)] for b in by)].merge(tally)
    out = []
    for key, tally in groups.items():
        label = {
            b: (texts.get(v, f"#{v}") if v >= 0 else "-") if b == "instruction" else (v or "-")
            for b, v in zip(by, key)
        }
        out.append({**label, **tally.row()})
    return sorted(out, key=lambda r: (-r["candidates"], [str(r[b]) for b in by]))


def _instruction_texts(run: RunDir) -> dict[int, str]:
    return {
        int(i): (t or "").strip()
        for page in run.store.columns(("id", "text"), kinds=("instruction",))
        for i, t in page
    }


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
    ids, at = ancestors(first_parents(run), candidate_id)
    if not ids:
        raise KeyError(f"no candidate {candidate_id} in {run.path}")
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
        step = {
            "id": c.id,
            "operator": c.operator,
            "model": c.model,
            "fitness": _num(c.fitness) if c.fitness is not None else None,
            "valid": c.valid,
            "island": c.island,
            "parent_ids": list(c.parent_ids),
            "elite": where.get(c.id),
            "error": c.error,
        }
        if c.kind == "text":
            step["text"] = c.text or ""
            step["diff"] = diff(
                before.text or "" if before is not None else "",
                step["text"],
                f"#{before.id}" if before is not None else "(none)",
                f"#{c.id}",
            )
        else:
            step["vector"] = [float(x) for x in c.vector]
        steps.append(step)
        before = c
    return steps


class FirstParents(NamedTuple):
    """Each stored candidate's first parent: ``parent[k]`` of ``id[k]`` (ids ascending; -1 for
    a founder). Two arrays, 16 bytes a stored candidate, dense or not (a device run's
    elites-only store keeps a few ids out of millions of evaluations)."""

    id: np.ndarray  # i64[N]
    parent: np.ndarray  # i64[N]

    def of(self, candidate_id: int) -> int:
        """The first parent of ``candidate_id`` (-1: a founder; -2: the store does not hold it)."""
        k = int(np.searchsorted(self.id, candidate_id))
        return int(self.parent[k]) if k < len(self.id) and self.id[k] == candidate_id else -2


def first_parents(run: RunDir) -> FirstParents:
    """Every stored candidate's first parent, read once per run version in pages, so that a
    lineage walks it without a query per step."""

    def read() -> FirstParents:
        ids: list[np.ndarray] = []
        parents: list[np.ndarray] = []
        for rows in run.store.columns(("id", "parent_ids")):
            ids.append(np.asarray([r[0] for r in rows], np.int64))
            parents.append(np.asarray([first_parent_id(p) for _, p in rows], np.int64))
            if run.on_read is not None:
                run.on_read(int(ids[-1][-1]) + 1, run.store.last_id() + 1)
        return FirstParents(*(np.concatenate(a) if a else np.zeros(0, np.int64) for a in (ids, parents)))

    return run.memo("first_parents", read)


def ancestors(parents: FirstParents, candidate_id: int) -> tuple[list[int], int]:
    """The chain from ``candidate_id`` back along first parents, newest first, and the first
    ancestor the store does not hold (an elites-only store), or -1. The chain is empty when
    the store does not hold ``candidate_id``."""
    chain, at = [], int(candidate_id)
    while at >= 0 and (parent := parents.of(at)) != -2:  # parents are stored before their children: no cycles
        chain.append(at)
        at = parent
    return chain, at if chain else -1


def diff(old: str, new: str, old_name: str = "parent", new_name: str = "child") -> str:
    """The unified diff from ``old`` to ``new`` ("" when equal)."""
    return "".join(
        difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), old_name, new_name)
    )


def parent_diff(run: RunDir, candidate: Any) -> str | None:
    """The diff of a text candidate from its first parent (None for founders, vectors, missing
    parents and children with no text: an answer with no code block is not a deletion)."""
    if candidate.kind != "text" or candidate.text is None or not candidate.parent_ids:
        return None
    try:
        (parent,) = run.store.get([candidate.parent_ids[0]])
    except KeyError:
        return None
    return diff(parent.text or "", candidate.text, f"#{parent.id}", f"#{candidate.id}")
