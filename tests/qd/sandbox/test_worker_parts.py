"""The worker's parts: standard library only, loaded from their own folder, and the host imports none
of them; the frame protocol both sides speak round-trips."""

import ast
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import qd.sandbox.pool
from qd.sandbox import Sandbox, protocol

FOLDER = Path(qd.sandbox.pool.__file__).parent
QD = FOLDER.parent
# The host's side of the folder: the worker must never import these (nor the host the others).
HOST_SIDE = {"__init__", "pool", "cluster"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in ``path``: level 0 absolute, 1 relative to its folder."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def worker_parts() -> set[str]:
    """The modules the worker loads: ``worker.py``, ``serve`` (which it imports by name) and
    every sibling they import, transitively."""
    parts, todo = {"worker"}, ["worker", "serve"]
    while todo:
        name = todo.pop()
        parts.add(name)
        todo += [m for level, m in imports(FOLDER / f"{name}.py") if level == 1 and m not in parts]
    return parts


def test_the_worker_imports_only_the_standard_library_and_its_own_folder():
    parts = worker_parts()
    assert {"serve", "child", "supervise", "model_calls", "isolation", "protocol"} <= parts
    assert not parts & HOST_SIDE
    for name in parts:
        for level, module in imports(FOLDER / f"{name}.py"):
            if level:
                assert level == 1 and (FOLDER / f"{module}.py").is_file(), (name, level, module)
            else:
                assert module.split(".")[0] in sys.stdlib_module_names, (name, module)


def test_the_evaluator_entry_imports_only_the_standard_library():
    """The entry the sandbox loads by path to run a user's evaluator (OpenEvolve's file, a shipped
    function): the host imports it too, for its ``outcome``."""
    found = imports(FOLDER / "evaluator_entry.py")
    assert found and all(level == 0 and m.split(".")[0] in sys.stdlib_module_names for level, m in found)


def test_no_host_module_imports_a_worker_part():
    """The host reaches the worker's side only through ``protocol`` (and ``worker.py``'s path)."""
    worker_only = {f"qd.sandbox.{name}" for name in worker_parts() - {"protocol"}}
    parts = {FOLDER / f"{name}.py" for name in worker_parts()}
    for path in QD.rglob("*.py"):
        if path in parts:
            continue
        for level, module in imports(path):
            assert level == 0 or path.parent != FOLDER or module in HOST_SIDE | {"protocol"}, (path, module)
            assert module not in worker_only, (path, module)


ENTRY = '''
import sys

def run(text):
    """Where every module this process holds was loaded from, and whether qd was imported."""
    files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
    return {"qd": "qd" in sys.modules, "files": files}
'''


def test_a_copy_of_the_worker_outside_the_repo_starts_under_python_I(tmp_path, monkeypatch):
    """The worker's files alone, copied elsewhere, serve runs: nothing is loaded from the
    repo, site-packages or ``qd/__init__``, and ``ModelCallError`` keeps its host name."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in worker_parts():
        shutil.copy(FOLDER / f"{name}.py", copy)
    (tmp_path / "probe_entry.py").write_text(ENTRY)
    monkeypatch.setattr(qd.sandbox.pool, "_WORKER", copy / "worker.py")
    sandbox = Sandbox(f"{tmp_path}/probe_entry.py:run", workers=1)
    try:
        assert sandbox.isolation()["rlimits"]
        result = asyncio.run(sandbox.run("x"))
    finally:
        sandbox.close()
    assert result.ok, result
    assert not result.value["qd"]
    files = {name: file for name, file in result.value["files"].items() if file}
    assert files["qd.sandbox.protocol"] == files["_qd_sandbox.protocol"] == str(copy / "protocol.py")
    stdlib = [os.path.dirname(os.__file__)]
    for name, file in files.items():
        assert file.startswith((str(copy), str(tmp_path / "probe_entry.py"), *stdlib)), (name, file)


frames = st.tuples(
    st.sampled_from([protocol.INIT, protocol.RUN, protocol.CALL, protocol.ANSWER, protocol.HELLO]),
    st.integers(0, 2**64 - 1),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    ),
)


@given(st.lists(frames, max_size=5))
def test_frames_read_back_as_written(sent):
    """What ``encode`` writes, ``read_frame`` reads back, frame by frame, then EOF."""
    with tempfile.TemporaryFile() as f:
        protocol.write_all(f.fileno(), b"".join(protocol.encode(*frame) for frame in sent))
        os.lseek(f.fileno(), 0, os.SEEK_SET)
        for kind, run_id, obj in sent:
            got_kind, got_id, body = protocol.read_frame(f.fileno())
            assert (got_kind, got_id, json.loads(body)) == (kind, run_id, obj)
        assert protocol.read_frame(f.fileno()) is None


@given(st.lists(frames, max_size=5), st.data())
def test_frames_taken_from_a_buffer_fed_in_pieces(sent, data):
    """A non-blocking reader (the pool, the worker's call relay) gets every frame whole, in
    order, however the bytes arrive; an incomplete frame stays in the buffer."""
    stream = b"".join(protocol.encode(*frame) for frame in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    buf, got = bytearray(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        buf += stream[start:end]
        while (frame := protocol.take_frame(buf)) is not None:
            got.append(frame)
    assert [(kind, run_id, json.loads(body)) for kind, run_id, body in got] == sent
    assert not buf


def test_a_frame_cut_short_reads_as_eof():
    """A worker or child that dies mid-frame leaves no half frame to act on."""
    frame = protocol.encode(protocol.REPLY, 7, {"ok": True})
    for cut in (3, protocol.HEADER.size, len(frame) - 1):
        with tempfile.TemporaryFile() as f:
            protocol.write_all(f.fileno(), frame[:cut])
            os.lseek(f.fileno(), 0, os.SEEK_SET)
            assert protocol.read_frame(f.fileno()) is None


@given(frames.map(lambda f: f[2]), st.text(max_size=20))
def test_a_clean_exits_result_is_forwarded_unread_and_judged_by_the_host(value, line):
    """The worker puts the child's result bytes behind the reply as they are (decoding and
    re-encoding the values cost it a quarter of its pages per run); the host's verdict is the
    one the worker used to give."""
    from qd.sandbox.supervise import _Capture, run_reply

    result = json.dumps({"value": value}).encode()
    out = _Capture(64)
    out += line.encode()
    message, forwarded = run_reply((None, 0, 0.01, (out, _Capture(64), bytearray(result))), 0.5, {})
    assert forwarded == result  # the very bytes, not a re-encoding
    kind, run_id, body = protocol.take_frame(bytearray(protocol.pack_reply(3, message, forwarded)))
    reply = protocol.read_reply(body)
    assert (kind, run_id, reply["ok"], reply["value"]) == (protocol.REPLY, 3, True, value)
    assert reply["stdout"] == line
    garbage = protocol.read_reply(protocol.pack_reply(3, message, b"{not json")[protocol.HEADER.size :])
    assert not garbage["ok"] and garbage["error"].startswith("result is not JSON")
    failed, none = run_reply((None, 256, 0.01, (out, _Capture(64), bytearray(result))), 0.5, {})
    assert none == b"" and failed["error"] == "exited with code 1"
