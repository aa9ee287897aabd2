"""The presets (conf/llm/*.yaml, docs/providers.md) and what a researcher's provider sends back:
each preset plans and asks in its own shape, Retry-After in each form is waited, prices fill cost."""

from __future__ import annotations

import email.utils
import time

import pytest
from helpers import call, counts, run
from scripted_llm import Rule

from qd.llm import CallFailed, LLMClient, LLMSettings, ModelSpec
from qd.llm.plan import plan_llm
from qd.llm.prices import PRICES, price_of
from qd.plan import compose

# preset: (its URL, its key variable, what llm.reasoning_effort=high adds to a request)
PRESETS = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY", {"reasoning_effort": "high"}),
    "vllm": ("http://127.0.0.1:8000/v1", None, {"reasoning_effort": "high"}),
    "ollama": ("http://127.0.0.1:11434/v1", None, {"reasoning_effort": "high"}),
    "llamacpp": ("http://127.0.0.1:8080/v1", None, {"chat_template_kwargs": {"reasoning_effort": "high"}}),
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", {"reasoning": {"effort": "high"}}),
    "anthropic": (
        "https://api.anthropic.com/v1/",
        "ANTHROPIC_API_KEY",
        {"thinking": {"type": "enabled", "budget_tokens": 16384}},
    ),
    "gemini": (
        "https://generativelanguage.googleapis.com/v1beta/openai/",
        "GEMINI_API_KEY",
        {"reasoning_effort": "high"},
    ),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_plans_and_its_requests_carry_its_reasoning_shape(name, scripted_llm, monkeypatch):
    url, key_env, fields = PRESETS[name]
    if key_env:
        monkeypatch.setenv(key_env, "sk-test")
    planned = plan_llm(compose(["experiment=function_fit", f"llm={name}"]))
    assert (planned.provider, planned.settings.base_url, planned.settings.api_key_env) == (name, url, key_env)
    server = scripted_llm([Rule("", reply="ok")])
    cfg = compose(
        [
            "experiment=function_fit",
            f"llm={name}",
            f"llm.base_url={server.base_url}",
            "llm.reasoning_effort=high",
            "llm.max_completion_tokens=64",
            "llm.extra_body={top_k: 5}",
        ]
    )
    run(LLMClient(plan_llm(cfg).settings), call())
    (body,) = server.requests
    assert {k: body[k] for k in fields} == fields and body["top_k"] == 5
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body
    assert body["model"] == cfg.llm.models[0].name


def test_without_an_effort_no_reasoning_field_is_sent(scripted_llm, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-test")
    server = scripted_llm([Rule("", reply="ok")])
    cfg = compose(["experiment=function_fit", "llm=openrouter", f"llm.base_url={server.base_url}"])
    run(LLMClient(plan_llm(cfg).settings), call())
    (body,) = server.requests
    assert not {"reasoning", "reasoning_effort", "max_completion_tokens"} & set(body) and "max_tokens" in body


def openai_at(url: str) -> list[str]:
    return ["experiment=function_fit", "llm=openai", f"llm.base_url={url}"]


def _http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize(
    "headers, low",
    [
        ({"Retry-After": "1"}, 0.9),
        ({"retry-after-ms": "1000"}, 0.9),
        ({"Retry-After": "date"}, 0.9),  # an HTTP date 2 s ahead: whole seconds, so 1-2 s from now
    ],
)
def test_retry_after_is_waited_in_each_form_though_longer_than_the_backoff_cap(scripted_llm, headers, low):
    if headers.get("Retry-After") == "date":
        headers = {"Retry-After": _http_date(2.0)}
    server = scripted_llm([Rule("", fault="429", times=1, headers=headers), Rule("", reply="ok")])
    llm = LLMClient(
        LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), backoff_s=0.01, backoff_max_s=0.05)
    )
    t0 = time.monotonic()
    (c,) = run(llm, call())
    waited = time.monotonic() - t0
    assert c.text == "ok" and counts(llm) == (1, 1, 0)
    assert low <= waited < 4.0


def test_a_retry_after_beyond_the_cap_fails_the_call_at_once_saying_what_it_asked(scripted_llm):
    server = scripted_llm([Rule("", fault="429", headers={"Retry-After": "600"})])
    llm = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), retry_after_max_s=5.0))
    t0 = time.monotonic()
    with pytest.raises(CallFailed, match=r"asked to wait 600s, more than llm.retry_after_max_s=5"):
        run(llm, call())
    assert time.monotonic() - t0 < 3.0 and len(server.requests) == 1 and counts(llm) == (0, 0, 1)


def test_the_price_table_fills_the_cost_and_a_config_price_overrides_it(scripted_llm, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = scripted_llm([Rule("", reply="y" * 80)])
    settings = plan_llm(compose(openai_at(server.base_url))).settings
    (spec,) = settings.models
    assert (spec.name, spec.price_in, spec.price_out) == ("gpt-4.1-mini", 0.40, 1.60)
    llm = LLMClient(settings)
    (c,) = run(llm, call())
    assert c.tokens_out == 20 and c.cost == pytest.approx((c.tokens_in * 0.40 + 20 * 1.60) / 1e6)
    assert llm.ledger.as_dict()["per_model"]["gpt-4.1-mini"]["cost"] == pytest.approx(c.cost)
    mine = compose([*openai_at(server.base_url), "llm.models=[{name: gpt-4.1-mini, price_in: 1.0}]"])
    (spec,) = plan_llm(mine).settings.models
    assert (spec.price_in, spec.price_out) == (1.0, 1.60)


def test_prices_match_exactly_then_without_the_provider_prefix():
    assert price_of("gpt-4.1-mini") == price_of("openai/gpt-4.1-mini") == PRICES["gpt-4.1-mini"]
    assert price_of("anthropic/claude-sonnet-4") == PRICES["claude-sonnet-4"]
    assert price_of("qwen2.5-coder:7b") is None and price_of("someone/unknown") is None
    assert all(p_in >= 0 and p_out >= p_in for p_in, p_out in PRICES.values())
