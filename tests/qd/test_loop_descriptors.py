"""The loop with a describer: candidates placed by descriptors, refits re-insert everything.

A small fitted descriptor defined here (text length over the longest text seen
at the fit) exercises the engine's refit path quickly; the real descriptors
are tested in tests/descriptors/, and end to end in tests/descriptors/test_runs.py.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from helpers import run_engine, scripted_text_config, text_engine
from scripted_llm import Rule

from descriptors.base import Described, pending
from qd import archive
from qd.contract import Descriptor
from qd.plan import plan
from qd.run import build_engine
from qd.store import Store


def varied(request: dict) -> str:
    """A different valid program per sample, of growing length."""
    n = int(request.get("seed") or 0) % 97
    body = " + ".join(["x"] * (1 + n % 5))
    return f"```python\ndef f(x):\n    return {body} + {n}.0\n```"


class LengthDescriptor(Descriptor):
    """Text length / longest text at the last fit (fitted at ``refit_at`` valid candidates)."""

    name, dim, lower, upper = "length", 1, (0.0,), (1.0,)

    def __init__(self, refit_at=(6, 14)):
        self.refit_at, self.done, self.scale, self.fit_sizes = tuple(refit_at), 0, None, []

    def needs_fit(self, num_valid: int) -> bool:
        return self.done < len(self.refit_at) and num_valid >= self.refit_at[self.done]

    async def fit(self, items, rng) -> None:
        self.scale = float(max(len(i.text) for i in items))
        self.done += 1
        self.fit_sizes.append(len(items))

    async def describe(self, items) -> Described:
        if self.scale is None:
            return pending(len(items), 1)
        values = np.asarray([[min(len(i.text) / self.scale, 1.0)] for i in items], np.float32)
        return Described(values, np.ones(len(items), bool), [None] * len(items))

    def state_dict(self):
        return {"scale": np.float64(self.scale), "done": np.int64(self.done)}

    def load_state_dict(self, state):
        self.scale, self.done = float(state["scale"]), int(state["done"])


def config(base_url: str, *overrides: str):
    return scripted_text_config(
        base_url, "runner.max_llm_calls=24", "runner.initial_population=6", *overrides
    )


def redescribed_rebuild(path, describer):
    """The archive a rebuild from the store gives with ``describer``'s current fit."""
    with Store(path / "store.sqlite", readonly=True) as store:
        offers = store.placements(-1, 1)
        texts = {c.id: c.text for c in store.iter()}
    values = np.asarray(
        [[min(len(texts[int(i)] or "") / describer.scale, 1.0)] for i in offers["id"]], np.float32
    )
    return archive.rebuild(
        archive.GridSpec((8,), (0.0,), (1.0,)),
        1,
        offers["island"],
        values,
        offers["fitness"],
        offers["id"],
        offers["valid"],
    )


def test_refits_reinsert_every_stored_candidate_and_resume_keeps_the_fit(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", varied)])
    describer = LengthDescriptor()
    with contextlib.ExitStack() as stack:
        summary = run_engine(text_engine(config(server.base_url), tmp_path, describer, stack))
    assert summary["descriptor"] == {"name": "length", "dim": 1, "fits": 2}
    refits = [
        e
        for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
        if e.get("event") == "refit"
    ]
    assert [e["fits"] for e in refits] == [1, 2]
    # Each refit placed every valid candidate stored at that time: none lost.
    assert [e["placed"] for e in refits] == [e["candidates"] for e in refits] == describer.fit_sizes
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        rows = list(store.iter())
    valid = [c for c in rows if c.valid]
    # Before the first fit, valid candidates were stored unplaced (NaN descriptors).
    assert np.isnan(valid[0].descriptor).all()
    # After the last fit every commit (even children described before it) used the final fit.
    late = [c for c in valid if c.id > valid[describer.fit_sizes[-1] - 1].id]
    assert late and all(
        c.descriptor[0] == pytest.approx(min(len(c.text) / describer.scale, 1.0)) for c in late
    )
    from qd.rundir import checkpoint

    state, _, counters = checkpoint.load(tmp_path / "checkpoints")
    expected = redescribed_rebuild(tmp_path, describer)
    np.testing.assert_array_equal(np.asarray(state.genome_id), np.asarray(expected.genome_id))
    assert counters["fits"] == 2

    # Resume with more budget: the fitted state comes back from the checkpoint.
    fresh = LengthDescriptor()
    with contextlib.ExitStack() as stack:
        cfg = config(server.base_url, "runner.max_llm_calls=30")
        resumed = run_engine(text_engine(cfg, tmp_path, fresh, stack))
    assert fresh.scale == describer.scale and fresh.done == 2 and fresh.fit_sizes == []
    assert resumed["llm"]["calls"] == 30


def test_code_metrics_descriptor_from_the_command_line_config(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", varied)])
    engine = build_engine(
        config(server.base_url, "descriptor=code_metrics", "runner.max_llm_calls=8"), tmp_path
    )
    summary = run_engine(engine)
    assert summary["descriptor"]["name"] == "code_metrics"
    from descriptors.code_metrics import code_metrics

    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        for c in store.iter():
            if c.valid:
                m = code_metrics(c.text)
                assert list(c.descriptor) == [m["nodes"], m["constants"]]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["descriptor=code_metrics", "descriptor.parts=[{kind: colour}]"], "descriptor.parts[0].kind"),
        (
            ["descriptor=code_metrics", "descriptor.parts.0.metrics=[speed, nodes]"],
            "descriptor.parts[0].metrics",
        ),
        (["descriptor=code_metrics", "descriptor.parts.0.bins=[3]"], "descriptor.parts[0].bins"),
        (["descriptor=embedding_space"], "archive.kind"),
        (["descriptor=ai_feedback", "descriptor.parts.0.axes=[]"], "descriptor.parts[0].axes"),
    ],
)
def test_bad_descriptor_config_names_the_field(overrides, field):
    from qd.contract import ConfigError

    cfg = config("http://127.0.0.1:9", *overrides)
    with pytest.raises(ConfigError) as e:
        plan(cfg)
    assert str(e.value).startswith(field), str(e.value)
