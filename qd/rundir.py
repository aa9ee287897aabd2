"""A run directory, read-only: what ``qd show``, ``lineage``, ``stats``, ``compare``, ``plot``
and ``explore`` read, during a run or after it.

A run directory holds ``config.yaml``, ``archive.json`` (the archive's geometry,
written when the run is built), ``centroids.npy`` (CVT), ``store.sqlite`` (every
candidate), ``events.jsonl`` and ``checkpoints/checkpoint.npz``. The archive a
reader sees is the one ``qd-run resume=`` would rebuild: the last checkpoint plus
the store rows after it, replayed into a copy. Nothing here writes to the run:
the store is opened read-only and the replayed archive lives in memory, so a
reader can watch a run in progress and never disturbs it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

GEOMETRY = "archive.json"
ELITES = "elites.jsonl"
# The fence language of a text genome kind -> the extension of ``best.<ext>``.
EXTENSIONS = {"python": "py", "json": "json", "text": "txt"}


class RunDirError(FileNotFoundError):
    """A path that is not a readable run directory (the message says what to pass)."""


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The archive's shape, saved with the run so a reader needs neither the task nor the plan.

    Attributes:
        kind: ``grid``, ``cvt`` or ``novelty``.
        islands: the island count (the archive's leading axis).
        cells: cells per island (a novelty archive's capacity).
        dim: descriptor dimensions.
        bins, lower, upper: per axis (bins only mean something for a grid).
        axes: a name per descriptor axis.
        own_cells: a CVT whose centroids the describer fits (saved in the checkpoint).
        learning_rate, threshold_min: the archive's CMA-MAE settings (replay needs them).
        novelty: a novelty archive's ``k``, ``threshold`` and ``local_competition``.
        genome: the text genome kind (``program``, ``agent``, ...), or None for vectors.
        loop: ``host`` or ``device``.
    """

    kind: str
    islands: int
    cells: int
    dim: int
    bins: tuple[int, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    axes: tuple[str, ...]
    own_cells: bool = False
    learning_rate: float = 1.0
    threshold_min: float = float("-inf")
    novelty: dict[str, Any] | None = None
    genome: str | None = None
    loop: str = "host"

    @classmethod
    def of_spec(cls, spec: Any, islands: int, genome: str | None) -> Geometry:
        """The geometry of a run built from Python objects: all of it is in the spec (a CVT's
        centroids are saved beside it, as ``centroids.npy``)."""
        dim, kind = int(spec.descriptor_dim), spec.kind
        bins, lower, upper, novelty = (), (0.0,) * dim, (1.0,) * dim, None
        if kind == "grid":
            bins, lower, upper = tuple(map(int, spec.bins)), spec.lower, spec.upper
        elif kind == "cvt":
            c = np.asarray(spec.centroids)
            lower, upper = tuple(c.min(0)), tuple(c.max(0))
        else:
            novelty = {"k": spec.k, "threshold": spec.threshold, "local_competition": spec.local_competition}
        return cls(
            kind=kind,
            islands=int(islands),
            cells=int(spec.num_cells),
            dim=dim,
            bins=bins,
            lower=tuple(map(float, lower)),
            upper=tuple(map(float, upper)),
            axes=tuple(f"d{i}" for i in range(dim)),
            learning_rate=float(spec.learning_rate),
            threshold_min=float(spec.threshold_min),
            novelty=novelty,
            genome=genome,
        )

    @classmethod
    def of_plan(cls, p: Any, spec: Any) -> Geometry:
        """The geometry of a planned run (``qd.plan.Plan``) whose tessellation is ``spec``."""
        a, g = p.cfg.archive, p.geometry
        novelty = (
            {
                "k": int(a.k),
                "threshold": float(a.novelty_threshold),
                "local_competition": bool(a.local_competition),
            }
            if a.kind == "novelty"
            else None
        )
        return cls(
            kind=a.kind,
            islands=int(p.cfg.islands.count),
            cells=int(spec.num_cells),
            dim=int(g.dim),
            bins=tuple(int(b) for b in g.bins) if g.bins else (),
            lower=tuple(map(float, g.lower)),
            upper=tuple(map(float, g.upper)),
            axes=axis_names(p),
            own_cells=bool(g.own_cells),
            learning_rate=float(spec.learning_rate),
            threshold_min=float(spec.threshold_min),
            novelty=novelty,
            genome=p.genome.name if p.genome is not None else None,
            loop=p.loop,
        )

    def save(self, run_dir: Path) -> None:
        (run_dir / GEOMETRY).write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Geometry:
        fields = json.loads((run_dir / GEOMETRY).read_text())
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def axis_names(p: Any) -> tuple[str, ...]:
    """A name per descriptor axis: the task's ``descriptor_names``, a describer's part axes, else ``d0, d1, ...``."""
    names = getattr(p.task, "descriptor_names", None)
    if p.describer is not None:
        names = []
        for part in getattr(p.describer, "parts", [p.describer]):
            axes = getattr(part, "axes", None)
            label = getattr(part, "name", type(part).__name__)
            names += (
                [getattr(a, "name", str(a)) for a in axes]
                if axes
                else [f"{label}{j}" for j in range(part.dim)]
            )
    names = list(names or [])
    return tuple(names) if len(names) == p.geometry.dim else tuple(f"d{j}" for j in range(p.geometry.dim))


class Snapshot(NamedTuple):
    """The archive as a resume would rebuild it, on the host.

    Attributes:
        fitness: f32[I, C] (NaN where empty).
        descriptor: f32[I, C, D].
        genome_id: i64[I, C], the store id of each cell's elite (-1 where empty).
        last_id: the newest store row reflected.
        checkpoint_id: the newest row the checkpoint held (-1: no checkpoint yet).
        evaluations: candidates in the store.
    """

    fitness: np.ndarray
    descriptor: np.ndarray
    genome_id: np.ndarray
    last_id: int
    checkpoint_id: int
    evaluations: int

    def filled(self, island: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(island, cell) index arrays of the filled cells (of one island when given)."""
        isl, cell = np.nonzero(self.genome_id >= 0)
        if island is not None:
            keep = isl == island
            isl, cell = isl[keep], cell[keep]
        return isl, cell


class RunDir:
    """A run directory opened read-only (see the module doc).

    Raises:
        RunDirError: ``path`` has no ``store.sqlite``, or neither ``config.yaml`` nor ``archive.json``.
    """

    def __init__(self, path: str | Path):
        from qd.store import Store

        self.path = Path(path)
        if not _is_run(self.path):
            described = (self.path / "config.yaml").is_file() or (self.path / GEOMETRY).is_file()
            missing = "store.sqlite" if described else "config.yaml"
            raise RunDirError(
                f"{self.path}: no {missing}; pass a run directory made by qd-run or qd.build "
                "(its path is printed as run_dir=... at the end of a run)"
            )
        self.store = Store(self.path / "store.sqlite", readonly=True)
        self._geometry: Geometry | None = None
        self._spec: Any = None
        self._memo: dict[str, tuple[tuple, Any]] = {}
        # Told (candidates read, candidates stored) as a scan of the store goes (``history.pages``):
        # the progress bar of a long export.
        self.on_read: Callable[[int, int], None] | None = None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self.path.name

    def config(self) -> Any:
        from omegaconf import OmegaConf

        return OmegaConf.load(self.path / "config.yaml")

    @property
    def geometry(self) -> Geometry:
        """The saved geometry; for a run from before ``archive.json``, planned from its config."""
        if self._geometry is None:
            if (self.path / GEOMETRY).is_file():
                self._geometry = Geometry.load(self.path)
            else:
                from omegaconf import OmegaConf

                from qd.config import Config
                from qd.plan import plan
                from qd.run import build_spec

                p = plan(OmegaConf.merge(OmegaConf.structured(Config), self.config()))
                self._geometry = Geometry.of_plan(p, build_spec(p, self.path))
        return self._geometry

    def events(self) -> list[dict[str, Any]]:
        """Every event of ``events.jsonl`` (a line still being written is left out)."""
        from qd import events

        path = self.path / "events.jsonl"
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the writer's current line
                continue
        return [events.upgrade(e) for e in out]

    # ----- the archive ------------------------------------------------------------

    def centroids(self) -> np.ndarray | None:
        """f32[C, D] CVT centroids (None for other archives, or a describer that has not fitted yet)."""
        g = self.geometry
        if g.kind != "cvt":
            return None
        if g.own_cells:
            from qd import checkpoint

            fitted = [
                v
                for k, v in checkpoint.load_arrays(self.path / "checkpoints").items()
                if k.startswith("describer.") and k.endswith("centroids")
            ]
            return np.asarray(fitted[0], np.float32) if fitted else None
        path = self.path / "centroids.npy"
        return np.load(path) if path.is_file() else None

    def spec(self) -> Any:
        """The run's tessellation (None: a describer's own CVT that has not fitted yet)."""
        if self._spec is None:
            from qd import archive

            g = self.geometry
            cma_mae = {"learning_rate": g.learning_rate, "threshold_min": g.threshold_min}
            if g.kind == "grid":
                self._spec = archive.GridSpec(g.bins, g.lower, g.upper, **cma_mae)
            elif g.kind == "novelty":
                n = g.novelty
                self._spec = archive.NoveltySpec(
                    g.cells, g.dim, n["k"], n["threshold"], n["local_competition"], **cma_mae
                )
            elif (c := self.centroids()) is not None:
                self._spec = archive.CVTSpec(c, **cma_mae)
        return self._spec

    def version(self) -> tuple:
        """What the run's readings depend on: the checkpoint and event files, the store's newest rows."""
        files = [self.path / "checkpoints" / "checkpoint.npz", self.path / "events.jsonl"]
        stats = tuple((s.st_mtime_ns, s.st_size) if (s := _stat(f)) else None for f in files)
        return stats, self.store.marks()

    def memo(self, key: str, compute: Any) -> Any:
        """``compute()``, kept until the run changes (:meth:`version`): a live reader
        recomputes only as the run writes."""
        version = self.version()
        hit = self._memo.get(key)
        if hit is None or hit[0] != version:
            hit = self._memo[key] = (version, compute())
        return hit[1]

    def snapshot(self) -> Snapshot:
        """The archive now: the last checkpoint plus the store rows after it, replayed as a
        resume does."""
        return self.memo("snapshot", self._rebuild)

    def _rebuild(self) -> Snapshot:
        import jax

        from qd import archive, checkpoint
        from qd.search import islands as island_ops

        g, spec = self.geometry, self.spec()
        evaluations = self.store.count()
        loaded = checkpoint.load(self.path / "checkpoints")
        state, counters = (loaded[0], loaded[2]) if loaded is not None else (None, {})
        checkpoint_id = int(counters.get("last_id", -1))
        last_id = checkpoint_id
        if spec is not None and counters.get("loop") != "device":  # the device loop stores at its checkpoints
            if state is None:
                state = archive.init(spec, g.islands)
            offers = self.store.placements(checkpoint_id, g.dim)
            if len(offers["id"]) or len(offers["reset"]):
                istate = island_ops.init(g.islands, g.cells)
                state, _, _ = island_ops.replay(spec, state, istate, offers)
                last_id = self.store.last_id()
        if state is None:  # nothing placed yet
            return Snapshot(
                np.full((g.islands, g.cells), np.nan, np.float32),
                np.zeros((g.islands, g.cells, g.dim), np.float32),
                np.full((g.islands, g.cells), -1, np.int64),
                -1,
                -1,
                evaluations,
            )
        fitness, descriptor, ids = (
            np.asarray(x) for x in jax.device_get((state.fitness, state.descriptor, state.genome_id))
        )
        ids = ids.astype(np.int64)
        return Snapshot(
            np.where(ids >= 0, fitness, np.nan).astype(np.float32),
            descriptor.astype(np.float32),
            ids,
            last_id,
            checkpoint_id,
            evaluations,
        )

    # ----- elites -------------------------------------------------------------------

    def placed(self, island: int | None = None, top: int | None = None) -> list[tuple[int, int, Any]]:
        """(island, cell, stored Candidate) of the archive's elites, best first (of one island when given)."""
        snap = self.snapshot()
        isl, cell = snap.filled(island)
        order = np.argsort(-snap.fitness[isl, cell], kind="stable")[:top]
        isl, cell = isl[order], cell[order]
        candidates = self.store.get(snap.genome_id[isl, cell].tolist())
        return [(int(i), int(k), c) for i, k, c in zip(isl, cell, candidates)]

    def elites(self, island: int | None = None, top: int | None = None) -> list[dict[str, Any]]:
        """The archive's elites, best first: each an :func:`elite_row` (of one island when given)."""
        snap = self.snapshot()
        return [elite_row(c, i, k, snap) for i, k, c in self.placed(island, top)]

    def best(self) -> dict[str, Any] | None:
        """The best elite (over every island), or None while the archive is empty."""
        top = self.elites(top=1)
        return top[0] if top else None


def _stat(path: Path) -> Any:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def elite_row(c: Any, island: int, cell: int, snap: Snapshot) -> dict[str, Any]:
    """One elite as ``elites.jsonl`` writes it: where it sits, its archive fitness and
    descriptor, and the stored candidate (genome, lineage, how it was made, its metrics)."""
    row = {
        "island": island,
        "cell": cell,
        "id": c.id,
        "fitness": float(snap.fitness[island, cell]),
        "descriptor": [float(x) for x in snap.descriptor[island, cell]],
        "genome": c.genome if c.kind == "text" else "vector",
        "parent_ids": list(c.parent_ids),
        "operator": c.operator,
        "model": c.model,
        "born_island": c.island,
        "metrics": c.metrics or {},
    }
    if c.kind == "text":
        row["text"] = c.text
    else:
        row["vector"] = [float(x) for x in c.vector]
    return row


def extension(genome: str) -> str:
    """``best.<ext>``'s extension for a genome kind: its fence language's (``json`` for vectors)."""
    if genome == "vector":
        return "json"
    import genomes

    try:
        return EXTENSIONS.get(genomes.get(genome).language, "txt")
    except ValueError:  # a kind registered by a task module not imported here
        return "txt"


def write_results(run_dir: Path) -> None:
    """Writes ``elites.jsonl`` (every elite, best first) and ``best.<ext>`` into ``run_dir``
    at the end of a run (the engine's last act on closing)."""
    with RunDir(run_dir) as run:
        rows = run.elites()
    tmp = run_dir / (ELITES + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(run_dir / ELITES)
    for old in run_dir.glob("best.*"):
        old.unlink()
    if not rows:
        return
    best = rows[0]
    path = run_dir / f"best.{extension(best['genome'])}"
    if "text" in best:
        path.write_text(best["text"] if best["text"].endswith("\n") else best["text"] + "\n")
    else:
        path.write_text(
            json.dumps(
                {k: best[k] for k in ("id", "fitness", "descriptor", "vector", "island", "cell")}, indent=1
            )
            + "\n"
        )


def written_best(run_dir: Path) -> dict[str, Any] | None:
    """The best elite :func:`write_results` wrote, with ``path``: its ``best.<ext>`` (None: an empty archive)."""
    path = run_dir / ELITES
    first = path.read_text().partition("\n")[0] if path.is_file() else ""
    if not first:
        return None
    best = json.loads(first)
    return {**best, "path": str(run_dir / f"best.{extension(best['genome'])}")}


def runs_in(path: str | Path) -> list[Path]:
    """The run directories ``path`` names: itself, or for a Hydra multirun folder (``qd-run
    -m ...``) its numbered runs ``0/``, ``1/``, ... in number order (what ``qd compare`` and
    ``qd plot`` accept in place of a run).

    Raises:
        RunDirError: ``path`` is neither a run directory nor a folder of them.
    """
    path = Path(path)
    if _is_run(path):
        return [path]
    runs = (
        sorted((p for p in path.iterdir() if p.name.isdigit() and _is_run(p)), key=lambda p: int(p.name))
        if path.is_dir()
        else []
    )
    if not runs:
        raise RunDirError(
            f"{path}: neither a run directory (no config.yaml and store.sqlite) nor a multirun "
            "folder (no numbered run folders 0/, 1/, ...); pass a run directory made by qd-run"
        )
    return runs


def _is_run(path: Path) -> bool:
    """A store, and how to read it: the config (``qd-run``) or the archive's geometry (``qd.build``
    from Python objects, which has no config)."""
    described = (path / "config.yaml").is_file() or (path / GEOMETRY).is_file()
    return described and (path / "store.sqlite").is_file()


# Overrides that do not make a setting: the seed (runs that differ only in it repeat one
# setting), and Hydra's own.
_NOT_SETTING = re.compile(r"[+~]*(seed|hydra\.[^=]*)=")


def setting(path: str | Path) -> list[str] | None:
    """The setting a run was started with: its command-line overrides (Hydra's
    ``.hydra/overrides.yaml``) less the seed and Hydra's own; None for a run made
    without Hydra's files (by the Python API)."""
    file = Path(path) / ".hydra" / "overrides.yaml"
    if not file.is_file():
        return None
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(file) if not _NOT_SETTING.match(str(o))]
