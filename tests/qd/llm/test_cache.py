"""qd.llm.cache: answers kept by what determines them, under keys that never change between versions."""

import dataclasses
import json

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


ANSWER = Completion("text", "m", 3, 4, 0.5, False, "stop", 0.1, top_logprobs=[{"a": -0.5}])


def test_an_answer_is_kept_whole_and_read_back_as_cached_by_this_cache_and_the_next(tmp_path):
    cache = ResponseCache(tmp_path)
    key = ResponseCache.key(REQUEST, 1, 2)
    assert cache.get(key) is None
    cache.put(key, ANSWER)
    assert cache.get(key) == dataclasses.replace(ANSWER, cached=True)
    cache.close()
    assert ResponseCache(tmp_path).get(key) == dataclasses.replace(ANSWER, cached=True)  # a rerun's
    (log,) = tmp_path.iterdir()
    assert log.read_bytes().startswith(f"{key} {{".encode()) and log.read_bytes().endswith(b"}\n")


def test_each_process_appends_to_a_log_of_its_own_and_reads_the_others_at_open(tmp_path):
    """Two caches open on one folder write two logs (no file has two writers); a third, opened
    later, reads both; what one writes after another opened is not seen by it."""
    first, second = ResponseCache(tmp_path), ResponseCache(tmp_path)
    keys = [ResponseCache.key(REQUEST, 1, i) for i in range(3)]
    first.put(keys[0], ANSWER)
    second.put(keys[1], dataclasses.replace(ANSWER, text="other"))
    assert len(list(tmp_path.glob("answers-*.log"))) == 2
    assert first.get(keys[1]) is None  # written after the first opened
    third = ResponseCache(tmp_path)
    assert [third.get(k).text if third.get(k) else None for k in keys] == ["text", "other", None]


def test_a_line_cut_short_by_a_crash_is_a_miss_and_the_lines_before_it_are_kept(tmp_path):
    cache = ResponseCache(tmp_path)
    kept, cut = ResponseCache.key(REQUEST, 1, 0), ResponseCache.key(REQUEST, 1, 1)
    cache.put(kept, ANSWER)
    cache.put(cut, ANSWER)
    cache.close()
    (log,) = tmp_path.iterdir()
    log.write_bytes(log.read_bytes()[:-10])  # killed in the middle of its last write
    reopened = ResponseCache(tmp_path)
    assert reopened.get(kept) == dataclasses.replace(ANSWER, cached=True) and reopened.get(cut) is None
    reopened.put(cut, ANSWER)  # asked again: a log of its own, after the cut line
    assert ResponseCache(tmp_path).get(cut) == dataclasses.replace(ANSWER, cached=True)


def test_a_cache_written_as_one_file_per_answer_still_replays(tmp_path):
    """The layout before the logs: ``<key[:2]>/<key>.json``; a file that does not parse is a miss."""
    key, broken = ResponseCache.key(REQUEST, 1, 2), ResponseCache.key(REQUEST, 1, 3)
    (tmp_path / key[:2]).mkdir()
    fields = {f.name: getattr(ANSWER, f.name) for f in dataclasses.fields(ANSWER)}
    (tmp_path / key[:2] / f"{key}.json").write_text(json.dumps(fields))
    (tmp_path / broken[:2]).mkdir(exist_ok=True)
    (tmp_path / broken[:2] / f"{broken}.json").write_text("{half a fi")
    cache = ResponseCache(tmp_path)
    assert cache.get(key) == dataclasses.replace(ANSWER, cached=True) and cache.get(broken) is None
