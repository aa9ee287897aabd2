"""bench/llm_function_fit.py on a tiny run: a real function_fit engine, its CPU split and its wall split."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import llm_function_fit  # noqa: E402


@pytest.mark.slow
def test_a_tiny_run_accounts_for_its_slots_and_processes():
    r = llm_function_fit.run_function_fit(concurrency=4, calls=12, latency_s=0.02, workers=1)
    assert r["requests"] == 12 and r["candidates"] >= 12 and r["max_in_flight"] <= 4
    cpu, wall = r["cpu_ms"], r["wall_ms"]
    # the sandbox worker is a helper; each run's forked child is one of its children
    assert cpu["main"] > 0 and cpu["helpers"] > 0 and cpu["children"] > 0
    assert cpu["main+helpers"] == pytest.approx(cpu["main"] + cpu["helpers"])
    # the slots' time, C x wall, is split without a remainder; every call waited its latency
    slots = sum(wall[k] for k in llm_function_fit.PARTS if k != "commit")
    assert slots == pytest.approx(1e3 * 4 * r["wall_s"] / r["candidates"], rel=1e-6)
    assert wall["model"] >= 1e3 * 0.02 * 12 / r["candidates"] and min(wall.values()) > -1.0
