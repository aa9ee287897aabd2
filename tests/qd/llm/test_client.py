"""qd.llm.LLMClient over HTTP, against the scripted server: retries, faults, ledger, cache, keys."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import time

import numpy as np
import pytest
from helpers import MSG, call, counts, run
from helpers import fast_settings as settings
from scripted_llm import Rule

from qd.llm import CallFailed, LLMClient, LLMDown, LLMError, LLMSettings, ModelSpec, tally

RETRIED = ["429", "500", "hang", "bad_json", "empty_choices", "wrong_shape", "close_connection"]


def test_success_fills_completion_and_ledger(scripted_llm):
    server = scripted_llm([Rule("", reply="x" * 40)])
    client = LLMClient(settings(server.base_url))
    (c,) = run(client, call([{"role": "user", "content": "y" * 400}]))
    assert (c.text, c.model, c.cached, c.finish_reason) == ("x" * 40, "m", False, "stop")
    assert (c.tokens_in, c.tokens_out) == (100, 10)  # the scripted server's usage: chars / 4
    assert c.cost == pytest.approx((100 * 2.0 + 10 * 10.0) / 1e6)
    led = client.ledger.as_dict()
    assert [led[k] for k in ("calls", "cached_calls", "failed_calls", "retries", "in_flight")] == [
        1,
        0,
        0,
        0,
        0,
    ]
    assert (led["tokens_in"], led["tokens_out"], led["cost"]) == (100, 10, c.cost)
    one = {
        "calls": 1,
        "cached": 0,
        "failed": 0,
        "retries": 0,
        "tokens_in": 100,
        "tokens_out": 10,
        "cost": c.cost,
        "reasoning_tokens": 0,
    }
    assert led["per_model"] == {"m": one} and led["per_role"] == {"operator": one}
    assert server.requests[0]["model"] == "m" and server.requests[0]["max_tokens"] == 512


@pytest.mark.parametrize("fault", RETRIED)
def test_transient_fault_is_retried(scripted_llm, fault):
    server = scripted_llm([Rule("", fault=fault, times=1), Rule("", reply="ok")])
    client = LLMClient(settings(server.base_url, timeout_s=0.3))
    (c,) = run(client, call())
    assert c.text == "ok"
    assert counts(client) == (1, 1, 0)
    assert server.stats()["requests"] == 2


@pytest.mark.parametrize("fault", RETRIED)
def test_persistent_fault_raises_one_line(scripted_llm, fault):
    server = scripted_llm([Rule("", fault=fault)])
    client = LLMClient(settings(server.base_url, timeout_s=0.2, max_retries=2))
    with pytest.raises(CallFailed) as err:
        run(client, call())
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"llm: {server.base_url}") and "after 2 retries" in msg
    assert counts(client) == (0, 2, 1)
    assert server.stats()["requests"] == 3 and client.down is None  # only this call failed


@pytest.mark.parametrize("status", ["400", "401", "403", "404"])
def test_client_errors_are_not_retried(scripted_llm, status):
    server = scripted_llm([Rule("", fault=status)])
    client = LLMClient(settings(server.base_url))
    with pytest.raises(LLMError, match=f"HTTP {status}") as err:
        run(client, call())
    assert "\n" not in str(err.value)
    assert server.stats()["requests"] == 1 and counts(client) == (0, 0, 1)


def test_http_400_fails_the_call_and_the_client_goes_on(scripted_llm):
    server = scripted_llm([Rule("too long", fault="400"), Rule("", reply="fine")])
    client = LLMClient(settings(server.base_url))
    with pytest.raises(CallFailed, match="HTTP 400"):
        run(client, call([{"role": "user", "content": "too long"}]))
    assert client.down is None


@pytest.mark.parametrize("status", ["401", "403", "404"])
def test_refused_key_or_model_puts_the_client_down_at_once(scripted_llm, status):
    server = scripted_llm([Rule("", fault=status)])
    client = LLMClient(settings(server.base_url))

    async def twice(c):
        with pytest.raises(LLMDown, match=f"HTTP {status}"):
            await c.complete(MSG)
        with pytest.raises(LLMDown, match=f"HTTP {status}"):  # no second request: it is down
            await c.complete(MSG, sample_index=1)

    run(client, twice)
    assert server.stats()["requests"] == 1 and client.down is not None and "HTTP " + status in client.down


def test_no_answer_for_give_up_after_s_puts_the_client_down(scripted_llm):
    server = scripted_llm([Rule("", fault="500")])
    client = LLMClient(settings(server.base_url, max_retries=1000, give_up_after_s=0.3))
    with pytest.raises(LLMDown, match=r"answered no call for \d+s \(last: HTTP 500\).*llm.give_up_after_s"):
        run(client, call())
    assert server.stats()["requests"] > 3 and client.down is not None and counts(client)[2] == 1


def test_an_answer_resets_the_give_up_clock(scripted_llm):
    """A flaky server that answers now and then keeps the client up, however long it runs."""
    server = scripted_llm([Rule("", reply="ok", rotation=("500", "500", None))])
    client = LLMClient(
        settings(server.base_url, max_retries=5, give_up_after_s=0.3, backoff_s=0.02, backoff_max_s=0.02)
    )
    started = time.monotonic()
    results = run(client, *[call(sample_index=i) for i in range(30)])  # one after another
    assert time.monotonic() - started > 0.3  # longer in all than give_up_after_s
    assert [c.text for c in results] == ["ok"] * 30 and client.down is None


def test_ledger_splits_calls_by_role_and_tallies_a_context(scripted_llm):
    server = scripted_llm([Rule("fail", fault="400"), Rule("", reply="ok")])
    client = LLMClient(settings(server.base_url))

    async def calls(c):
        await c.complete(MSG)
        with tally() as mine:
            await asyncio.gather(
                c.complete(MSG, role="judge", sample_index=1), c.complete(MSG, role="meta", sample_index=2)
            )
            with pytest.raises(CallFailed):
                await c.complete([{"role": "user", "content": "fail"}], role="judge")
        return mine

    (mine,) = run(client, calls)
    roles = client.ledger.as_dict()["per_role"]
    assert {r: (u["calls"], u["failed"]) for r, u in roles.items()} == {
        "operator": (1, 0),
        "judge": (1, 1),
        "meta": (1, 0),
    }
    assert {r: (u["calls"], u["failed"]) for r, u in mine.as_dict()["per_role"].items()} == {
        "judge": (1, 1),
        "meta": (1, 0),
    }


def test_unreachable_server_names_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
        client = LLMClient(settings(f"http://127.0.0.1:{s.getsockname()[1]}/v1", max_retries=1))
        with pytest.raises(LLMError, match=r"unreachable after 1 retries \(\w+\) \(is the server running"):
            run(client, call())


def test_truncated_and_nonsense_replies_are_returned_as_is(scripted_llm):
    """Only the caller knows whether a cut or odd answer is usable, so neither is retried."""
    server = scripted_llm(
        [Rule("cut", reply="abcdefgh", fault="truncate"), Rule("odd", fault="malformed_content")]
    )
    client = LLMClient(settings(server.base_url))
    cut, odd = run(
        client, call([{"role": "user", "content": "cut"}]), call([{"role": "user", "content": "odd"}])
    )
    assert (cut.text, cut.finish_reason) == ("abcd", "length")
    assert odd.finish_reason == "stop" and "garbled" in odd.text
    assert counts(client)[1] == 0 and server.stats()["requests"] == 2


def test_missing_usage_is_estimated(scripted_llm):
    server = scripted_llm([Rule("", reply="z" * 80, fault="no_usage")])
    client = LLMClient(settings(server.base_url))
    (c,) = run(client, call([{"role": "user", "content": "q" * 40}]))
    assert (c.tokens_in, c.tokens_out) == (10, 20)


def test_concurrency_limit_is_respected(scripted_llm):
    server = scripted_llm(latency_s=0.05)
    client = LLMClient(settings(server.base_url, concurrency=3))
    seen: list[int] = []

    async def burst(c: LLMClient):
        tasks = [asyncio.create_task(c.complete(MSG, sample_index=i)) for i in range(12)]
        while not all(t.done() for t in tasks):
            seen.append(c.ledger.in_flight)
            await asyncio.sleep(0.005)
        return await asyncio.gather(*tasks)

    (results,) = run(client, burst)
    assert len(results) == 12 and client.ledger.in_flight == 0
    assert server.stats()["max_in_flight"] == 3 and max(seen) == 3


def test_many_concurrent_calls_on_loopback(scripted_llm):
    """Past 16 in flight a loopback client spreads calls over several connection pools; all still land."""
    server = scripted_llm(latency_s=0.05)
    client = LLMClient(settings(server.base_url, concurrency=40))
    results = run(client, lambda c: asyncio.gather(*[c.complete(MSG, sample_index=i) for i in range(120)]))[0]
    assert len(results) == 120 and client.ledger.calls == 120
    assert server.stats()["max_in_flight"] == 40


def test_cache_replays_without_request(scripted_llm, tmp_path):
    server = scripted_llm([Rule("", reply="cached answer")])
    s = settings(server.base_url, cache_dir=str(tmp_path / "cache"), seed=7)
    first_client = LLMClient(s)
    (first,) = run(first_client, call())
    second_client = LLMClient(s)  # a rerun: its cache opens after the first run's answers are in
    (again,) = run(second_client, call())
    assert server.stats()["requests"] == 1
    assert again.cached and not first.cached
    assert dataclasses.replace(again, cached=False) == first
    a, b = first_client.ledger.as_dict(), second_client.ledger.as_dict()
    assert b.pop("cached_calls") == 1 and a.pop("cached_calls") == 0
    for split in ("per_role", "per_model"):
        assert b[split]["operator" if split == "per_role" else "m"].pop("cached") == 1
        assert a[split]["operator" if split == "per_role" else "m"].pop("cached") == 0
    assert a == b  # budgets replay identically
    (log,) = (tmp_path / "cache").iterdir()  # the first client's log: one line, "<key> <answer>"
    key, answer = log.read_text().removesuffix("\n").split(" ", 1)
    assert log.name.startswith("answers-") and len(key) == 64 and "\n" not in answer
    assert json.loads(answer)["text"] == "cached answer"


def test_sample_index_and_seed_make_distinct_requests(scripted_llm, tmp_path):
    server = scripted_llm()
    client = LLMClient(settings(server.base_url, cache_dir=str(tmp_path), seed=3))
    run(client, call(sample_index=0), call(sample_index=1), call(sample_index=0))
    reqs = server.requests
    assert len(reqs) == 2 and reqs[0]["seed"] != reqs[1]["seed"]
    assert sum(len(log.read_text().splitlines()) for log in tmp_path.glob("answers-*.log")) == 2


def test_seed_is_stable_across_clients(scripted_llm):
    server = scripted_llm()
    run(LLMClient(settings(server.base_url, seed=3)), call(sample_index=5))
    run(LLMClient(settings(server.base_url, seed=3)), call(sample_index=5))
    run(LLMClient(settings(server.base_url)), call(sample_index=5))
    run(LLMClient(settings(server.base_url, seed=-2)), call(sample_index=-1))
    a, b, unseeded, negative = server.requests
    assert a["seed"] == b["seed"] and "seed" not in unseeded
    assert 0 <= negative["seed"] < 2**31


def test_pick_model_follows_weights(scripted_llm):
    models = (ModelSpec("big", weight=3.0), ModelSpec("small", weight=1.0))
    client = LLMClient(LLMSettings(base_url="http://127.0.0.1:9/v1", models=models))
    rng = np.random.default_rng(0)
    picks = [client.pick_model(rng) for _ in range(4000)]
    assert picks.count("big") / len(picks) == pytest.approx(0.75, abs=0.03)

    server = scripted_llm()
    chosen = LLMClient(settings(server.base_url, models=models, seed=1))
    first = run(chosen, *[call(sample_index=i) for i in range(20)])
    again = run(
        LLMClient(settings(server.base_url, models=models, seed=1)),
        *[call(sample_index=i) for i in range(20)],
    )
    assert [c.model for c in first] == [c.model for c in again]  # model=None is reproducible
    assert {c.model for c in first} == {"big", "small"}
    with pytest.raises(LLMError, match="not in llm.models"):
        run(LLMClient(settings(server.base_url)), call(model="other"))


def test_missing_key_env_var(monkeypatch):
    monkeypatch.delenv("QD_TEST_LLM_KEY", raising=False)
    with pytest.raises(LLMError, match=r"^llm: env var QD_TEST_LLM_KEY is not set \(export it"):
        LLMClient(settings("http://127.0.0.1:9/v1", api_key_env="QD_TEST_LLM_KEY"))


def test_no_base_url_is_refused_before_openai_picks_its_own():
    """openai falls back to OPENAI_BASE_URL or its own API: an endpoint nobody configured."""
    with pytest.raises(LLMError, match=r"^llm: no base_url \(set llm.base_url, or bring a ChatClient\)"):
        LLMClient(settings(None))


def test_key_never_leaks(scripted_llm, monkeypatch, caplog, tmp_path):
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("QD_TEST_LLM_KEY", secret)
    server = scripted_llm(
        [Rule("deny", fault="401"), Rule("busy", fault="429", times=1), Rule("", reply="fine")]
    )
    s = settings(server.base_url, api_key_env="QD_TEST_LLM_KEY", cache_dir=str(tmp_path))
    client = LLMClient(s)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LLMError) as err:
        run(client, call([{"role": "user", "content": "busy"}]), call([{"role": "user", "content": "deny"}]))
    assert "QD_TEST_LLM_KEY" in str(err.value)
    for text in (
        str(err.value),
        repr(client),
        repr(s),
        caplog.text,
        json.dumps(client.ledger.as_dict()),
        *(f.read_text() for f in tmp_path.rglob("*.json")),
    ):
        assert secret not in text


def test_scripted_server_in_its_own_process(scripted_llm):
    """The benchmark runs the server in a separate process; the client must see the same behaviour."""
    server = scripted_llm([Rule("", fault="500", times=1), Rule("", reply="from afar")], in_process=True)
    client = LLMClient(settings(server.base_url))
    (c,) = run(client, call())
    assert c.text == "from afar" and counts(client)[1] == 1
    assert server.stats()["requests"] == 2 and server.requests[1]["messages"] == MSG


def test_a_failed_call_is_not_cached_and_is_asked_again(scripted_llm, tmp_path):
    server = scripted_llm([Rule("", fault="500", times=1), Rule("", reply="second time")])
    s = settings(server.base_url, cache_dir=str(tmp_path / "cache"), max_retries=0)
    with pytest.raises(CallFailed):
        run(LLMClient(s), call())
    (again,) = run(LLMClient(s), call())
    assert (again.text, again.cached, server.stats()["requests"]) == ("second time", False, 2)
