"""Atomic checkpoints: archive, RNG key, counters (and fitted descriptor state) in one ``.npz``.

Written to a temporary file, fsynced, then renamed over the old one (and the
directory fsynced), so a crash leaves either the old or the new checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from qd.archive import ArchiveState, ParetoState
from qd.errors import CheckpointError
from qd.rundir.layout import CHECKPOINT as FILE

_EXTRA = "extra."


def save(
    directory: Path,
    state: ArchiveState,
    key: jax.Array,
    counters: dict[str, Any],
    arrays: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes the checkpoint; ``arrays`` (e.g. a fitted projection) are read back by :func:`load_arrays`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    buffer = io.BytesIO()
    np.savez(
        buffer,
        **{f"archive.{k}": np.asarray(v) for k, v in state._asdict().items()},
        key=np.asarray(jax.random.key_data(key)),
        counters=np.frombuffer(json.dumps(counters).encode(), np.uint8),
        **{f"{_EXTRA}{k}": np.asarray(v) for k, v in (arrays or {}).items()},
    )
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _corrupt(path: Path, e: BaseException) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt ({type(e).__name__}: {e}); delete it to "
        "resume by replaying the store from the start"
    )


# The archive states a checkpoint may hold, told apart by their saved fields.
STATES = (ArchiveState, ParetoState)


def load(directory: Path) -> tuple[ArchiveState | ParetoState, jax.Array, dict[str, Any]] | None:
    """The last checkpoint in ``directory``, or None if there is none."""
    path = directory / FILE
    if not path.exists():
        return None
    try:
        with np.load(path) as data:
            kind = next(s for s in STATES if all(f"archive.{k}" in data.files for k in s._fields))
            state = kind(**{k: jax.numpy.asarray(data[f"archive.{k}"]) for k in kind._fields})
            key = jax.random.wrap_key_data(data["key"])
            counters = json.loads(data["counters"].tobytes().decode())
    except (OSError, KeyError, StopIteration, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise _corrupt(path, e) from None
    return state, key, counters


def load_arrays(directory: Path) -> dict[str, np.ndarray]:
    """The ``arrays`` saved with the last checkpoint ({} if none)."""
    path = directory / FILE
    if not path.exists():
        return {}
    try:
        with np.load(path) as data:
            return {k[len(_EXTRA) :]: data[k] for k in data.files if k.startswith(_EXTRA)}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise _corrupt(path, e) from None


def part(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays under ``prefix`` (``describer.``, ``bandit.J.``, ``islands.``, ``curiosity.``),
    unprefixed."""
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
