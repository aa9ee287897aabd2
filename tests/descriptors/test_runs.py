"""Descriptors in whole runs (``qd-run experiment=function_fit descriptor=...``), scripted LLM.

The operators' calls and the judge's calls go to one scripted server; the
embedding runs use the real all-MiniLM-L6-v2 model.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import run_config, scripted_text_config, stored
from scripted_llm import Rule

from descriptors.code_metrics import code_metrics
from qd.rundir import checkpoint

JUDGE = r"Answer with the digit only\.\nText: (?![\s\S]*Text: )"  # the last turn of a judge chat


def program(request: dict) -> str:
    """A valid program per sample, its shape varying with the sample seed."""
    n = int(request.get("seed") or 0)
    body = " + ".join([f"{n % 9}.0 * x"] + ["x * x"] * (n % 4))
    return f"```python\ndef f(x):\n    return {body} + {n % 5}.0\n```"


def judge(request: dict) -> str:
    """A digit from the judged program's length; 'I cannot' for programs with 'x * x + x * x + x * x'."""
    text = request["messages"][-1]["content"].split("Text: ", 1)[1]
    if "x * x + x * x + x * x" in text:
        return "I cannot judge that."
    return str(min(len(text) // 12, 9))


def config(base_url: str, *overrides: str):
    return scripted_text_config(base_url, "runner.max_llm_calls=20", *overrides)


def refits(path) -> list[dict]:
    events = map(json.loads, (path / "events.jsonl").read_text().splitlines())
    return [e for e in events if e.get("event") == "refit"]


def test_ai_feedback_places_candidates_and_a_refusal_makes_one_invalid(tmp_path, scripted_llm):
    server = scripted_llm([Rule(JUDGE, judge), Rule("", program)])
    summary = run_config(
        config(server.base_url, "descriptor=ai_feedback", "descriptor.parts.0.rescale_at=[]"), tmp_path
    )
    assert summary["descriptor"] == {"name": "ai_feedback", "dim": 2, "fits": 0}
    rows = stored(tmp_path)
    placed = [c for c in rows if c.valid]
    assert placed and all(0.0 <= v <= 1.0 for c in placed for v in c.descriptor)
    for c in placed:  # no logprobs from this server: the parsed digit / 9
        assert c.descriptor[0] == pytest.approx(min(len(c.text) // 12, 9) / 9)
    refused = [c for c in rows if c.text and "x * x + x * x + x * x" in c.text]
    assert refused and all(
        not c.valid and "descriptor: ai_feedback.style: judge answered" in c.error for c in refused
    )
    judged = [r for r in server.requests if re.search(JUDGE, r["messages"][-1]["content"])]
    # Judge calls count in the ledger and in runner.max_llm_calls (a refused answer, asked
    # again, comes from the client's cache); children in flight reserve 1 + 2 judge calls.
    llm = summary["llm"]
    assert 20 - 3 < llm["calls"] <= 20
    roles = llm["per_role"]
    assert roles["operator"]["calls"] == sum(c.model is not None for c in rows)
    assert roles["judge"]["calls"] == len(judged) + roles["judge"]["cached"] > 0


def test_mixed_descriptor_joins_an_ai_feedback_axis_and_a_code_metric(tmp_path, scripted_llm):
    server = scripted_llm([Rule(JUDGE, judge), Rule("", program)])
    cfg = config(
        server.base_url, "descriptor=mixed", "descriptor.parts.0.rescale_at=[4]", "runner.max_llm_calls=8"
    )
    summary = run_config(cfg, tmp_path)
    assert summary["descriptor"] == {"name": "ai_feedback+code_metrics", "dim": 2, "fits": 1}
    (refit,) = refits(tmp_path)  # the judge's range fitted at 4 valid candidates, everything re-placed
    assert refit["placed"] == refit["candidates"] >= 4
    late = [c for c in stored(tmp_path) if c.valid][refit["candidates"] :]
    assert late
    for c in late:  # first axis: the rescaled judge score; second: the node count
        assert 0.0 <= c.descriptor[0] <= 1.0 and c.descriptor[1] == code_metrics(c.text)["nodes"]


@pytest.mark.slow
def test_embedding_run_refits_and_a_resume_keeps_the_frozen_projection(tmp_path, scripted_llm):
    from descriptors.embedding import EmbeddingDescriptor

    server = scripted_llm([Rule("", program)])
    overrides = ["descriptor=embedding", "descriptor.parts.0.refit_at=[6,14]"]
    summary = run_config(config(server.base_url, *overrides), tmp_path)
    assert summary["descriptor"] == {"name": "embedding", "dim": 2, "fits": 2}
    assert [e["placed"] for e in refits(tmp_path)] == [e["candidates"] for e in refits(tmp_path)]
    state = checkpoint.load_arrays(tmp_path / "checkpoints")
    before = stored(tmp_path)

    resumed = run_config(config(server.base_url, *overrides, "runner.max_llm_calls=26"), tmp_path)
    assert resumed["descriptor"]["fits"] == 2 and resumed["llm"]["calls"] == 26
    # Every candidate committed after the last fit, before and after the resume, has the
    # descriptor the checkpointed (frozen) projection gives.
    frozen = EmbeddingDescriptor(refit_at=(6, 14))
    frozen.load_state_dict(
        {k.removeprefix("describer.0."): v for k, v in state.items() if k.startswith("describer.")}
    )
    late = [c for c in stored(tmp_path) if c.valid and c.id > before[-1].id - 4]
    import asyncio

    from descriptors.base import Item

    again = asyncio.run(frozen.describe([Item(c.text) for c in late]))
    np.testing.assert_allclose(np.stack([c.descriptor for c in late]), again.values, atol=1e-6)


@pytest.mark.slow
def test_cvt_in_embedding_space_fits_centroids_then_places_everything(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", program)])
    cfg = config(
        server.base_url,
        "descriptor=embedding_space",
        "archive=cvt",
        "archive.cells=16",
        "descriptor.parts.0.refit_at=[6]",
        "runner.max_llm_calls=12",
    )
    summary = run_config(cfg, tmp_path)
    assert summary["descriptor"] == {"name": "embedding", "dim": 384, "fits": 1}
    (refit,) = refits(tmp_path)
    assert refit["placed"] == refit["candidates"] >= 6
    centroids = checkpoint.load_arrays(tmp_path / "checkpoints")["describer.0.centroids"]
    assert centroids.shape == (16, 384)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-5)
    assert summary["global"]["num_elites"] >= 2


@pytest.mark.slow
def test_novelty_search_in_embedding_space(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", program)])
    cfg = config(
        server.base_url,
        "descriptor=embedding_space",
        "archive=novelty",
        "archive.capacity=50",
        "archive.k=3",
        "archive.novelty_threshold=0.05",
        "runner.max_llm_calls=12",
    )
    summary = run_config(cfg, tmp_path)
    assert summary["descriptor"] == {"name": "embedding", "dim": 384, "fits": 0}  # raw vectors: no fit
    kept = [c for c in stored(tmp_path) if c.valid]
    assert all(c.descriptor.shape == (384,) for c in kept)
    state, _, _ = checkpoint.load(tmp_path / "checkpoints")
    entries = set(np.asarray(state.genome_id).ravel().tolist()) - {-1}
    assert 2 <= len(entries) == summary["global"]["num_elites"] <= len(kept)
    assert entries <= {c.id for c in kept}
    assert summary["global"]["coverage"] == pytest.approx(len(entries) / 50)
