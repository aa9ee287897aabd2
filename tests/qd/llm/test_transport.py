"""A ChatClient the caller brings, wrapped as ``LLMClient(settings, transport=ChatTransport(chat))``:
counted, limited, retried and cached exactly as the HTTP endpoint's calls are."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from helpers import MSG, call, counts, run

from qd.llm import (
    CallFailed,
    ChatTransport,
    Completion,
    LLMClient,
    LLMDown,
    LLMSettings,
    ModelSpec,
    tally,
)


class Mine:
    """A caller's own client: a plain Python class, no HTTP. Each call answers after ``latency``
    seconds with the next of ``script`` (the last one repeats): a text, an exception to raise,
    or None for a reply that is not a Completion."""

    def __init__(self, *script, latency: float = 0.01, cost: float = 0.25):
        self.script, self.latency, self.cost = list(script), latency, cost
        self.calls: list[dict] = []
        self.in_flight = self.most_in_flight = 0

    def pick_model(self, rng):
        return "mine"

    async def complete(
        self,
        messages,
        *,
        model=None,
        temperature=None,
        max_tokens=None,
        sample_index=0,
        stop=None,
        role="operator",
    ):
        self.calls.append(
            dict(model=model, temperature=temperature, max_tokens=max_tokens, sample_index=sample_index)
            | dict(stop=stop, role=role, messages=messages)
        )
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        if isinstance(step, Exception):
            raise step
        if step is None:
            return {"text": "a dict"}
        return Completion(step, model, 7, 3, self.cost, False, "stop", self.latency)


def settings(**kw) -> LLMSettings:
    base = dict(models=(ModelSpec("mine"),), backoff_s=0.01, backoff_max_s=0.02, max_retries=2, timeout_s=0.2)
    return LLMSettings(base_url=None, **{**base, **kw})


def test_each_call_reaches_the_callers_client_and_is_counted_in_the_ledger_and_the_tally():
    chat = Mine("hi there")
    client = LLMClient(settings(temperature=0.3), transport=ChatTransport(chat))

    async def tallied(c):
        with tally() as mine:
            answer = await c.complete(MSG, role="judge", sample_index=4, stop=["\n"], max_tokens=9)
        return answer, mine

    ((answer, mine),) = run(client, tallied)
    assert chat.calls == [
        dict(
            model="mine",
            temperature=0.3,
            max_tokens=9,
            sample_index=4,
            stop=["\n"],
            role="judge",
            messages=MSG,
        )
    ]
    assert (answer.text, answer.model, answer.cached, answer.finish_reason) == (
        "hi there",
        "mine",
        False,
        "stop",
    )
    assert (answer.tokens_in, answer.tokens_out, answer.cost) == (7, 3, 0.25)  # no price: the caller's cost
    one = dict(
        calls=1, cached=0, failed=0, retries=0, tokens_in=7, tokens_out=3, cost=0.25, reasoning_tokens=0
    )
    for ledger in (client.ledger, mine):
        assert ledger.as_dict()["per_role"] == {"judge": one} and ledger.as_dict()["per_model"] == {
            "mine": one
        }
    assert "the caller's Mine" in repr(client)


def test_a_priced_model_is_priced_by_the_settings_and_model_none_picks_from_them():
    chat = Mine("ok")
    models = (ModelSpec("big", weight=1.0, price_in=2.0, price_out=10.0), ModelSpec("small", weight=1.0))
    client = LLMClient(settings(models=models, seed=1), transport=ChatTransport(chat))
    answers = run(client, *[call(sample_index=i) for i in range(20)])
    assert [c["model"] for c in chat.calls] == [a.model for a in answers]
    assert {a.model for a in answers} == {"big", "small"}
    for a in answers:
        assert a.cost == (pytest.approx((7 * 2.0 + 3 * 10.0) / 1e6) if a.model == "big" else 0.25)


def test_a_second_identical_call_is_served_from_the_cache_and_replays_over_http(tmp_path):
    chat = Mine("remembered")
    s = settings(cache_dir=str(tmp_path / "cache"), seed=7)
    client = LLMClient(s, transport=ChatTransport(chat))
    first, again, other = run(client, call(sample_index=2), call(sample_index=2), call(sample_index=3))
    assert len(chat.calls) == 2 and [c["sample_index"] for c in chat.calls] == [2, 3]
    assert again.cached and not first.cached and not other.cached
    assert (again.text, again.tokens_in, again.cost) == (first.text, first.tokens_in, first.cost)
    led = client.ledger.as_dict()
    assert (led["calls"], led["cached_calls"], led["cost"]) == (3, 1, 0.75)  # a replay spends the same budget
    # The cache is keyed by the request, not the transport: a client on a dead endpoint replays it.
    dead = LLMClient(
        LLMSettings(**{**vars(s), "base_url": "http://127.0.0.1:9/v1", "max_retries": 0}),
    )
    (replayed,) = run(dead, call(sample_index=2))
    assert replayed.cached and replayed.text == "remembered"


def test_the_concurrency_limit_holds_for_the_callers_client():
    chat = Mine("ok", latency=0.05)
    client = LLMClient(settings(concurrency=3), transport=ChatTransport(chat))
    (answers,) = run(client, lambda c: asyncio.gather(*[c.complete(MSG, sample_index=i) for i in range(12)]))
    assert len(answers) == 12 and chat.most_in_flight == 3 and client.ledger.in_flight == 0


def test_an_exception_of_the_callers_client_is_retried_like_a_server_error():
    chat = Mine(RuntimeError("socket closed"), "second try")
    client = LLMClient(settings(), transport=ChatTransport(chat))
    (answer,) = run(client, call())
    assert answer.text == "second try" and counts(client) == (1, 1, 0) and len(chat.calls) == 2


@pytest.mark.parametrize(
    "step, latency, what",
    [
        (RuntimeError("boom"), 0.01, r"failed after 2 retries \(RuntimeError: boom\)"),
        ("late", 1.0, r"timed out after 2 retries \(no answer within 0.2s\) \(raise llm.timeout_s"),
        (None, 0.01, r"sent malformed replies after 2 retries \(dict is not a Completion"),
    ],
)
def test_a_call_that_spends_its_retries_fails_alone_with_one_line(step, latency, what):
    chat = Mine(step, latency=latency)
    client = LLMClient(settings(), transport=ChatTransport(chat))
    with pytest.raises(CallFailed, match=r"^llm: the caller's Mine " + what) as err:
        run(client, call())
    assert "\n" not in str(err.value)
    assert len(chat.calls) == 3 and counts(client) == (0, 2, 1) and client.down is None


def test_call_failed_from_the_callers_client_fails_the_call_without_retry():
    chat = Mine(CallFailed("mine: prompt too long"), "fine")
    client = LLMClient(settings(), transport=ChatTransport(chat))
    with pytest.raises(CallFailed, match="prompt too long"):
        run(client, call())
    (answer,) = run(client, call(sample_index=1))
    assert answer.text == "fine" and len(chat.calls) == 2 and counts(client) == (1, 0, 1)


def test_llm_down_from_the_callers_client_puts_the_client_down():
    chat = Mine(LLMDown("mine: the key was revoked"), "never asked")

    async def twice(c):
        for i in range(2):
            with pytest.raises(LLMDown, match="key was revoked"):
                await c.complete(MSG, sample_index=i)

    client = LLMClient(settings(), transport=ChatTransport(chat))
    run(client, twice)
    assert len(chat.calls) == 1 and client.down == "mine: the key was revoked"


def test_a_callers_client_that_never_answers_puts_the_client_down_after_give_up_after_s():
    chat = Mine(RuntimeError("unreachable"))
    client = LLMClient(settings(max_retries=1000, give_up_after_s=0.2), transport=ChatTransport(chat))
    with pytest.raises(LLMDown, match=r"^llm: the caller's Mine answered no call for \d+s \(last: Runtime"):
        run(client, call())
    assert client.down is not None and len(chat.calls) > 3


def test_a_callers_client_never_imports_openai():
    """Only the HTTP transport imports openai (~0.7 s): a run on the caller's client never pays it."""
    code = textwrap.dedent(
        """
        import asyncio, sys
        from qd.contract import Completion
        from qd.llm import ChatTransport, LLMClient, LLMSettings, ModelSpec

        class Echo:
            def pick_model(self, rng):
                return "echo"

            async def complete(self, messages, *, model=None, **kw):
                return Completion(messages[-1]["content"], model, 1, 1, 0.0, False, "stop", 0.0)

        client = LLMClient(LLMSettings(None, (ModelSpec("echo"),)), transport=ChatTransport(Echo()))
        answer = asyncio.run(client.complete([{"role": "user", "content": "ping"}]))
        assert answer.text == "ping" and client.ledger.calls == 1
        assert "openai" not in sys.modules and "httpx2" not in sys.modules, "openai imported"
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
