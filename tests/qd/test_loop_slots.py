"""The loop's slots: a proposal frees its slot as it finishes, not as its wave commits (qd/loop.py)."""

import asyncio

import pytest
from helpers import run_engine, scripted_text_config, stored, varied_program
from scripted_llm import Rule


@pytest.mark.slow
def test_a_slow_call_holds_its_own_slot_only(tmp_path, scripted_llm):
    """in_flight=4, waves of 2: while the first model call takes 0.6 s, the others keep the rest of
    the slots busy (the wave formed ahead runs), yet never more than in_flight calls at once. With
    slots held until a wave commits, only the 3 other calls of the first two waves could finish."""
    from qd.run import build_engine

    server = scripted_llm([Rule("", varied_program)])
    engine = build_engine(
        scripted_text_config(server.base_url, "runner.max_llm_calls=12", "runner.progress=false"), tmp_path
    )
    complete, calls, log = engine.llm.complete, [], []

    async def timed(*args, **kwargs):
        n = len(calls)
        calls.append(n)
        log.append(
            ("start", n, sum(1 for e in log if e[0] == "start") - sum(1 for e in log if e[0] == "end"))
        )
        try:
            await asyncio.sleep(0.6 if n == 0 else 0.02)
            return await complete(*args, **kwargs)
        finally:
            log.append(("end", n, 0))

    engine.llm.complete = timed
    run_engine(engine)
    assert sum(c.model is not None for c in stored(tmp_path)) == 12
    assert max(in_model + 1 for kind, _, in_model in log if kind == "start") <= 4
    slow_end = log.index(("end", 0, 0))
    assert sum(kind == "end" for kind, _, _ in log[:slow_end]) >= 5
