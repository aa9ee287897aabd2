"""The run directory: its format has one owner, this package.

A run directory holds ``config.yaml`` (the resolved config), ``archive.json`` (the
archive's geometry), ``centroids.npy`` (a CVT's fixed centroids), ``store.sqlite``
(every candidate), ``events.jsonl``, ``checkpoints/checkpoint.npz`` and, at the
end, ``elites.jsonl`` and ``best.<ext>``. Each job on it is one module:

* ``layout``: the file names, the archive's :class:`Geometry`, and the spec a geometry
  makes (``spec_of``: the engine's archive and a reader's are the same cells);
* ``founding``: ``create``, the founding files, written by the builder at each build (a resume too);
* ``checkpoint``: the atomic ``checkpoint.npz``;
* ``replay``: the store's rows after a checkpoint, inserted into it -- the engine's
  resume and a reader's :class:`Snapshot` call the same function;
* ``reader``: :class:`RunDir`, the run opened read-only (it never writes);
* ``results``: the end-of-run files.

A run from before qd saved ``archive.json`` is refused by ``Geometry.load`` (the one
place), with the command that writes it: resuming the run builds it, and every build
saves its geometry.
"""

from qd.rundir.founding import create
from qd.rundir.layout import Geometry, RunDirError, runs_in, setting
from qd.rundir.reader import RunDir
from qd.rundir.replay import Snapshot
from qd.rundir.results import write_results, written_best

__all__ = [
    "Geometry",
    "RunDir",
    "RunDirError",
    "Snapshot",
    "create",
    "runs_in",
    "setting",
    "write_results",
    "written_best",
]
