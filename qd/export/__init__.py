"""``qd export``: a finished (or running) run as a training or analysis dataset.

A run's store holds every candidate with the prompt that made it, the model's answer
and the evaluator's verdict; ``export`` turns it into rows of one *kind* and writes
them in one *format*, without ever writing to the run:

- kinds (``KINDS``): ``elites`` (the archive), ``sft`` (prompt/completion pairs),
  ``dpo``, ``trace`` (one record per child, OpenEvolve's evolution trace),
  ``diverse``, ``trajectory``; each a module ``qd.export.<kind>`` with ``COLUMNS``
  (name -> type, see ``formats.TYPES``), ``OPTIONS`` (name -> default) and
  ``rows(run, options)``, a deterministic, streaming iterator of rows;
- formats (``formats.FORMATS``): ``jsonl``, ``parquet``, ``hf`` (a Hugging Face
  ``datasets`` folder), each written beside a dataset card (``card.py``).

Kinds are imported by name on use, so a kind is added by adding its file.
See docs/export.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

KINDS = ("elites", "sft", "dpo", "trace", "diverse", "trajectory")


def kind_module(kind: str) -> Any:
    """The module of ``kind``; ValueError (one line) for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: unknown; use one of {', '.join(KINDS)}")
    try:
        return importlib.import_module(f"{__name__}.{kind}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{kind}":
            raise
        raise ValueError(f"kind {kind!r} is not available in this version of qd") from None


def resolve(module: Any, kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """The kind's defaults updated with ``options``; ValueError naming an unknown option."""
    unknown = sorted(set(options) - set(module.OPTIONS))
    if unknown:
        known = ", ".join(module.OPTIONS) or "none"
        raise ValueError(f"{kind}: unknown option {unknown[0]!r}; its options are {known}")
    return {**module.OPTIONS, **options}


def default_out(run_dir: str | Path, kind: str, fmt: str) -> Path:
    """``./qd-export/<run name>.<kind>.<ext>`` (``hf`` is a folder, without an extension)."""
    from qd.export.formats import EXTENSIONS

    return Path("qd-export") / f"{Path(run_dir).resolve().name}.{kind}{EXTENSIONS[fmt]}"


def write(
    run_dir: str | Path,
    kind: str,
    fmt: str = "jsonl",
    out: str | Path | None = None,
    options: dict[str, Any] | None = None,
    progress: Any = None,
) -> tuple[Path, int]:
    """What :func:`export` does, also returning the row count. ``progress`` (the command
    line's bar) is told ``rows(n)`` as rows are written and ``read(candidates read,
    candidates stored)`` as the store is scanned."""
    from qd.export import card, formats
    from qd.rundir import RunDir

    if fmt not in formats.FORMATS:
        raise ValueError(f"format {fmt!r}: unknown; use one of {', '.join(formats.FORMATS)}")
    formats.require(fmt)
    module = kind_module(kind)
    opts = resolve(module, kind, options or {})
    out = Path(out) if out is not None else default_out(run_dir, kind, fmt)
    run_path = Path(run_dir).resolve()
    if out.resolve() == run_path or run_path in out.resolve().parents:
        raise ValueError(
            f"out {out}: inside the run directory {run_dir}, which export never writes to; "
            "pass a path outside it"
        )
    with RunDir(run_dir) as run:
        rows = module.rows(run, opts)
        if progress is not None:
            run.on_read = progress.read
            rows = _counted(rows, progress.rows)
        out.parent.mkdir(parents=True, exist_ok=True)
        count = formats.write(fmt, module.COLUMNS, rows, out)
        card.write(card.path(out, fmt), run, kind, fmt, opts, module.COLUMNS, count)
    return out, count


def export(
    run_dir: str | Path, kind: str, fmt: str = "jsonl", out: str | Path | None = None, **options: Any
) -> Path:
    """Writes the rows of ``kind`` (one of ``KINDS``) for the run in ``run_dir`` to ``out``
    as ``fmt`` (``jsonl``, ``parquet`` or ``hf``), with its dataset card, and returns ``out``.

    ``options`` are the kind's (its module's ``OPTIONS``); ``out`` defaults to
    ``./qd-export/<run name>.<kind>.<ext>``.

    Raises:
        ValueError: an unknown kind, format or option, a bad option value, a kind that
            does not apply to this run, or an ``out`` inside the run directory.
        qd.rundir.RunDirError: ``run_dir`` is not a run directory.
    """
    return write(run_dir, kind, fmt, out, options)[0]


def _counted(rows: Iterable[dict], progress: Callable[[int], None]) -> Iterator[dict]:
    n = 0
    for n, row in enumerate(rows, 1):
        yield row
        progress(n)
