"""Writing one benchmark's section into bench/RESULTS.md, leaving the others alone."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def versions(*packages: str) -> str:
    """``Python 3.11.7, jax 0.10.2, ...`` for the installed ``packages``."""
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for pkg in packages:
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def commit() -> str:
    """The checkout's commit, and whether the working tree differs from it."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        return f"`{sha}`" + (" plus the working tree" if dirty.strip() else "")
    except OSError:
        return "unknown"


def write_section(path: Path, title: str, section: str) -> None:
    """Adds or replaces the section headed ``title``, leaving the rest of the file alone."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == title)
    except StopIteration:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new_lines = (
            lines[:start]
            + section.rstrip("\n").splitlines()
            + ([""] + lines[end:] if end < len(lines) else [])
        )
        new = "\n".join(new_lines) + "\n"
    path.write_text(new)
