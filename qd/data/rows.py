"""A dataset's rows, from wherever a user keeps them: Python dicts, JSONL, CSV, Parquet, or a
``datasets`` folder saved with ``save_to_disk`` (the last two need the export extra).

Every source becomes the same list of :class:`Row`: an id (the ``id`` column, else the row's
position), the text the model is asked (``input``), the expected answer (``answer``) and the
whole row, so a callable metric can read other columns. Columns are checked once, here, so a
missing column is a one-line error before any model call.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qd.contract import ConfigError
from qd.extras import require

SAMPLES = Path(__file__).resolve().parent / "samples"


@dataclasses.dataclass(frozen=True)
class Row:
    """One example: ``id`` keys its per-row scores, ``fields`` is the row as loaded."""

    id: str
    input: str
    answer: Any
    fields: Mapping[str, Any]


def load_rows(source: Any, input: str = "input", answer: str = "answer") -> list[Row]:
    """The rows of ``source``: a list of dicts (or any iterable of them, a ``datasets.Dataset``
    included), the path of a ``.jsonl``/``.json``, ``.csv`` or ``.parquet`` file or of a
    ``datasets`` folder, or the name of a dataset shipped in ``qd/data/samples`` (``arith60``).
    ``input`` and ``answer`` name the question and answer columns."""
    if isinstance(source, list) and source and all(isinstance(r, Row) for r in source):
        return source  # loaded already
    records = _records(source)
    if not records:
        raise ConfigError("dataset", "has no rows", "give at least one row (a dict per example)")
    for name, column in (("input", input), ("answer", answer)):
        lacking = next((i for i, r in enumerate(records) if column not in r), None)
        if lacking is not None:
            has = sorted(records[lacking])
            raise ConfigError(
                name,
                f"row {lacking} of the dataset has no column {column!r} (its columns: {has})",
                f"name the {'question' if name == 'input' else 'expected answer'}'s column with "
                f"{name}=COLUMN",
            )
    return [Row(str(r.get("id", i)), str(r[input]), r[answer], dict(r)) for i, r in enumerate(records)]


def _records(source: Any) -> list[dict]:
    if isinstance(source, (str, Path)):
        return _read(_path(source))
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise ConfigError(
            "dataset",
            f"a {type(source).__name__} is not a dataset",
            "give a list of dicts, or the path of a .jsonl, .csv or .parquet file or a datasets folder",
        )
    records = list(source)
    bad = next((i for i, r in enumerate(records) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise ConfigError("dataset", f"row {bad} is a {type(records[bad]).__name__}", "give one dict per row")
    return [dict(r) for r in records]


def _path(source: str | Path) -> Path:
    """The file or folder ``source`` names; a bare name of a shipped sample is that sample's file."""
    path = Path(source).expanduser()
    sample = SAMPLES / f"{source}.jsonl"
    if not path.exists() and isinstance(source, str) and sample.is_file():
        return sample
    if not path.exists():
        shipped = sorted(p.stem for p in SAMPLES.glob("*.jsonl"))
        raise ConfigError(
            "dataset", f"no file or folder {path}", f"give an existing path, or a shipped dataset: {shipped}"
        )
    return path


def _read(path: Path) -> list[dict]:
    if path.is_dir():
        require("export", f"dataset {path} (a datasets folder)")
        import datasets

        return [dict(r) for r in datasets.load_from_disk(str(path))]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as f:
            text = f.read()
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if suffix == ".parquet":
        require("export", f"dataset {path} (Parquet)")
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ConfigError(
        "dataset",
        f"{path.name}: unknown format {suffix or '(no suffix)'!r}",
        "use a .jsonl, .json, .csv or .parquet file, or a folder saved by datasets' save_to_disk",
    )
