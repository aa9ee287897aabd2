"""Reasoning models through LLMClient, against the scripted server: the budget field, reasoning
tokens in every usage shape counted apart, and an answer with no text after reasoning."""

from __future__ import annotations

import pytest
from helpers import call, counts, fast_settings, run, run_config, scripted_text_config, stored
from scripted_llm import Rule

from qd.llm import CallFailed, LLMClient

THOUGHT = "step by step " * 30  # 390 characters: 97 tokens at the server's 4 characters a token


def client(url: str, **kw) -> LLMClient:
    return LLMClient(fast_settings(url, **{"max_completion_tokens": 400, "timeout_s": 5.0, **kw}))


@pytest.mark.parametrize(
    "field, usage, counted",
    [
        ("reasoning_content", "details", 97),  # DeepSeek: text and count
        ("reasoning", "details", 97),  # OpenRouter: its field name
        (None, "details", 97),  # OpenAI: the count only
        (None, "flat", 97),  # a flat usage.reasoning_tokens
        ("reasoning_content", "none", 97),  # llama.cpp: the text only, estimated like the server
    ],
)
def test_reasoning_tokens_are_read_from_each_shape_and_counted_apart(scripted_llm, field, usage, counted):
    server = scripted_llm(
        [Rule("", reply="x = 1", reasoning=THOUGHT, reasoning_field=field, reasoning_usage=usage)]
    )
    llm = client(server.base_url)
    (c,) = run(llm, call())
    assert (c.text, c.reasoning_tokens, c.tokens_out) == ("x = 1", counted, 1 + 97)
    assert c.cost == pytest.approx((c.tokens_in * 2.0 + c.tokens_out * 10.0) / 1e6)
    led = llm.ledger.as_dict()
    assert led["reasoning_tokens"] == counted
    assert (
        led["per_model"]["m"]["reasoning_tokens"]
        == led["per_role"]["operator"]["reasoning_tokens"]
        == counted
    )
    body = server.requests[0]
    assert body["max_completion_tokens"] == 400 and "max_tokens" not in body


@pytest.mark.parametrize(
    "rule, finish",
    [
        (Rule("", reply=None, reasoning=THOUGHT), "stop"),  # content null after reasoning
        (Rule("", reply="x = 1", reasoning=THOUGHT, reasoning_field=None), "length"),  # budget spent
    ],
)
def test_an_answer_with_no_text_after_reasoning_is_one_failed_call_with_its_reason(
    scripted_llm, rule, finish
):
    server = scripted_llm([rule])
    llm = client(server.base_url, max_completion_tokens=400 if finish == "stop" else 50)
    with pytest.raises(
        CallFailed, match=r"budget on reasoning .*finish_reason " + finish + r".*max_completion"
    ):
        run(llm, call())
    # not retried as malformed; a paid answer, so counted as a call too (call budgets bind)
    assert len(server.requests) == 1 and counts(llm) == (1, 0, 1)
    cell = llm.ledger.as_dict()["per_model"]["m"]
    spent = 97 if finish == "stop" else 50
    assert (cell["failed"], cell["reasoning_tokens"], cell["tokens_out"]) == (1, spent, spent)
    assert cell["cost"] == pytest.approx((cell["tokens_in"] * 2.0 + spent * 10.0) / 1e6)  # paid all the same


def test_a_null_content_without_reasoning_is_still_retried_as_malformed(scripted_llm):
    server = scripted_llm([Rule("", reply=None, times=1), Rule("", reply="ok")])
    (c,) = run(client(server.base_url), call())
    assert c.text == "ok" and len(server.requests) == 2


def test_without_max_completion_tokens_the_budget_is_max_tokens_and_extra_fields_go_as_given(scripted_llm):
    server = scripted_llm([Rule("", reply="ok")])
    llm = client(server.base_url, max_completion_tokens=None, extra_body={"reasoning_effort": "low"})
    run(llm, call(max_tokens=33))
    body = server.requests[0]
    assert (
        body["max_tokens"] == 33 and "max_completion_tokens" not in body and body["reasoning_effort"] == "low"
    )


def test_a_run_whose_answers_are_all_reasoning_stores_its_children_failed_and_ends_at_its_call_budget(
    tmp_path, scripted_llm
):
    server = scripted_llm([Rule("", reply=None, reasoning=THOUGHT)])
    cfg = scripted_text_config(server.base_url, "runner.max_llm_calls=4", "llm.max_completion_tokens=400")
    summary = run_config(cfg, tmp_path)
    children = [c for c in stored(tmp_path) if c.operator == "rewrite"]
    assert len(server.requests) == len(children) == 4  # one request each: none retried
    assert all(not c.valid and "whole budget on reasoning" in c.error for c in children)
    assert summary["llm"]["reasoning_tokens"] == 4 * 97 and summary["llm"]["failed_calls"] == 4
