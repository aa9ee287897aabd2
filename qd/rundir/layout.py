"""The run directory's format: its file names, the archive's geometry, and the spec a geometry makes.

Every other part of ``qd.rundir`` (and so every part of qd that touches a run
directory) names a file through the constants here, and every archive spec of a
run -- the one the engine inserts into and the one a reader replays into -- comes
from :func:`spec_of`, so the writer and the readers cannot disagree on the cells.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

CONFIG = "config.yaml"  # the resolved config: what ``qd-run resume=RUN_DIR`` reads
OPTIMIZE = "optimize.json"  # a run made by ``qd.optimize`` (``qd-run resume=`` refuses it: see qd.optimizer)
GEOMETRY = "archive.json"  # the archive's geometry (:class:`Geometry`)
CENTROIDS = "centroids.npy"  # a CVT's fixed centroids, so a resume reuses the same cells
STORE = "store.sqlite"  # every candidate, its LLM calls, migrations and side tables
EVENTS = "events.jsonl"  # one JSON event per commit, refit, rotation, reset, meta turn
CHECKPOINTS = "checkpoints"  # the folder of the checkpoint
CHECKPOINT = "checkpoint.npz"  # in ``checkpoints/``: the run's state at its last checkpoint
ELITES = "elites.jsonl"  # every elite at the end, best first
BEST = "best"  # ``best.<ext>``: the best elite's genome at the end
LLM_CACHE = "llm_cache"  # the LLM response cache of a run with ``llm.cache``
LLM_SERVER_LOG = "llm_server.log"  # the embedded llama.cpp server's log (``llm.provider=local``)
RAY = "ray.jsonl"  # runner=ray: a line per session, the evaluations each node ran (``RaySandbox.close``)
HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"  # the command line of a run started by Hydra


class RunDirError(FileNotFoundError):
    """A path that is not a readable run directory (the message says what to pass)."""


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The archive's shape, saved with the run so a reader needs neither the task nor the plan.

    Attributes:
        kind: ``grid``, ``cvt`` or ``novelty``: the cells (of a Pareto archive's fronts too).
        islands: the island count (the archive's leading axis).
        cells: cells per island (a novelty archive's capacity).
        dim: descriptor dimensions.
        bins, lower, upper: per axis (bins only mean something for a grid).
        axes: a name per descriptor axis.
        own_cells: a CVT whose centroids the describer fits (saved in the checkpoint).
        thresholds: the spec's CMA-MAE settings by their names in ``qd.archive``
            (``qd.archive.thresholds``): a reader's spec and a replay need them.
        novelty: a novelty archive's ``k``, ``threshold`` and ``local_competition``.
        genome: the text genome kind (``program``, ``agent``, ...), or None for vectors.
        loop: ``host`` or ``device``.
        pareto: a Pareto archive's ``front_size``, its task's ``objectives`` ([name,
            direction] pairs: a reader turns stored metrics into the archive's values
            without the task) and the hypervolume ``reference`` (None: derived); None
            for one elite per cell.
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
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    novelty: dict[str, Any] | None = None
    genome: str | None = None
    loop: str = "host"
    pareto: dict[str, Any] | None = None

    @property
    def objectives(self) -> tuple[tuple[str, str], ...]:
        """The task's objectives a Pareto archive holds (``qd.task.objectives_of``); () for a
        single-objective archive."""
        return tuple(tuple(o) for o in self.pareto["objectives"]) if self.pareto else ()

    @classmethod
    def of_spec(
        cls,
        spec: Any,
        islands: int,
        genome: str | None,
        axes: tuple[str, ...],
        objectives: tuple[tuple[str, str], ...] = (),
    ) -> Geometry:
        """The geometry of a run built from Python objects (``qd.build`` with parts): all of it but
        the ``axes``' names and a Pareto archive's ``objectives`` is in the spec (a CVT's
        centroids are saved beside it, as ``centroids.npy``)."""
        from qd import archive

        pareto = None
        if spec.kind == "pareto":
            pareto = fronts(spec.front_size, objectives, None)
            spec = spec.cells
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
            axes=tuple(axes),
            thresholds=archive.thresholds(spec),
            novelty=novelty,
            genome=genome,
            pareto=pareto,
        )

    def save(self, run_dir: Path) -> None:
        (run_dir / GEOMETRY).write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Geometry:
        """The saved geometry.

        Raises:
            RunDirError: a run from before qd saved it; resuming the run once writes it (every
                build of a run, a resume included, saves its geometry).
        """
        path = run_dir / GEOMETRY
        if not path.is_file():
            raise RunDirError(
                f"{run_dir}: no {GEOMETRY} (a run from before qd saved its archive's geometry); "
                f"`qd-run resume={run_dir}` writes it"
            )
        fields = json.loads(path.read_text())
        from qd.archive import CMA_MAE

        # a geometry written before the settings were grouped has them as fields of their own
        grouped = {k: float(fields.pop(k)) for k in CMA_MAE if k in fields}
        fields["thresholds"] = {**grouped, **fields.get("thresholds", {})}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def fronts(front_size: int, objectives: Any, reference: Any) -> dict[str, Any]:
    """:attr:`Geometry.pareto` of a Pareto archive."""
    return {
        "front_size": int(front_size),
        "objectives": [[str(name), str(direction)] for name, direction in objectives],
        "reference": None if reference is None else [float(r) for r in reference],
    }


def spec_of(g: Geometry, centroids: np.ndarray | None) -> Any:
    """The archive spec of ``g``; a CVT's cells are ``centroids`` (None: no spec yet, a
    describer's own CVT that has not fitted)."""
    from qd import archive

    cells = _cells_of(g, centroids)
    if g.pareto is None or cells is None:
        return cells
    return archive.ParetoSpec(cells, g.pareto["front_size"], len(g.objectives))


def _cells_of(g: Geometry, centroids: np.ndarray | None) -> Any:
    from qd import archive

    cma_mae = g.thresholds
    if g.kind == "grid":
        return archive.GridSpec(tuple(g.bins), tuple(g.lower), tuple(g.upper), **cma_mae)
    if g.kind == "novelty":
        n = g.novelty
        return archive.NoveltySpec(g.cells, g.dim, n["k"], n["threshold"], n["local_competition"], **cma_mae)
    if centroids is None:
        return None
    return archive.CVTSpec(centroids, **cma_mae)


def is_run(path: Path) -> bool:
    """``path`` holds a run's store and how to read it: its config (``qd-run``) or its archive's
    geometry (``qd.build`` from Python objects, which has no config); finished or not."""
    return described(path) and (path / STORE).is_file()


def described(path: Path) -> bool:
    """``path`` holds a run's config or its archive's geometry."""
    return (path / CONFIG).is_file() or (path / GEOMETRY).is_file()


def runs_in(path: str | Path) -> list[Path]:
    """The run directories ``path`` names: itself, or for a Hydra multirun folder (``qd-run
    -m ...``) its numbered runs ``0/``, ``1/``, ... in number order (what ``qd compare`` and
    ``qd plot`` accept in place of a run).

    Raises:
        RunDirError: ``path`` is neither a run directory nor a folder of them.
    """
    path = Path(path)
    if is_run(path):
        return [path]
    runs = (
        sorted((p for p in path.iterdir() if p.name.isdigit() and is_run(p)), key=lambda p: int(p.name))
        if path.is_dir()
        else []
    )
    if not runs:
        raise RunDirError(
            f"{path}: neither a run directory (no {CONFIG} and {STORE}) nor a multirun "
            "folder (no numbered run folders 0/, 1/, ...); pass a run directory made by qd-run"
        )
    return runs


# Overrides that do not make a setting: the seed (runs that differ only in it repeat one
# setting), and Hydra's own.
_NOT_SETTING = re.compile(r"[+~]*(seed|hydra\.[^=]*)=")


def setting(path: str | Path) -> list[str] | None:
    """The setting a run was started with: its command-line overrides (Hydra's
    ``.hydra/overrides.yaml``) less the seed and Hydra's own; None for a run made
    without Hydra's files (by the Python API)."""
    file = Path(path) / HYDRA_OVERRIDES
    if not file.is_file():
        return None
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(file) if not _NOT_SETTING.match(str(o))]
