"""Behaviour descriptors: an evaluated candidate -> where it lands in the archive.

Kinds: ``code_metrics`` (AST), ``embedding`` (sentence-transformers, projected or
raw), ``ai_feedback`` (an LLM judge scores named axes, QDAIF) and ``learned``
(a projection trained from similarity judgments, QDHF). ``make_descriptor``
builds one from its config; ``Combined`` puts several side by side.
"""

from __future__ import annotations

from typing import Any

from descriptors.base import Combined, Described, Descriptor, Item, is_fitted_kind
from qd.contract import ConfigError

KINDS = ("code_metrics", "embedding", "ai_feedback", "learned")
_AXIS_TEXTS = ("name", "question", "low", "high")


def make_descriptor(kind: str, params: dict[str, Any], seed: int = 0, cvt_cells: int = 0) -> Descriptor:
    """One descriptor from its config part (``conf/descriptor/*.yaml``).

    ``cvt_cells`` > 0 asks a raw-embedding descriptor to fit that many CVT
    centroids in embedding space (``archive=cvt``). Raises ConfigError naming the
    field relative to the part (``projection``, ``axes[1].question``); a builder
    puts it under ``descriptor.parts[i]``.
    """
    if kind == "code_metrics":
        from descriptors.code_metrics import CodeMetricsDescriptor

        return CodeMetricsDescriptor(params["metrics"], params["lower"], params["upper"])
    if kind == "embedding":
        from descriptors.embedding import EmbeddingDescriptor

        if params["projection"] not in ("pca", "random", "none"):
            raise ConfigError("projection", f"unknown {params['projection']!r}", "use pca, random or none")
        refit_at = tuple(params["refit_at"]) or (8,)
        if params["projection"] == "none" and not cvt_cells:
            refit_at = ()  # the raw embedding needs no fit (novelty archive)
        from descriptors.embedding import load_reference

        reference = load_reference(params["reference"]) if params.get("reference") else None
        return EmbeddingDescriptor(
            projection=params["projection"],
            dims=params["dims"],
            refit_at=refit_at,
            seed=seed,
            cells=cvt_cells or 64,
            reference=reference,
        )
    if kind == "ai_feedback":
        from descriptors.ai_feedback import RESCALES, AIFeedbackDescriptor, Axis

        _check_axes(params["axes"])
        axes = [
            Axis(
                a["name"],
                a["question"],
                a["low"],
                a["high"],
                a["bins"],
                tuple((e["text"], e["position"]) for e in a.get("examples") or ()),
            )
            for a in params["axes"]
        ]
        rescale = params.get("rescale") or "minmax"
        if rescale not in RESCALES:
            raise ConfigError("rescale", f"unknown {rescale!r}", f"use one of {list(RESCALES)}")
        return AIFeedbackDescriptor(
            axes, model=params["model"], rescale_at=tuple(params.get("rescale_at") or ()), rescale=rescale
        )
    if kind == "learned":
        from descriptors.learned import LearnedDescriptor

        if params["judge"] not in ("llm", "human"):
            raise ConfigError("judge", f"unknown {params['judge']!r}", "use llm or human")
        return LearnedDescriptor(
            dims=params["dims"],
            refit_at=tuple(params["refit_at"]) or (100, 200, 400),
            fit_after=tuple(params["fit_after"]) or None,
            judge=params["judge"],
            seed=seed,
        )
    raise ConfigError("kind", f"unknown descriptor {kind!r}", f"use one of {list(KINDS)}")


def _check_axes(axes: list[dict[str, Any]]) -> None:
    """The AI-feedback axes of a config part, checked with their config names (``axes[1].question``)."""
    if not axes:
        raise ConfigError("axes", "is empty", "name at least one axis (name, question, low, high)")
    for i, a in enumerate(axes):
        for field in _AXIS_TEXTS:
            if not str(a[field]).strip():
                raise ConfigError(f"axes[{i}].{field}", "is empty", f"give the axis a {field}")
        if a["bins"] < 1:
            raise ConfigError(f"axes[{i}].bins", f"is {a['bins']}", "use at least 1")
        for j, e in enumerate(a.get("examples") or ()):
            if not 0.0 <= e["position"] <= 1.0:
                raise ConfigError(
                    f"axes[{i}].examples[{j}].position",
                    f"{e['position']} is outside [0, 1]",
                    "give 0 for the low end and 1 for the high end",
                )
    names = [a["name"] for a in axes]
    if len(set(names)) != len(names):
        raise ConfigError("axes", f"names repeat in {names}", "make them unique")


def axis_bins(kind: str, params: dict[str, Any], dim: int) -> list[int]:
    """Grid bins per axis of one part: its ``bins``, the AI-feedback axes' bins, or 10 each."""
    if params.get("bins"):
        if len(params["bins"]) != dim:
            raise ConfigError("bins", f"has {len(params['bins'])} entries for {dim} axes", f"give {dim}")
        return [int(b) for b in params["bins"]]
    if kind == "ai_feedback":
        return [int(a["bins"]) for a in params["axes"]]
    return [10] * dim


__all__ = [
    "Combined",
    "Described",
    "Descriptor",
    "Item",
    "KINDS",
    "axis_bins",
    "is_fitted_kind",
    "make_descriptor",
]
