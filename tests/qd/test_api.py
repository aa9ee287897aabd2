"""The public Python API: compose, build with a per-commit callback, read the elites."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import small_config

import qd
from qd import events
from qd.contract import ConfigError


def test_on_commit_sees_every_commit_event_as_written_and_elites_read_the_archive(tmp_path):
    seen = []
    engine = qd.build(small_config(), tmp_path, on_commit=seen.append)
    try:
        summary = engine.run()
    finally:
        engine.close()
    commits = [e for e in events.read(tmp_path / "events.jsonl") if e["event"] == "commit"]
    assert seen == commits and len(seen) == summary["batches"]
    assert [e["evaluations"] for e in seen] == sorted({e["evaluations"] for e in seen})
    best = qd.elites(tmp_path)
    assert len(best) == summary["global"]["num_elites"]
    assert [e.fitness for e in best] == sorted((e.fitness for e in best), reverse=True)
    assert best[0].fitness == pytest.approx(summary["global"]["max_fitness"])
    assert best[0].candidate.id is not None and np.isfinite(best[0].candidate.vector).all()
    assert (tmp_path / "config.yaml").exists()  # resumable with qd-run resume=


def test_build_refuses_a_bad_field_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^archive\.upper: has 1 entries"):
        qd.build(small_config("archive.upper=[1]"), tmp_path)


def test_elites_of_a_directory_without_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.yaml; pass a run directory made by qd-run"):
        qd.elites(tmp_path)
