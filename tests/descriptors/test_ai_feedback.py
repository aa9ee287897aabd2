"""AI-feedback descriptor: scoring (logprob expectation, digit), strict parsing, failures, cache;
a real judge."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest
from scripted_llm import Rule

from descriptors.ai_feedback import AIFeedbackDescriptor, Axis, agreement, parse_score
from descriptors.base import Descriptor, Item
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.store import Store

TONE = Axis("tone", "How happy is the tone of this text?", "sad", "happy")
LENGTH = Axis("length", "How long is this text?", "short", "long", bins=5)
# Few-shot turns a 135M judge needs to answer one digit (positions 1.0, 0.1, 0.5 -> digits 9, 1, 5).
TONE_SHOTS = dataclasses.replace(
    TONE,
    examples=(
        ("What a beautiful morning, I feel great!", 1.0),
        ("I lost my job and I feel terrible.", 0.1),
        ("The meeting is at 3 pm.", 0.5),
    ),
)


def client_for(url: str, model: str = "judge", **kw) -> LLMClient:
    """Fast retries so failure tests stay quick."""
    base = dict(backoff_s=0.01, backoff_max_s=0.02, max_retries=1, timeout_s=5.0)
    return LLMClient(LLMSettings(base_url=url, models=(ModelSpec(model),), **{**base, **kw}))


def describe(d: AIFeedbackDescriptor, *batches: list[str]):
    """Describe each batch in turn on one event loop, then close the judge's client."""

    async def main():
        try:
            return [await d.describe([Item(t) for t in texts]) for texts in batches]
        finally:
            await d.client.aclose()

    return asyncio.run(main())


def lp(**probs: float) -> dict[str, float]:
    return {k.replace("_", " "): math.log(p) for k, p in probs.items()}


def test_logprob_expectation_per_axis(scripted_llm):
    # "_6" is the token " 6": the same answer as "6"; "The" is not a digit and drops out.
    sunny_tone = {"7": math.log(0.6), "8": math.log(0.2), " 6": math.log(0.1), "The": math.log(0.1)}
    server = scripted_llm(
        [
            Rule(r"happy[\s\S]*Text: sunny", reply="7", logprobs=[sunny_tone, lp(_=0.9)]),
            Rule(r"long[\s\S]*Text: sunny", reply="2", logprobs=[{"2": 0.0}]),
            Rule(
                r"happy[\s\S]*Text: rain",
                reply=" 1.",
                logprobs=[lp(_=0.8, _1=0.2), lp(**{"1": 0.5, "0": 0.5})],
            ),
            Rule(r"long[\s\S]*Text: rain", reply="9", logprobs=[lp(**{"9": 0.7, "10": 0.3})]),
        ]
    )
    d = AIFeedbackDescriptor([TONE, LENGTH], client_for(server.base_url))
    assert d.axis_names == ("tone", "length")  # what archive.json labels the axes with
    assert isinstance(d, Descriptor) and (d.name, d.dim, d.lower, d.upper, d.bins) == (
        "ai_feedback",
        2,
        (0.0, 0.0),
        (1.0, 1.0),
        (10, 5),
    )
    (out,) = describe(d, ["sunny day", "rain again"])
    expected = [[(7 * 0.6 + 8 * 0.2 + 6 * 0.1) / 0.9 / 9, 2 / 9], [0.5 / 9, 1.0]]
    np.testing.assert_allclose(out.values, expected, rtol=1e-6)
    assert out.values.dtype == np.float32 and out.valid.tolist() == [True, True] and out.error == [None, None]
    reqs = server.requests
    assert len(reqs) == 4 and all(r["logprobs"] is True and r["top_logprobs"] == 10 for r in reqs)
    assert all(r["temperature"] == 0.0 and r["max_tokens"] == 1 and r["model"] == "judge" for r in reqs)
    # The calls run concurrently, so their order on the server is not fixed.
    assert any("0 means sad and 9 means happy" in r["messages"][-1]["content"] for r in reqs)


@pytest.mark.parametrize("use_logprobs", [False, True], ids=["not-asked", "server-sent-none"])
def test_digit_when_no_logprobs(scripted_llm, use_logprobs):
    server = scripted_llm([Rule("Text: sunny", reply="8"), Rule("Text: rain", reply="0\nbecause")])
    d = AIFeedbackDescriptor([TONE], client_for(server.base_url), use_logprobs=use_logprobs)
    (out,) = describe(d, ["sunny", "rain"])
    np.testing.assert_allclose(out.values, [[8 / 9], [0.0]])
    assert out.valid.all() and ("logprobs" in server.requests[0]) == use_logprobs


@pytest.mark.parametrize(
    "answer", ["10", "0.5", "seven", "", "Answer: 7", "I cannot rate this text, as an AI."]
)
def test_unparseable_or_refused_answer_is_invalid(scripted_llm, answer):
    server = scripted_llm([Rule("Text: odd", reply=answer, logprobs=[lp(**{"1": 0.9})]), Rule("", reply="3")])
    d = AIFeedbackDescriptor([LENGTH, TONE], client_for(server.base_url))
    (out,) = describe(d, ["fine", "odd"])
    assert out.valid.tolist() == [True, False] and np.isnan(out.values[1]).all()
    assert out.error[0] is None
    reason = out.error[1]
    assert "\n" not in reason and reason.count("ai_feedback.") == 2  # both axes got the odd answer
    assert reason.startswith("ai_feedback.length: judge answered ") and "not one digit 0-9" in reason
    assert repr(answer[:4]).rstrip("'") in reason  # the judge's words, cut at max_tokens=1 (4 chars here)


def test_long_answer_is_truncated_in_reason(scripted_llm):
    server = scripted_llm([Rule("", reply="I cannot " + "really " * 40)])
    (out,) = describe(AIFeedbackDescriptor([TONE], client_for(server.base_url), max_tokens=100), ["x"])
    assert not out.valid[0] and "..." in out.error[0] and len(out.error[0]) < 140


def test_judge_error_invalidates_only_that_candidate(scripted_llm):
    server = scripted_llm([Rule("Text: broken", fault="500"), Rule("", reply="4")])
    client = client_for(server.base_url, max_retries=2)
    (out,) = describe(AIFeedbackDescriptor([TONE], client), ["broken", "fine"])
    assert out.valid.tolist() == [False, True] and out.values[1, 0] == pytest.approx(4 / 9)
    assert out.error[0].startswith("ai_feedback.tone: judge call failed (llm: ")
    assert "HTTP 500" in out.error[0] and "after 2 retries" in out.error[0] and "\n" not in out.error[0]
    assert server.stats()["requests"] == 3 + 1 and client.ledger.total().failed == 1


def test_cache_hit_sends_nothing(scripted_llm, tmp_path):
    server = scripted_llm(
        [Rule("Text: bad", reply="nope", times=1), Rule("", reply="6", logprobs=[lp(**{"6": 0.5, "7": 0.5})])]
    )
    store = Store(tmp_path / "s.sqlite")
    d = AIFeedbackDescriptor([TONE, LENGTH])
    d.attach(store.ports(), client_for(server.base_url))
    first, again = describe(d, ["a", "b", "a", "bad"], ["b", "a", "bad"])
    # a, b, bad (a duplicate in a batch is asked once) x 2 axes, then only the failed (bad, tone) again
    assert server.stats()["requests"] == 2 * 3 + 1
    assert first.valid.tolist() == [True, True, True, False] and again.valid.all()  # failures are not cached
    np.testing.assert_allclose(again.values[:2], first.values[[1, 0]])
    np.testing.assert_allclose(first.values[0], [6.5 / 9] * 2)
    store.close()

    with Store(tmp_path / "s.sqlite") as reopened:  # a resumed run: a fresh descriptor, the same store
        d2 = AIFeedbackDescriptor([TONE, LENGTH])
        d2.attach(reopened.ports(), client_for(server.base_url))
        (replay,) = describe(d2, ["bad", "a"])
    assert server.stats()["requests"] == 7
    np.testing.assert_allclose(replay.values, again.values[[2, 1]])

    other = AIFeedbackDescriptor([TONE, LENGTH], use_logprobs=False)  # another scoring mode: another key
    with Store(tmp_path / "s.sqlite") as reopened:
        other.attach(reopened.ports(), client_for(server.base_url))
        (plain,) = describe(other, ["a"])
    assert server.stats()["requests"] == 9
    np.testing.assert_allclose(plain.values, [[6 / 9, 6 / 9]])


def test_examples_become_answered_turns_on_the_scale():
    d = AIFeedbackDescriptor([TONE_SHOTS], scale=4)
    m = d.messages(TONE_SHOTS, "hello")
    assert [t["role"] for t in m] == ["user", "assistant"] * 3 + ["user"]
    assert [t["content"] for t in m[1::2]] == ["4", "0", "2"]  # 1.0, 0.1, 0.5 on 0..4
    assert m[-1]["content"].endswith("Text: hello") and "from 0 to 4" in m[-1]["content"]


@pytest.mark.parametrize(
    "text, top, scale, expected",
    [
        ("7", None, 9, 7.0),
        (" 7.", None, 9, 7.0),
        ("7 because it is cheerful", None, 9, 7.0),
        ("3", [{"3": math.log(0.5), " 3": math.log(0.25), "4": math.log(0.25)}], 9, 3.25),
        ("3", [{"3": 0.0}, {"x": 0.0}], 9, 3.0),
        ("3", [{"Hmm": 0.0}], 9, 3.0),  # no digit listed at the answer: the digit itself
        (" 5", [{" ": math.log(0.9), "5": math.log(0.1)}, {"5": math.log(0.5), "9": math.log(0.5)}], 9, 7.0),
        ("4", [{"4": math.log(0.5), "9": math.log(0.5)}], 4, 4.0),  # 9 is off a 0..4 scale
    ],
)
def test_parse_score(text, top, scale, expected):
    assert parse_score(text, top, scale) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["10", "-1", "5/9", "", "   ", "five", "I cannot help with that.", "7a", "³", "٣"]
)
def test_parse_score_rejects(text):
    assert parse_score(text, [{"1": 0.0}], 9) is None
    assert parse_score("6", None, 5) is None  # above the scale


def test_attach_supplies_the_client_and_bad_config_names_the_field(scripted_llm):
    server = scripted_llm([Rule("", reply="9")])
    d = AIFeedbackDescriptor([TONE])
    with pytest.raises(ValueError, match=r"^ai_feedback.client: no judge"):
        asyncio.run(d.describe([Item("x")]))
    d.attach(None, client_for(server.base_url, model="run-model"))
    (out,) = describe(d, ["x"])
    assert out.values[0, 0] == 1.0 and server.requests[0]["model"] == "run-model"

    for kwargs, field in [
        (dict(axes=[]), "axes"),
        (dict(scale=10), "scale"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(top_logprobs=21), "top_logprobs"),
        (dict(prompt="{question} {txt}"), "prompt"),
        (dict(prompt="{question} only"), "prompt"),
        (dict(axes=[TONE, TONE]), "axes"),
    ]:
        with pytest.raises(ValueError, match=rf"^ai_feedback.{field}: .*;"):
            AIFeedbackDescriptor(**{"axes": [TONE], **kwargs})
    with pytest.raises(ValueError, match=r"axis 'tone'.examples: position 1.5"):
        dataclasses.replace(TONE, examples=(("x", 1.5),))
    with pytest.raises(ValueError, match=r"axis.question: is empty"):
        Axis("a", " ", "lo", "hi")


def test_agreement_known_values():
    a = agreement([0.9, 0.8, 0.2, 0.6, float("nan")], [1, 1, 0, 0, 1])
    assert (a["n"], a["missing"]) == (4, 1)
    assert a["accuracy"] == 0.75 and a["auc"] == 1.0
    assert a["spearman"] == pytest.approx(np.corrcoef([4, 3, 1, 2], [3.5, 3.5, 1.5, 1.5])[0, 1])
    ordinal = agreement([0.1, 0.5, 0.9], [1, 2, 3])
    assert (
        ordinal["spearman"] == pytest.approx(1.0)
        and math.isnan(ordinal["accuracy"])
        and math.isnan(ordinal["auc"])
    )
    assert (
        math.isnan(agreement([0.5, 0.5], [0, 1])["spearman"]) and agreement([0.5, 0.5], [0, 1])["auc"] == 0.5
    )
    with pytest.raises(ValueError, match="agreement: scores has 2 entries, labels 1"):
        agreement([0.1, 0.2], [1])


def test_client_logprobs_are_parsed_cached_and_keyed(scripted_llm, tmp_path):
    """qd.llm's logprobs support: the request fields, the parsed shape, and the cache entry."""
    top = [{"5": math.log(0.7), "6": math.log(0.3)}, {".": 0.0}]
    server = scripted_llm([Rule("", reply="5.", logprobs=top)])
    msgs = [{"role": "user", "content": "q"}]

    async def calls(client: LLMClient):
        try:
            return [
                await client.complete(msgs, logprobs=True, top_logprobs=1),
                await client.complete(msgs, logprobs=True, top_logprobs=1),
                await client.complete(msgs),
            ]
        finally:
            await client.aclose()

    first, again, plain = asyncio.run(calls(client_for(server.base_url, cache_dir=str(tmp_path))))
    assert first.top_logprobs == [{"5": pytest.approx(math.log(0.7))}, {".": 0.0}]
    assert again.cached and again.top_logprobs == first.top_logprobs
    assert plain.top_logprobs is None and server.stats()["requests"] == 2  # logprobs are part of the key
    assert server.requests[0]["top_logprobs"] == 1 and "logprobs" not in server.requests[1]
    with pytest.raises(ValueError, match=r"^llm: top_logprobs=3 needs logprobs=True"):
        asyncio.run(client_for(server.base_url).complete(msgs, top_logprobs=3))


@pytest.mark.slow
def test_real_judge_parses_every_text(llama_server):
    """SmolLM2-135M as judge on clearly happy/sad sentences: every answer parses, and happy ones score
    higher."""
    texts = [
        ("I love sunny days with my friends!", 1),
        ("My dog died this morning and I cannot stop crying.", 0),
        ("We won the championship, best day ever!", 1),
        ("Everything feels hopeless and grey.", 0),
        ("The party was wonderful and everyone laughed.", 1),
        ("I failed the exam again and feel miserable.", 0),
    ]
    client = client_for(
        llama_server.base_url, model=llama_server.model, timeout_s=60.0, max_retries=2, concurrency=4
    )
    d = AIFeedbackDescriptor([TONE_SHOTS], client)
    (out,) = describe(d, [t for t, _ in texts])
    assert out.valid.all(), out.error
    assert ((out.values >= 0) & (out.values <= 1)).all()
    a = agreement(out.values[:, 0], [y for _, y in texts])
    print(f"\nSmolLM2-135M tone judge: scores {np.round(out.values[:, 0], 3).tolist()} agreement {a}")
    # The judge is deterministic (temperature 0, logprob expectation), so the spread comes from the
    # texts: measured on this set and 4 other sets of 3 happy + 3 sad sentences, each run twice
    # (identical): auc min 0.889 (8 of 9 pairs ordered), median 0.889, max 1.0; spearman min 0.683,
    # median 0.683, max 0.878; all 60 answers parsed. Floors: auc >= 0.75 (7 of 9), spearman >= 0.4.
    # (accuracy is not floored: every score falls in 0.34-0.46, below the 0.5 cut, so it is 0.5.)
    assert a["n"] == 6 and a["missing"] == 0
    assert a["auc"] >= 0.75 and a["spearman"] >= 0.4, a


def test_rescale_fits_each_axis_range_and_round_trips(scripted_llm):
    server = scripted_llm(
        [Rule("Text: a", reply="3"), Rule("Text: b", reply="4"), Rule("Text: c", reply="5")]
    )
    d = AIFeedbackDescriptor([TONE], client_for(server.base_url), rescale_at=(2,))

    async def go():
        before = await d.describe([Item("a"), Item("b")])
        assert d.needs_fit(2) and not d.needs_fit(1)
        await d.fit([Item("a"), Item("c")], np.random.default_rng(0))
        return before, await d.describe([Item("a"), Item("b"), Item("c")])

    before, after = asyncio.run(go())
    assert before.valid.all() and np.isnan(before.values).all()  # pending before the fit
    np.testing.assert_allclose(
        after.values[:, 0], [0.5 / 11, 0.5, 10.5 / 11], rtol=1e-5
    )  # 3..5 widened by 5%
    assert not d.needs_fit(100)
    restored = AIFeedbackDescriptor([TONE], client_for(server.base_url), rescale_at=(2,))
    restored.load_state_dict(d.state_dict())
    np.testing.assert_array_equal(asyncio.run(restored.describe([Item("b")])).values, after.values[1:2])


def test_quantile_rescale_puts_fitted_quantiles_on_bin_boundaries_and_is_monotone(scripted_llm):
    digits = {
        "a": 0,
        "b": 1,
        "c": 2,
        "d": 3,
        "e": 5,
        "f": 9,
        "g": 4,
        "h": 7,
    }  # a..f fitted; scores cluster low
    server = scripted_llm([Rule(f"Text: {t}$", reply=str(d)) for t, d in digits.items()])
    d = AIFeedbackDescriptor([LENGTH], client_for(server.base_url), rescale_at=(6,), rescale="quantile")

    async def go():
        await d.fit([Item(t) for t in "abcdef"], np.random.default_rng(0))
        return await d.describe([Item(t) for t in "abcdefgh"])

    out = asyncio.run(go())
    assert out.valid.all(), out.error
    # 6 fitted scores, 5 bins: the k/5 quantiles are the scores themselves, so each maps to k/5
    np.testing.assert_allclose(out.values[:6, 0], np.linspace(0, 1, 6), atol=1e-5)
    # bins are dense where scores cluster: digits 0..3 take 3 of the 5 bins, 3..9 the other 2
    by_digit = sorted(zip(digits.values(), out.values[:, 0]))
    assert all(a[1] < b[1] for a, b in zip(by_digit, by_digit[1:]))  # monotone, unfitted scores included
    np.testing.assert_allclose(out.values[6:, 0], [0.7, 0.8 + 0.2 * 2 / 4], atol=1e-5)  # linear between edges
    restored = AIFeedbackDescriptor(
        [LENGTH], client_for(server.base_url), rescale_at=(6,), rescale="quantile"
    )
    restored.load_state_dict(d.state_dict())
    np.testing.assert_array_equal(
        asyncio.run(restored.describe([Item("g"), Item("h")])).values, out.values[6:]
    )


def test_unknown_rescale_names_the_field():
    with pytest.raises(ValueError, match="ai_feedback.rescale: unknown 'rank'"):
        AIFeedbackDescriptor([TONE], rescale_at=(2,), rescale="rank")
