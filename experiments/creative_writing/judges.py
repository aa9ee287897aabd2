"""The quality judges and the labelled set they are checked against.

Two quality judges ask the run's model for one digit 0..9 through the AI-feedback
machinery (``descriptors.ai_feedback``: few-shot turns, expected digit under the
judge's logprobs). ``QUALITY`` is the fitness of every run (``entry.py``);
``HELD_OUT`` is worded differently, has other examples, and is never used during
a run: ``table.py`` re-scores the final archives with it, so a search that learnt
to please the first judge's wording shows up as a gap between the two scores.

``labels.json`` holds short texts written for this experiment with human labels
(0/1) for quality, genre (poem 0, story 1) and tone (sad 0, happy 1); none of them
is a few-shot example, a founder or a few-shot template text.

Each judge's AUC against them, with its 95 % bootstrap interval (``qd.judge_stats``), on the
embedded SmolLM2 (or ``--base-url``/``--model`` for any OpenAI-compatible server)::

    python experiments/creative_writing/judges.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from descriptors import Item, make_descriptor
from descriptors.ai_feedback import AIFeedbackDescriptor, Axis, agreement
from qd import judge_stats, tables
from qd.plan import compose

LABELS = Path(__file__).resolve().parent / "labels.json"

QUALITY = Axis(
    "quality",
    "How good is this short piece of writing?",
    "poor: dull, broken or repetitive",
    "excellent: vivid, fresh and well made",
    examples=(
        ("The snow came down and down and down and down and the snow came down.", 0.1),
        ("She folded the map along its old creases, as if the roads might remember her.", 0.9),
        ("I went to the shop. It was a shop. Then I came home.", 0.0),
    ),
)
HELD_OUT = Axis(
    "quality",
    "A literary critic rates the craft of this text.",
    "clumsy and flat",
    "masterful",
    examples=(
        ("Moonlight pooled in the well like a coin nobody dared to spend.", 1.0),
        ("good good day it is a good day day good.", 0.0),
        ("The dog was brown and the dog was nice and it was a dog.", 0.2),
    ),
)


def judge(axis: Axis, client: Any = None) -> AIFeedbackDescriptor:
    """A one-axis judge (0..9, one answer token, logprob expectation), the run's settings for ``axis``."""
    return AIFeedbackDescriptor([axis], client)


def labelled() -> list[dict]:
    """The labelled texts: ``{"text", "quality", "genre", "tone"}``, labels 0 or 1."""
    return json.loads(LABELS.read_text(encoding="utf-8"))


async def agreement_on_labels(
    client: Any, axes: AIFeedbackDescriptor, rows: list[dict] | None = None, held_out: bool = True
) -> dict:
    """Each judge's ``agreement`` with the labels: the run's quality judge, the held-out one (if
    ``held_out``) and each of ``axes``' axes (the run's descriptor), over ``rows`` (default: all
    labelled texts)."""
    rows = labelled() if rows is None else rows
    items = [Item(r["text"]) for r in rows]
    out = {}
    named = [
        ("quality", judge(QUALITY, client)),
        ("quality (held-out judge)", judge(HELD_OUT, client)),
        ("axes", axes),
    ]
    for name, d in named if held_out else named[::2]:
        d.attach(None, client)
        scores = await d.judge_scores(items)
        for j, axis in enumerate(d.axes):
            key = name if name != "axes" else axis.name
            labels = [r[axis.name] for r in rows]
            out[key] = {
                **agreement(scores.values[:, j], labels),
                **judge_stats.auc(scores.values[:, j], labels),  # an unanswered text counts as a tie
            }
    return out


def run_axes() -> AIFeedbackDescriptor:
    """The shipped config's axis judges (genre, tone), as a run builds them."""
    part = compose(["experiment=creative_writing"]).descriptor.parts[0]
    return make_descriptor("ai_feedback", OmegaConf.to_container(part, resolve=True))


async def measure(client: Any) -> dict:
    """Every judge (the run's quality judge, the held-out one, the axes) on every labelled text."""
    try:
        return await agreement_on_labels(client, run_axes())
    finally:
        await client.aclose()


if __name__ == "__main__":
    tables.measurement(measure, __doc__)
