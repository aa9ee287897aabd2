"""Where the config tree and experiments live, in a source checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    # Installed wheel: conf/ and experiments/ ship inside the qd package.
    # Source checkout: they sit beside qd/.
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"qd: cannot find the {name}/ folder near {_PACKAGE}")


def conf_dir() -> Path:
    return _find("conf")


def experiments_dir() -> Path:
    return _find("experiments")
