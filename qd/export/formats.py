"""The writers: rows of a kind (dicts with exactly its ``COLUMNS``) to a file or folder.

Every format gets the same typed values (:func:`convert`), so a row reads back the
same from each; and every writer is deterministic — the same run and options give
byte-identical files — so an export can be checked in, hashed or diffed:

- ``jsonl``: one JSON object per line, keys in column order, floats as Python
  writes them, NaN and infinities as null, ``json`` columns as JSON strings (keys sorted);
- ``parquet``: a fixed schema from ``COLUMNS``, written a row group at a time while the
  rows stream, zstd at a fixed level, no timestamps in the file;
- ``hf``: a Hugging Face ``datasets`` folder (``save_to_disk``) built from an arrow
  stream written the same way, with the hub switched off and no cache.

Each writer writes to ``<out>.tmp`` and renames it, so a failed export leaves no
half-written dataset under the name asked for.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from qd import extras

FORMATS = ("jsonl", "parquet", "hf")
EXTENSIONS = {"jsonl": ".jsonl", "parquet": ".parquet", "hf": ""}
NEEDS_EXTRA = ("parquet", "hf")  # the formats written with the export extra's packages
TYPES = (
    "string",
    "int64",
    "float64",
    "bool",
    "list<int64>",
    "list<float64>",
    "list<string>",
    "json",
    "messages",
)
ROW_GROUP = 1000  # parquet rows per row group: what the writer holds in memory


def require(fmt: str) -> None:
    """Raise :class:`~qd.extras.MissingExtra` when ``fmt`` needs the export extra and it is missing."""
    if fmt in NEEDS_EXTRA:
        extras.require("export", f"--format {fmt}")


def write(fmt: str, columns: dict[str, str], rows: Iterable[dict[str, Any]], out: Path) -> int:
    """Writes ``rows`` to ``out`` as ``fmt``; returns the row count."""
    bad = {name: t for name, t in columns.items() if t not in TYPES}
    if bad:
        raise ValueError(
            f"column {next(iter(bad))!r}: type {next(iter(bad.values()))!r} is not one of {TYPES}"
        )
    if out.is_dir() and not (fmt == "hf" and (out / "state.json").is_file()):  # never replace a user's folder
        raise ValueError(
            f"out {out}: is a folder that is not a dataset written by qd export; pass a new path"
        )
    typed = (typed_row(columns, row) for row in rows)
    tmp = out.with_name(out.name + ".tmp")
    _remove(tmp)
    try:
        count = {"jsonl": _jsonl, "parquet": _parquet, "hf": _hf}[fmt](columns, typed, tmp)
    except BaseException:  # a kind refuses the run, or the user pressed ^C: leave nothing half-written
        _remove(tmp)
        raise
    _remove(out)
    tmp.replace(out)
    return count


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def typed_row(columns: dict[str, str], row: dict[str, Any]) -> dict[str, Any]:
    """``row`` in column order, each value converted to its column's type."""
    if row.keys() != columns.keys():
        extra, missing = sorted(row.keys() - columns.keys()), sorted(columns.keys() - row.keys())
        raise ValueError(f"row with extra columns {extra} and missing columns {missing}")
    return {name: convert(t, row[name]) for name, t in columns.items()}


def convert(t: str, value: Any) -> Any:
    """``value`` as a column of type ``t`` holds it (None stays None: every column is nullable)."""
    if value is None:
        return None
    if t == "string":
        return str(value)
    if t == "int64":
        return int(value)
    if t == "float64":
        return _float(value)
    if t == "bool":
        return bool(value)
    if t == "json":
        from qd.views.render import plain

        return json.dumps(plain(value), sort_keys=True, ensure_ascii=False)
    if t == "messages":
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    item = t[len("list<") : -1]
    return [convert(item, v) for v in value]


def _float(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _jsonl(columns: dict[str, str], rows: Iterable[dict], path: Path) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for count, row in enumerate(rows, 1):
            f.write(json.dumps(row, sort_keys=False, ensure_ascii=False) + "\n")
    return count


def arrow_schema(columns: dict[str, str]) -> Any:
    import pyarrow as pa

    scalar = {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "json": pa.string(),
        "messages": pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
    }
    return pa.schema(
        [
            (name, scalar[t] if t in scalar else pa.list_(scalar[t[len("list<") : -1]]))
            for name, t in columns.items()
        ]
    )


def _tables(columns: dict[str, str], rows: Iterable[dict]) -> Iterator[Any]:
    """The rows as arrow tables of ``ROW_GROUP`` rows: what a writer holds in memory at once."""
    import pyarrow as pa

    from qd.export.rows import batched

    schema = arrow_schema(columns)
    for chunk in batched(rows, ROW_GROUP):
        yield pa.Table.from_pylist(chunk, schema=schema)


def _parquet(columns: dict[str, str], rows: Iterable[dict], path: Path) -> int:
    import pyarrow.parquet as pq

    count = 0
    # Fixed settings (codec, level, format version, page sizes by default): the same rows give the same bytes.
    with pq.ParquetWriter(
        path,
        arrow_schema(columns),
        compression="zstd",
        compression_level=3,
        version="2.6",
        write_statistics=True,
        use_dictionary=True,
    ) as writer:
        for table in _tables(columns, rows):
            writer.write_table(table, row_group_size=ROW_GROUP)
            count += table.num_rows
    return count


def features(columns: dict[str, str]) -> Any:
    """The ``datasets`` features of ``columns`` (the same types as :func:`arrow_schema`)."""
    from datasets import Features, List, Value

    scalar = {
        "string": Value("string"),
        "int64": Value("int64"),
        "float64": Value("float64"),
        "bool": Value("bool"),
        "json": Value("string"),
        "messages": List({"role": Value("string"), "content": Value("string")}),
    }
    return Features(
        {
            name: scalar[t] if t in scalar else List(scalar[t[len("list<") : -1]])
            for name, t in columns.items()
        }
    )


def _hf(columns: dict[str, str], rows: Iterable[dict], path: Path) -> int:
    import pyarrow as pa

    # Offline before datasets is imported: an export never reaches a hub.
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    count = 0
    with tempfile.TemporaryDirectory(prefix="qd-export-") as tmp:
        # An arrow stream file is what a Dataset memory-maps: no builder, no cache, no row held twice.
        stream = Path(tmp) / "rows.arrow"
        with pa.OSFile(str(stream), "wb") as sink, pa.ipc.new_stream(sink, arrow_schema(columns)) as writer:
            for table in _tables(columns, rows):
                writer.write_table(table)
                count += table.num_rows
        ds = datasets.Dataset.from_file(str(stream), info=datasets.DatasetInfo(features=features(columns)))
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # the command prints its own progress
        try:
            ds.save_to_disk(str(path), num_shards=1)  # one file, even for no rows (0 shards would not load)
        finally:
            if bars:
                datasets.enable_progress_bars()
    return count
