"""qd.llm.cache: answers kept by what determines them, under keys that never change between versions."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from qd.llm import Completion
from qd.llm.cache import ResponseCache

REQUEST = {
    "model": "m",
    "messages": [{"role": "user", "content": "hello"}],
    "temperature": 0.8,
    "max_tokens": 512,
}


def test_keys_are_those_earlier_versions_wrote():
    """A cache written before this layout still replays: the keys below are the old client's."""
    asked = {**REQUEST, "messages": [{"role": "user", "content": "héllo"}], "stop": ["\n"], "seed": 123}
    asked |= {"logprobs": True, "top_logprobs": 3}
    assert (
        ResponseCache.key(asked, 7, 5) == "2ff9fd93f38a0cf226581088bde8d92e565a440b03152cfc285c69bc323d4a11"
    )
    assert (
        ResponseCache.key(REQUEST, None, 0)
        == "e11b5157060ea3f44b6a344f903c812ed2ce9b0f63b5acd69b65ec3ceeddd499"
    )


@given(seed=st.none() | st.integers(-5, 5), index=st.integers(0, 5), other=st.integers(0, 5))
def test_a_key_changes_with_the_seed_and_the_sample(seed, index, other):
    assert (ResponseCache.key(REQUEST, seed, index) == ResponseCache.key(REQUEST, seed, other)) == (
        index == other
    )
    assert ResponseCache.key(REQUEST, seed, index) != ResponseCache.key(REQUEST, 99, index)


def test_an_answer_is_kept_whole_and_read_back_as_cached(tmp_path):
    cache = ResponseCache(tmp_path)
    key = ResponseCache.key(REQUEST, 1, 2)
    assert cache.get(key) is None
    answer = Completion("text", "m", 3, 4, 0.5, False, "stop", 0.1, top_logprobs=[{"a": -0.5}])
    cache.put(key, answer)
    assert cache.get(key) == dataclasses.replace(answer, cached=True)
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")] == [f"{key[:2]}/{key}.json"]
    (tmp_path / key[:2] / f"{key}.json").write_text("{half a fi")
    assert cache.get(key) is None  # unreadable: a miss, written again after the call
