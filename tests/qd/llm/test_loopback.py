"""qd.llm.loopback: the lean loopback path sends what openai's own path would."""

import json

import openai
from openai._models import FinalRequestOptions

from qd.llm.loopback import LoopbackOpenAI


def test_loopback_requests_built_from_the_kept_one_are_what_openai_builds():
    """Only the first chat request is built by openai; later ones reuse its URL and headers
    with their own body: byte for byte what openai itself would have sent."""
    kwargs = dict(base_url="http://127.0.0.1:9/v1", api_key="sk-test", max_retries=0, timeout=5.0)
    lean, plain = LoopbackOpenAI(**kwargs), openai.AsyncOpenAI(**kwargs)
    for body in ({"model": "m", "messages": [{"role": "user", "content": "é 1"}]}, {"model": "m", "seed": 7}):
        options = FinalRequestOptions.construct(method="post", url="/chat/completions", json_data=body)
        got, want = lean._build_request(options), plain._build_request(options)
        assert (got.method, got.url, got.extensions) == (want.method, want.url, want.extensions)
        assert sorted(got.headers.raw) == sorted(want.headers.raw)
        assert (
            got.read() == want.read() == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        )
    assert len(lean._kept) == 1
    extra = FinalRequestOptions.construct(
        method="post", url="/chat/completions", json_data={"a": 1}, headers={"x-extra": "1"}
    )
    assert lean._build_request(extra).headers["x-extra"] == "1" and len(lean._kept) == 1  # built by openai


def test_an_openai_without_the_private_pieces_takes_the_public_path_on_the_same_wire(
    scripted_llm, monkeypatch
):
    """Where openai lacks what the shortcut uses, qd uses only its public API (``http_client=``,
    ``post``): the same request reaches the server and the same answer comes back."""
    from helpers import call, run
    from scripted_llm import Rule

    from qd.llm import LLMClient, LLMSettings, ModelSpec, loopback

    server = scripted_llm([Rule("", reply="same")])
    answers = []
    for options in (loopback._OPTIONS, None):
        monkeypatch.setattr(loopback, "_OPTIONS", options)
        llm = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("m"),), seed=3))
        assert isinstance(llm._transport._client, LoopbackOpenAI) == (options is not None)
        answers += [c.text for c in run(llm, call())]
    assert answers == ["same", "same"] and server.requests[0] == server.requests[1]
    assert loopback.httpx.AsyncClient in openai.DefaultAsyncHttpxClient.__mro__  # the library openai is on
