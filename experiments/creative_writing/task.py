"""Creative writing (QDAIF): evolve short poems and stories, judged and placed by AI feedback.

A genome is a ``text`` (data, never executed): a short poem or story of at most
``max_chars`` characters. Empty, whitespace-only and over-long texts are invalid,
with the reason.

- **Fitness**: the quality judge's score (``judges.QUALITY``, the run's model asked
  for one digit 0..9, expected digit under its logprobs, / 9), computed on the
  host by ``entry.py`` within the evaluation's model budget.
- **Descriptors**: the run's describer (``conf/experiment/creative_writing.yaml``:
  AI feedback on genre poem..story and tone sad..happy, bins placed at the judge's
  score quantiles). The task's own axes (used only with ``descriptor=task``) are
  line count and characters.
- **Initial archive**: the hand-written founders of ``seeds.py``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from qd.contract import ConfigError
from qd.task import Scored, Stage, load_module

_HERE = Path(__file__).resolve().parent
seeds = load_module(_HERE / "seeds.py", "experiments_creative_writing_seeds")


@dataclasses.dataclass
class CreativeWritingTask:
    max_chars: int = 600
    kind: str = "text"
    genome: str = "text"
    models: bool = True  # the quality judge is the run's model
    descriptor_dim: int = 2
    descriptor_names: ClassVar[tuple[str, ...]] = ("lines", "characters")

    def __post_init__(self) -> None:
        if self.max_chars < 40:
            raise ConfigError(
                "experiment.params.max_chars", f"is {self.max_chars}", "allow at least 40 characters"
            )
        self.host_entry = f"{_HERE / 'entry.py'}:run"
        self.description = (
            f"Write a short poem or a short story in English, at most {self.max_chars} characters. "
            "The score is its quality as judged by a language model: vivid, fresh and well made. "
            "Texts are also sorted by genre (poem or story) and tone (sad or happy); every kind is wanted."
        )
        self.stages = [Stage({"max_chars": self.max_chars}, name="quality")]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        """The founders, in order (then again)."""
        return [seeds.SEED_TEXTS[i % len(seeds.SEED_TEXTS)] for i in range(n)]

    def score(self, text: str, outputs: list[Any], trace: list[dict]) -> Scored:
        out = outputs[-1]
        if not isinstance(out, dict) or "quality" not in out:
            why = out.get("error") if isinstance(out, dict) else None
            return Scored(math.nan, None, False, error=why or "the entry returned no quality")
        lines = len([line for line in text.strip().splitlines() if line.strip()])
        metrics = {"quality": out["quality"], "chars": len(text.strip()), "lines": lines}
        return Scored(out["quality"], [lines, len(text.strip())], True, metrics)


def make_task(**params: Any) -> CreativeWritingTask:
    return CreativeWritingTask(**params)
