"""qd: quality-diversity search with a JAX archive and LLM operators.

Your own problem in one call: ``qd.optimize`` (``qd.optimizer``). The Python API
(``qd.api``): ``qd.compose`` a config with the CLI's names,
``qd.build`` the run, ``engine.run()``, then ``qd.elites(run_dir)``. The
functional archive is ``qd.archive`` (``init`` / ``insert`` / ``elites``).
Names are imported on first use, so ``import qd`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "compose": "qd.api",
    "plan": "qd.api",
    "build": "qd.api",
    "elites": "qd.api",
    "Elite": "qd.api",
    "Engine": "qd.loop",
    "Budget": "qd.budget",
    "Settings": "qd.api",
    "StopRules": "qd.stop_rules",
    "Run": "qd.api",
    "optimize": "qd.optimizer",
    "OptimizeResult": "qd.optimize_result",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'qd' has no attribute {name!r}")
