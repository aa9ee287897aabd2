"""The ``llm`` group's checks (``qd.llm.plan.plan_llm``): one error naming the field, or the
client's settings."""

from __future__ import annotations

import importlib.util

import pytest

from qd.contract import ConfigError
from qd.llm.plan import LocalServer, plan_llm
from qd.plan import compose

SERVER = ["experiment=function_fit", "llm.provider=server", "llm.base_url=http://127.0.0.1:9"]
NO_KEY = [*SERVER, "llm.api_key_env=null"]


@pytest.fixture
def llama_cpp_found(monkeypatch):
    """The local provider's check needs the package found, not loaded."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "llama_cpp" else find_spec(name, *a)
    )


@pytest.fixture(scope="module")
def server_cfg():
    return compose([*NO_KEY, "seed=7"])


def test_a_server_plan_keeps_its_url_and_takes_the_run_seed(server_cfg):
    p = plan_llm(server_cfg)
    assert (p.provider, p.local, p.cache) == ("server", None, bool(server_cfg.llm.cache))
    assert p.settings.base_url == "http://127.0.0.1:9" and p.settings.seed == 7
    assert [m.name for m in p.settings.models] == [m.name for m in server_cfg.llm.models]


def test_an_own_llm_seed_wins_over_the_run_seed():
    assert plan_llm(compose([*NO_KEY, "seed=7", "llm.seed=11"])).settings.seed == 11


def test_the_local_provider_leaves_the_url_to_its_server(tmp_path, llama_cpp_found):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    cfg = compose(["experiment=function_fit", "llm=local", f"llm.local.model_path={gguf}"])
    p = plan_llm(cfg)
    assert p.settings.base_url is None
    assert p.local == LocalServer(
        str(gguf), cfg.llm.local.n_ctx, cfg.llm.local.n_threads, cfg.llm.local.startup_timeout_s
    )


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            [*NO_KEY, "llm.provider=remote"],
            "llm.provider: unknown provider 'remote' (use one of "
            "['local', 'server', 'openai', 'vllm', 'ollama', 'llamacpp', 'openrouter', 'anthropic', "
            "'gemini'])",
        ),
        (
            [*NO_KEY, "llm.reasoning_effort=max"],
            "llm.reasoning_effort: unknown effort 'max' (use one of "
            "['none', 'minimal', 'low', 'medium', 'high'])",
        ),
        (
            [*NO_KEY, "llm.extra_body=5"],
            "llm.extra_body: is not a mapping (write it as llm.extra_body={top_k: 40})",
        ),
        ([*NO_KEY, "llm.models=[]"], "llm.models: is empty (name at least one model, e.g. llm=local)"),
        (
            [*NO_KEY, "llm.models.0.weight=0"],
            "llm.models: weights must have a positive sum (give some model a weight > 0)",
        ),
        (
            [*NO_KEY, "llm.base_url=null"],
            "llm.base_url: is not set for provider server (give the server's URL)",
        ),
        (
            [*SERVER, "llm.api_key_env=QD_TEST_NO_SUCH_KEY"],
            "llm.api_key_env: environment variable QD_TEST_NO_SUCH_KEY is not set (export "
            "QD_TEST_NO_SUCH_KEY=... or set llm.api_key_env=null for a server without keys)",
        ),
    ],
)
def test_each_bad_llm_field_is_one_error_naming_it(overrides, line, monkeypatch):
    monkeypatch.delenv("QD_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError) as err:
        plan_llm(compose(overrides))
    assert str(err.value) == line


def test_a_missing_model_file_is_named(tmp_path, llama_cpp_found):
    with pytest.raises(ConfigError) as err:
        plan_llm(
            compose(["experiment=function_fit", "llm=local", f"llm.local.model_path={tmp_path}/no.gguf"])
        )
    assert str(err.value) == f"llm.local.model_path: no file {tmp_path}/no.gguf (give a GGUF file)"
