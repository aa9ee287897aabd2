"""Behaviour descriptors: an evaluated candidate -> where it lands in the archive.

Kinds: ``code_metrics`` (AST), ``embedding`` (sentence-transformers, projected or
raw), ``ai_feedback`` (an LLM judge scores named axes, QDAIF) and ``learned``
(a projection trained from similarity judgments, QDHF). ``make_descriptor``
builds one from its config; ``Combined`` puts several side by side.
"""

from __future__ import annotations

from typing import Any

from descriptors.base import Combined, Described, Descriptor, Item, is_fitted_kind

KINDS = ("code_metrics", "embedding", "ai_feedback", "learned")


def make_descriptor(kind: str, params: dict[str, Any], seed: int = 0, cvt_cells: int = 0) -> Descriptor:
    """One descriptor from its config part (``conf/descriptor/*.yaml``).

    ``cvt_cells`` > 0 asks a raw-embedding descriptor to fit that many CVT
    centroids in embedding space (``archive=cvt``). Raises ValueError("field: problem").
    """
    if kind == "code_metrics":
        from descriptors.code_metrics import CodeMetricsDescriptor

        return CodeMetricsDescriptor(params["metrics"], params["lower"], params["upper"])
    if kind == "embedding":
        from descriptors.embedding import EmbeddingDescriptor

        if params["projection"] not in ("pca", "random", "none"):
            raise ValueError(f"projection: unknown {params['projection']!r}; use pca, random or none")
        refit_at = tuple(params["refit_at"]) or (8,)
        if params["projection"] == "none" and not cvt_cells:
            refit_at = ()  # the raw embedding needs no fit (novelty archive)
        from descriptors.embedding import load_reference

        reference = load_reference(params["reference"]) if params.get("reference") else None
        return EmbeddingDescriptor(
            projection=params["projection"], dims=params["dims"], refit_at=refit_at, seed=seed,
            cells=cvt_cells or 64, reference=reference,
        )
    if kind == "ai_feedback":
        if not params["axes"]:
            raise ValueError("axes: is empty; name at least one axis (name, question, low, high)")
        from descriptors.ai_feedback import AIFeedbackDescriptor, Axis

        try:
            axes = [
                Axis(a["name"], a["question"], a["low"], a["high"], a["bins"],
                     tuple((e["text"], e["position"]) for e in a.get("examples") or ()))
                for a in params["axes"]
            ]
        except ValueError as e:
            raise ValueError(f"axes: {e}") from None
        return AIFeedbackDescriptor(axes, model=params["model"], rescale_at=tuple(params.get("rescale_at") or ()))
    if kind == "learned":
        from descriptors.learned import LearnedDescriptor

        if params["judge"] not in ("llm", "human"):
            raise ValueError(f"judge: unknown {params['judge']!r}; use llm or human")
        return LearnedDescriptor(
            dims=params["dims"], refit_at=tuple(params["refit_at"]) or (100, 200, 400),
            fit_after=tuple(params["fit_after"]) or None,
            judge=params["judge"], seed=seed,
        )
    raise ValueError(f"kind: unknown descriptor {kind!r}; use one of {list(KINDS)}")


def axis_bins(kind: str, params: dict[str, Any], dim: int) -> list[int]:
    """Grid bins per axis of one part: its ``bins``, the AI-feedback axes' bins, or 10 each."""
    if params.get("bins"):
        if len(params["bins"]) != dim:
            raise ValueError(f"bins: has {len(params['bins'])} entries for {dim} axes; give {dim}")
        return [int(b) for b in params["bins"]]
    if kind == "ai_feedback":
        return [int(a["bins"]) for a in params["axes"]]
    return [10] * dim


__all__ = ["Combined", "Described", "Descriptor", "Item", "KINDS", "axis_bins", "is_fitted_kind", "make_descriptor"]
