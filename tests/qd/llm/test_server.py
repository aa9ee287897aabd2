"""The embedded llama.cpp server (SmolLM2-135M) end to end: start, answer through qd.llm, stop cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

from qd.llm import Completion, LLMClient, LLMSettings, ModelSpec
from qd.llm.server import EmbeddedServer, _is_recorded, smollm2_path

pytestmark = pytest.mark.slow


def ask(server: EmbeddedServer, prompt: str, max_tokens: int) -> Completion:
    """One greedy call (temperature 0, fixed seed) so the answer is the same on every run."""
    settings = LLMSettings(
        base_url=server.base_url,
        models=(ModelSpec(server.model),),
        temperature=0.0,
        max_tokens=max_tokens,
        seed=0,
        timeout_s=120.0,
        max_retries=1,
    )

    async def main() -> Completion:
        client = LLMClient(settings)
        try:
            return await client.complete([{"role": "user", "content": prompt}])
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_answers_a_tiny_prompt(llama_server):
    c = ask(llama_server, "Say hello.", max_tokens=16)
    assert c.text.strip() and c.model == "smollm2" and not c.cached
    assert c.tokens_in > 0 and c.tokens_out > 0
    assert llama_server.log_path.is_file() and llama_server.log_path.stat().st_size > 0


def test_returns_a_python_code_block(llama_server):
    c = ask(
        llama_server,
        "Write a Python function add(a, b) that returns a + b. Reply with a ```python code block.",
        max_tokens=96,
    )
    assert re.search(r"```python\s*\n.*def ", c.text, re.S), c.text


def test_stop_leaves_no_process(tmp_path):
    server = EmbeddedServer(smollm2_path(), log_path=tmp_path / "server.log", n_threads=1).start()
    pid = server.pid
    assert server.startup_s is not None and server.startup_s < server.startup_timeout_s
    record = json.loads(server.record_path.read_text())
    assert record["pid"] == pid and _is_recorded(record)
    assert str(server.record_path) in record["cmdline"]  # `ps` shows whose server it is
    server.stop()
    server.stop()  # idempotent
    assert server.pid is None and not server.record_path.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone


def test_a_server_left_running_is_stopped_by_the_next_one(tmp_path):
    """As after a crash: the next server for the same log (run directory) stops the recorded one."""
    log = tmp_path / "server.log"
    old = EmbeddedServer(smollm2_path(), log_path=log, n_threads=1).start()
    old_proc, old._proc = old._proc, None  # forgotten, as by a process that died
    try:
        with EmbeddedServer(smollm2_path(), log_path=log, n_threads=1) as new:
            assert old_proc.wait(10) is not None
            assert json.loads(new.record_path.read_text())["pid"] == new.pid
            assert ask(new, "Say hello.", max_tokens=4).text
        assert f"(pid {old_proc.pid})" in log.read_text()
    finally:
        old_proc.kill()
        old_proc.wait()
