"""``qd.optimize`` given no model: it starts the embedded SmolLM2 server itself, the run's and the
held-out calls go to it, and the server is gone when the call returns."""

from __future__ import annotations

import os
import subprocess

import pytest

import qd


def children_of(pid: int) -> list[str]:
    """The command lines of ``pid``'s live child processes."""
    listing = subprocess.run(["ps", "-eo", "ppid=,stat=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in listing.splitlines() if line.strip()]
    return [row[2] for row in rows if len(row) == 3 and row[0] == str(pid) and not row[1].startswith("Z")]


@pytest.mark.slow
def test_with_no_model_given_the_embedded_model_serves_the_run_and_is_stopped(tmp_path):
    rows = [{"input": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(4) for b in range(3)]
    result = qd.optimize(
        "Answer with the number only.",
        genome="prompt",
        dataset=rows,
        metric="numeric",
        budget={"llm_calls": 30},
        run_dir=tmp_path / "run",
    )
    by_model = result.ledger.split("model")
    assert set(by_model) == {"smollm2"} and by_model["smollm2"].calls > 9  # the founder's rows at least
    score, (low, high) = result.heldout  # the 3 test rows, scored by the same embedded model
    assert 0.0 <= low <= score <= high <= 1.0
    assert result.best.text and (result.run_dir / "store.sqlite").is_file()
    assert not [args for args in children_of(os.getpid()) if "llama" in args]  # nothing it started lives on
