"""The end-of-run files: ``elites.jsonl`` (every elite, best first) and ``best.<ext>`` (the best genome).

The engine's last act on closing is :func:`write_results`; ``qd-run`` then prints
what :func:`written_best` reads back. Both name the files through
``qd.rundir.layout`` and take the elites from a read-only ``RunDir``, so the files
hold exactly the archive any reader sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qd.rundir.layout import BEST, ELITES
from qd.rundir.reader import RunDir

# The fence language of a text genome kind -> the extension of ``best.<ext>``.
EXTENSIONS = {"python": "py", "json": "json", "text": "txt"}


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
    for old in run_dir.glob(f"{BEST}.*"):
        old.unlink()
    if not rows:
        return
    best = rows[0]
    path = run_dir / f"{BEST}.{extension(best['genome'])}"
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
    """The best elite :func:`write_results` wrote, with ``path``: its ``best.<ext>`` (None: an
    empty archive)."""
    path = run_dir / ELITES
    first = path.read_text().partition("\n")[0] if path.is_file() else ""
    if not first:
        return None
    best = json.loads(first)
    return {**best, "path": str(run_dir / f"{BEST}.{extension(best['genome'])}")}
