"""``EvaluationResult`` as OpenEvolve's evaluators build it: metrics and artifacts."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class EvaluationResult:
    metrics: dict[str, Any]
    artifacts: dict[str, Any] = dataclasses.field(default_factory=dict)
