"""Test setup: import the checkout's packages (qd, operators, descriptors) and tests/helpers.py."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
for path in (TESTS.parent, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# The suite's own JAX compilation cache (qd.compile_cache), kept between sessions beside pytest's
# cache: runs here and in the subprocesses they start never read or fill the user's ~/.cache.
os.environ["QD_COMPILE_CACHE"] = str(TESTS.parent / ".pytest_cache" / "qd-jax")


def pytest_configure(config):
    """Loads anyio's lazily imported file helpers here, on the main thread. pytest rewrites anyio's
    modules (anyio ships a pytest plugin), and on Python 3.11.7 that rewrite (``ast``) can fail with
    "AST constructor recursion depth mismatch" when it first happens on another thread: starlette's
    test client serves the explorer's files from one."""
    import anyio

    anyio.open_file  # noqa: B018 (the attribute access is the import)


@pytest.fixture(scope="session", autouse=True)
def compile_cache():
    """The suite's compilation cache serves this process from its first test on, not only from
    the first run built here (``build_engine`` enables it): the archive, selection and device
    tests that call jitted code directly compile each program once per machine, whatever order
    the tests run in."""
    from qd import compile_cache

    return compile_cache.enable()


@pytest.fixture
def scripted_llm():
    """Factory: ``scripted_llm(rules, latency_s=..., in_process=...)`` -> a started ScriptedLLM,
    stopped after the test."""
    from scripted_llm import ScriptedLLM

    servers: list[ScriptedLLM] = []

    def make(rules=(), *, in_process: bool = False, **kwargs) -> ScriptedLLM:
        server = ScriptedLLM(rules, **kwargs).start(in_process=in_process)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """The real embedded llama.cpp server (SmolLM2), started once per session for slow tests."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail(
            "llama_cpp is not importable: pip install 'llama-cpp-python[server]' (slow tests need it)"
        )
    from qd.llm.server import EmbeddedServer

    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    with EmbeddedServer(log_path=log_path) as server:
        yield server


@pytest.fixture(scope="session")
def text_run(tmp_path_factory):
    """A finished function_fit run (2 islands, 24 scripted model calls), shared by the readers' tests."""
    from helpers import text_run, varied_program
    from scripted_llm import Rule, ScriptedLLM

    server = ScriptedLLM([Rule("", varied_program)]).start()
    try:
        yield text_run(tmp_path_factory.mktemp("text_run"), server.base_url)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pareto_run(tmp_path_factory):
    """A finished function_fit run on a Pareto archive (error and size, fronts of 3), shared by
    the readers of fronts."""
    from helpers import text_run, varied_program
    from scripted_llm import Rule, ScriptedLLM

    server = ScriptedLLM([Rule("", varied_program)]).start()
    try:
        yield text_run(
            tmp_path_factory.mktemp("pareto_run"), server.base_url, "archive=pareto", "archive.front_size=3"
        )
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cvt_run(tmp_path_factory):
    """A finished sphere run (3 islands, a 500-cell CVT), shared by the readers' tests."""
    from helpers import cvt_run

    return cvt_run(tmp_path_factory.mktemp("cvt_run"))
