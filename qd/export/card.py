"""The dataset card written with every export: where the rows came from and what they hold.

A dataset outlives the run directory it came from; the card keeps the provenance a
reader needs to trust or reproduce it (run, experiment, seed, models, kind and options)
and the columns with their types. It is ``README.md`` inside an ``hf`` folder (where
the Hub and ``datasets`` look for it) and ``<out>.card.md`` beside a file.
It holds no timestamps, so the same export gives the same card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def path(out: Path, fmt: str) -> Path:
    return out / "README.md" if fmt == "hf" else out.with_name(out.name + ".card.md")


def write(
    where: Path, run: Any, kind: str, fmt: str, options: dict[str, Any], columns: dict[str, str], count: int
) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(run.config(), resolve=False)
    experiment = cfg.get("experiment") or {}
    models = [
        m.get("name") if isinstance(m, dict) else str(m) for m in (cfg.get("llm") or {}).get("models") or []
    ]
    used = sorted({m for page in run.store.columns(("model",)) for (m,) in page if m})
    lines = [
        f"# {run.name}: {kind}",
        "",
        f"Exported by `qd export --kind {kind} --format {fmt}` (see docs/export.md in qd).",
        "",
        "| | |",
        "|---|---|",
        f"| run directory | `{run.path.resolve()}` |",
        f"| experiment | {experiment.get('name', '-')} (task `{experiment.get('task', '-')}`) |",
        f"| seed | {cfg.get('seed', '-')} |",
        f"| genome | {run.geometry.genome or 'vector'} |",
        f"| models configured | {', '.join(map(str, models)) or '-'} |",
        f"| models that made candidates | {', '.join(used) or '-'} |",
        f"| candidates in the store | {run.store.count()} |",
        f"| kind | {kind} |",
        f"| options | `{json.dumps(options, sort_keys=True)}` |",
        f"| rows | {count} |",
        "",
        "## Columns",
        "",
        "| column | type |",
        "|---|---|",
        *(f"| {name} | {t} |" for name, t in columns.items()),
        "",
    ]
    where.write_text("\n".join(lines))
