"""The tree stays lint-clean and formatted (ruff, configured in pyproject.toml), so a size cap is met by
moving a responsibility elsewhere, never by packing lines past the line length."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    """The ruff of this interpreter's environment: the test extra installs it as a module and a script."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    script = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("ruff is not installed: install the test extra (pip install -e '.[test]')", pytrace=False)
    return [script]


@pytest.mark.parametrize(
    "command",
    [["check", "--no-cache", "--output-format", "concise", "."], ["format", "--check", "--no-cache", "."]],
    ids=["check", "format"],
)
def test_ruff_passes(command):
    # from the root, so pyproject.toml's [tool.ruff] applies; --no-cache: the suite writes nothing there
    proc = subprocess.run([*ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"ruff {' '.join(command)} failed:\n{proc.stdout}{proc.stderr}", pytrace=False)
