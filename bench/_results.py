"""Writing one benchmark's section into bench/RESULTS.md, leaving the others alone."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, title: str, section: str) -> None:
    """Adds or replaces the section headed ``title``, leaving the rest of the file alone."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == title)
    except StopIteration:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        new_lines = lines[:start] + section.rstrip("\n").splitlines() + (
            [""] + lines[end:] if end < len(lines) else [])
        new = "\n".join(new_lines) + "\n"
    path.write_text(new)

