"""The sandbox contains hostile candidates and keeps serving; nothing they start survives."""

import asyncio
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from qd.sandbox import Limits, Sandbox

REPO = Path(__file__).resolve().parents[3]
STARTUP_S = 60  # how long a test waits for a run to start (see until_started)
LIMITS = Limits(wall_s=1.5, cpu_s=5, memory_mb=512, file_mb=4, nproc=16, output_kb=4, output_cap_mb=1)
ENTRY = """
def run(text, **args):
    ns = {}
    exec(compile(text, "candidate", "exec"), ns)
    return ns["main"](**args)
"""
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    path = tmp_path_factory.mktemp("sbx") / "sbx_entry.py"
    path.write_text(ENTRY)
    return f"{path}:run"


@pytest.fixture(scope="module")
def sandbox(entry):
    sb = Sandbox(entry, workers=2, limits=LIMITS)
    yield sb
    sb.close()


def run(sb: Sandbox, code: str, **args):
    return asyncio.run(sb.run(textwrap.dedent(code), args))


def marker() -> str:
    """A unique `sleep` argument to find a process by its command line."""
    return f"{40 + random.random():.12f}"


def processes() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (parent pid, uid, command line) of every process."""
    table = {}
    for proc in filter(lambda p: p.name.isdigit(), Path("/proc").iterdir()):
        try:
            stat, status = (proc / "stat").read_text(), (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        table[int(proc.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), uid, cmdline)
    return table


def leftovers(mark: str | None = None) -> list[int]:
    """Processes with ``mark`` in their command line, or running as a sandbox uid (61000
    and up) outside any worker of another process (sandboxes elsewhere use these uids too)."""
    table, found = processes(), []
    for pid, (_, uid, cmdline) in table.items():
        chain, up = [], table[pid][0]
        while up in table and up not in chain:
            chain.append(up)
            up = table[up][0]
        foreign = os.getpid() not in chain and any(b"sandbox/worker.py" in table[a][2] for a in chain)
        if (mark and mark.encode() in cmdline) or (61000 <= uid < 65000 and not foreign):
            found.append(pid)
    return found


def worker_pids() -> set[int]:
    """This process's sandbox workers."""
    return {
        pid
        for pid, (parent, _, cmdline) in processes().items()
        if parent == os.getpid() and b"sandbox/worker.py" in cmdline
    }


def assert_clean_and_serving(sb: Sandbox, mark: str | None = None) -> None:
    deadline = time.monotonic() + 3.0
    while (left := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"
    result = run(sb, "def main(): return 'fine'")
    assert (result.ok, result.value) == (True, "fine"), result


def test_args_and_return_value_round_trip_as_json(sandbox):
    payload = [1, 2.5, "é", None, {"k": True}]
    result = run(
        sandbox,
        """
        import os
        def main(x, label):
            print("hello", label)
            return {"x": x, "label": label, "cwd_empty": os.listdir(".") == []}
        """,
        x=payload,
        label="a",
    )
    assert result.ok and result.error is None, result
    assert result.value == {"x": payload, "label": "a", "cwd_empty": True}
    assert result.stdout == "hello a\n" and result.seconds > 0


def test_exception_gives_type_message_and_traceback(sandbox):
    result = run(sandbox, "def main():\n    return 1 / 0")
    assert not result.ok and result.value is None
    assert result.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in result.stderr and 'File "candidate", line 2, in main' in result.stderr


THEN_CODE = """
import os, sys
def main(k):
    if k == 3:
        raise ValueError("three")
    if k == 4:
        sys.exit(5)
    return [k, os.getpid()]
"""


def test_args_passed_again_are_encoded_once_and_again_once_changed(sandbox):
    """A cascade passes the same args dicts run after run: their JSON is made once; a dict
    changed in place between runs reaches the child as it is now."""
    from qd.sandbox.pool import _ArgsJSON

    encode, args = _ArgsJSON(), {"xs": [1.5, 2]}
    assert encode(args) is not encode(args)  # copied the second time it comes, a hit from the third
    assert encode(args) is encode(args) and json.loads(encode(args)) == args
    text = "def main(xs):\n    return sum(xs)"
    first = asyncio.run(sandbox.run(text, args, then=[args]))
    args["xs"].append(4)
    second = asyncio.run(sandbox.run(text, args, then=[args]))
    assert (first.value, first.then, second.value, second.then) == (3.5, [3.5], 7.5, [7.5])
    with pytest.raises(TypeError):
        asyncio.run(sandbox.run(text, {"xs": {1, 2}}))


def test_args_made_fresh_for_each_run_are_never_copied(monkeypatch):
    """A caller that builds its args per run (a Ray node unpickles them per call) pays their
    encoding only: the memo's copy is for an object seen again."""
    from qd.sandbox import pool

    copies = []
    real = pool.copy.deepcopy
    monkeypatch.setattr(pool.copy, "deepcopy", lambda x: copies.append(1) or real(x))
    encode = pool._ArgsJSON()
    kept = [{"xs": [float(i)]} for i in range(100)]  # alive together: no id is reused
    assert [json.loads(encode(a)) for a in kept] == kept and copies == []
    encode(kept[-1])
    assert copies == [1]


def test_then_calls_the_entry_again_in_the_same_process_until_one_fails(sandbox):
    text = textwrap.dedent(THEN_CODE)
    result = asyncio.run(sandbox.run(text, {"k": 0}, then=[{"k": 1}, {"k": 2}]))
    assert result.ok and result.then_error is None
    assert [result.value[0], *(v[0] for v in result.then)] == [0, 1, 2]
    assert len({result.value[1], *(v[1] for v in result.then)}) == 1  # one process
    failed = asyncio.run(sandbox.run(text, {"k": 0}, then=[{"k": 1}, {"k": 3}, {"k": 2}]))
    assert failed.ok and [v[0] for v in failed.then] == [1]  # the calls up to the failure
    assert failed.then_error == "ValueError: three" and "Traceback" in failed.stderr
    exited = asyncio.run(sandbox.run(text, {"k": 0}, then=[{"k": 4}]))
    assert exited.ok and exited.then == [] and exited.then_error == "exited with code 5 (sys.exit)"
    first = asyncio.run(sandbox.run(text, {"k": 3}, then=[{"k": 1}]))  # the first call failed: a failed run
    assert not first.ok and first.error == "ValueError: three" and first.then is None
    plain = run(sandbox, THEN_CODE, k=1)
    assert plain.ok and plain.then is None and plain.then_error is None


def test_module_entry():
    with_module = Sandbox("json:dumps", workers=1, limits=LIMITS)
    try:
        result = asyncio.run(with_module.run("hi", {"indent": 2}))
        assert result.ok and result.value == json.dumps("hi")
    finally:
        with_module.close()


@pytest.mark.parametrize(
    "entry_text, problem",
    [
        ("no_colon_here", "names no function"),
        ("missing_file.py:run", "no file"),
        ("not a module:run", "neither a .py file nor a module name"),
    ],
)
def test_malformed_entry_fails_at_construction(entry_text, problem):
    with pytest.raises(ValueError, match=f"^entry: .*{problem}"):
        Sandbox(entry_text)


@pytest.mark.parametrize(
    "source, entry_name, problem",
    [
        ("def other(text): pass\n", "run", "has no function run"),
        ("raise RuntimeError('boom')\n", "run", "importing .* failed: RuntimeError: boom"),
    ],
)
def test_broken_entry_fails_at_first_use(tmp_path, source, entry_name, problem):
    path = tmp_path / "sbx_broken.py"
    path.write_text(source)
    sb = Sandbox(f"{path}:{entry_name}", workers=1, limits=LIMITS)
    try:
        for _ in range(2):  # and stays failed
            with pytest.raises(ValueError, match=f"^entry: .*{problem}"):
                asyncio.run(sb.run("x"))
        with pytest.raises(ValueError, match="^entry: "):
            sb.isolation()
    finally:
        sb.close()


def test_isolation_report(sandbox):
    report = sandbox.isolation()
    expected = {
        "rlimits",
        "process_group",
        "pid_namespace",
        "network_off",
        "private_tmp",
        "private_proc",
        "read_only_fs",
        "unprivileged_uid",
        "user_namespace",
    }
    assert set(report) == expected and all(isinstance(v, bool) for v in report.values())
    if ROOT:  # CI runs as root with namespaces available: everything but the user namespace
        assert report == dict.fromkeys(expected - {"user_namespace"}, True) | {"user_namespace": False}


@pytest.mark.parametrize("body", ["while True:\n        pass", "import time\n    time.sleep(1000)"])
def test_endless_loop_times_out(sandbox, body):
    result = run(sandbox, f"def main():\n    {body}")
    assert result.error == "timeout after 1.5 s (killed)" and not result.ok
    assert_clean_and_serving(sandbox)


def test_cpu_limit(entry):
    sb = Sandbox(entry, workers=1, limits=Limits(wall_s=20, cpu_s=1))
    try:
        result = run(sb, "def main():\n    while True:\n        pass")
        assert result.error == "cpu time limit (1 s)"
    finally:
        sb.close()


def test_unbounded_allocation_hits_memory_limit(sandbox):
    result = run(
        sandbox,
        """
        def main():
            hoard = []
            while True:
                hoard.append(bytearray(10 ** 7))
        """,
    )
    assert result.error == "memory limit (512 MB)" and "MemoryError" in result.stderr
    assert_clean_and_serving(sandbox)


def test_fork_bomb_is_contained(sandbox):
    result = run(
        sandbox,
        """
        import os
        def main():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """,
    )
    assert result.error == "timeout after 1.5 s (killed)"
    assert_clean_and_serving(sandbox)


def test_process_count_limit(sandbox):
    result = run(
        sandbox,
        """
        import os, time
        def main():
            for n in range(100):
                try:
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                except OSError as e:
                    return [n, type(e).__name__]
        """,
    )
    assert result.ok and result.value[1] == "BlockingIOError" and result.value[0] < LIMITS.nproc
    assert_clean_and_serving(sandbox)  # the sleeping children died with the run


@pytest.mark.parametrize("call", ["os.kill(os.getppid(), 9)", "os.kill(-1, 9)", "os.killpg(0, 9)"])
def test_killing_parent_or_everything_hurts_nobody_else(sandbox, call):
    result = run(sandbox, f"import os\ndef main():\n    {call}\n    return 'survived'")
    # Either the kill is refused (other uid, nothing to signal) or it reached only the
    # candidate's own processes; "sandbox worker died" would mean it got out.
    assert result.value == "survived" or result.error.startswith(
        ("PermissionError", "ProcessLookupError", "killed by SIGKILL")
    ), result
    assert_clean_and_serving(sandbox)


def test_writes_outside_the_working_directory_do_not_reach_the_host(sandbox, tmp_path):
    report = sandbox.isolation()
    if not (report["private_tmp"] and report["read_only_fs"]):
        pytest.skip("no private /tmp and read-only filesystem here")
    token = f"sbx_{random.randrange(10**9)}"
    outside = [
        "../" + token,
        str(REPO / token),
        str(tmp_path / token),
        f"/tmp/{token}",
        f"/dev/shm/{token}",
        f"/var/tmp/{token}",
    ]
    result = run(
        sandbox,
        """
        def main(paths):
            done = {}
            for path in paths:
                try:
                    with open(path, "w") as f:
                        f.write("x")
                    done[path] = "written"
                except OSError as e:
                    done[path] = type(e).__name__
            return done
        """,
        paths=["inside.txt", *outside],
    )
    assert result.ok and result.value["inside.txt"] == "written"
    for path in [f"/tmp/{token}", *outside[1:]]:
        assert not os.path.exists(path), f"{path} appeared on the host ({result.value})"
    again = run(
        sandbox,
        "import os\ndef main(paths):\n    return [p for p in paths if os.path.exists(p)]",
        paths=["inside.txt", f"/tmp/{token}", f"/dev/shm/{token}"],
    )
    assert again.value == []  # the next run (on the same worker: the idle list is LIFO) finds nothing
    assert_clean_and_serving(sandbox)


def test_file_size_limit(sandbox):
    result = run(sandbox, "def main():\n    open('big', 'wb').write(bytes(5 << 20))")
    assert result.error == "OSError: [Errno 27] File too large"


def test_printing_gigabytes_is_cut_off(sandbox):
    result = run(
        sandbox,
        """
        import sys
        def main():
            while True:
                sys.stdout.write("x" * 65536)
        """,
    )
    assert result.error == "output limit (1 MB)"
    assert len(result.stdout) < 2 * 4096 + 100 and "bytes cut]" in result.stdout
    assert_clean_and_serving(sandbox)


def test_long_output_keeps_head_and_tail(sandbox):
    result = run(sandbox, "def main():\n    for i in range(20000):\n        print('line', i)")
    assert result.ok
    assert result.stdout.startswith("line 0\n") and result.stdout.endswith("line 19999\n")
    assert re.search(r"\.\.\. \[\d+ bytes cut\] \.\.\.", result.stdout)


def test_network_is_off(sandbox, entry):
    """A candidate cannot reach a server the test listens on, by loopback or by the
    host's own address, and sees no network interface but its own loopback. Fails
    (never skips) where the sandbox could not turn the network off."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0)
    code = """
        import socket
        def main(port, hosts=()):
            reached = []
            for host in hosts:
                try:
                    socket.create_connection((host, port), timeout=1).close()
                    reached.append(host)
                except OSError:
                    pass
            if not hosts:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return "connected"
            return {"reached": reached, "interfaces": [n for _, n in socket.if_nameindex()]}
        """
    try:
        port = server.getsockname()[1]
        assert sandbox.isolation()["network_off"], (
            f"the sandbox could not turn the network off here: {sandbox.isolation()}"
        )
        hosts = ["127.0.0.1"]
        try:  # the host's address on its default route, if it has one (no packet is sent)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect(("192.0.2.1", 9))
                hosts.append(probe.getsockname()[0])
        except OSError:
            pass
        result = run(sandbox, code, port=port, hosts=hosts)
        assert result.ok, result
        assert result.value == {"reached": [], "interfaces": ["lo"]}, (hosts, result.value)
        result = run(sandbox, code, port=port)
        assert not result.ok and result.error.startswith(("OSError", "ConnectionRefusedError")), result
        with pytest.raises(BlockingIOError):
            server.accept()
        online = Sandbox(entry, workers=1, limits=Limits(wall_s=5, network=True))
        try:
            assert run(online, code, port=port).value == "connected"
            assert run(online, code, port=port, hosts=hosts).value["reached"] == hosts  # the probe works
            assert not online.isolation()["network_off"]
        finally:
            online.close()
    finally:
        server.close()


def test_daemon_left_behind_is_killed(sandbox):
    mark = marker()
    result = run(
        sandbox,
        """
        import os, time
        def main(mark):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["sleep", mark])
                os._exit(0)
            os.wait()
            for _ in range(100):  # see that the daemon really runs before returning
                for pid in filter(str.isdigit, os.listdir("/proc")):
                    try:
                        if mark in open(f"/proc/{pid}/cmdline").read():
                            return "daemon running"
                    except OSError:
                        pass
                time.sleep(0.01)
        """,
        mark=mark,
    )
    assert result.value == "daemon running", result
    assert_clean_and_serving(sandbox, mark)


def test_nothing_of_a_run_reaches_the_next_one(sandbox):
    """The next run's child is forked only once this run's processes are dead and its files
    deleted: a daemon that plants files and kills every process it can never meets it."""
    report = sandbox.isolation()
    if not (report["pid_namespace"] or report["unprivileged_uid"]):
        pytest.skip("the daemon would kill this user's processes")
    first = run(
        sandbox,
        """
        import os, time
        def main():
            spared = {os.getpid()}
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    spared.add(os.getpid())
                    for _ in range(1000):
                        for path in ("planted", "/tmp/planted"):
                            try:
                                open(path, "w").close()
                            except OSError:
                                pass
                        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
                            if pid not in spared:
                                try:
                                    os.kill(pid, 9)
                                except OSError:
                                    pass
                        time.sleep(0.005)
                os._exit(0)
            os.wait()
            while not os.path.exists("planted"):
                time.sleep(0.005)
            return "at work"
        """,
    )
    assert first.value == "at work", first
    # On the same worker (the idle list is LIFO), long enough for a surviving daemon to strike.
    second = run(
        sandbox,
        """
        import os, time
        def main():
            time.sleep(0.2)
            return [path for path in ("planted", "/tmp/planted") if os.path.exists(path)]
        """,
    )
    assert (second.ok, second.value) == (True, []), second
    assert_clean_and_serving(sandbox)


def test_requests_and_replies_larger_than_the_pipes(sandbox):
    data = random.randbytes(3 << 19).hex()  # request: 3 MB; reply: 512 KB
    result = run(sandbox, "def main(data):\n    return [len(data), data[:1 << 19]]", data=data)
    assert (result.ok, result.value) == (True, [3 << 20, data[: 1 << 19]]), result.error


def leaves_below(root: int) -> list[int]:
    """The processes below ``root`` that have no children of their own."""
    table, below, todo = processes(), set(), [root]
    while todo:
        up = todo.pop()
        kids = [pid for pid, (parent, _, _) in table.items() if parent == up]
        below.update(kids)
        todo += kids
    return [pid for pid in below if not any(table[kid][0] == pid for kid in below)]


def exited(pid: int) -> bool:
    """Gone, or a zombie (its descriptors closed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_a_waiting_child_killed_from_outside_is_replaced(entry):
    """Each run's child is forked, and waits for its request, before the request is sent; one
    killed meanwhile (by the OOM killer, say) is replaced, and the run does not notice."""
    before = worker_pids()
    sb = Sandbox(entry, workers=1, limits=LIMITS)
    try:
        assert run(sb, "def main(): return 1").value == 1
        (worker,) = worker_pids() - before
        deadline = time.monotonic() + 5
        while not (waiting := leaves_below(worker)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting, "no child waiting for the next run"
        for pid in waiting:
            os.kill(pid, 9)
        while not all(map(exited, waiting)):
            time.sleep(0.01)
        result = run(sb, "def main(): return 2")
        assert (result.ok, result.value) == (True, 2), result
        assert_clean_and_serving(sb)
    finally:
        sb.close()


def test_segfault(sandbox):
    result = run(sandbox, "import ctypes\ndef main():\n    ctypes.string_at(0)")
    assert result.error == "killed by SIGSEGV"
    assert_clean_and_serving(sandbox)


@pytest.mark.parametrize(
    "call, error",
    [
        ("sys.exit(3)", "exited with code 3"),
        ("os._exit(0)", "exited with code 0 without a result"),
    ],
)
def test_exit_without_result(sandbox, call, error):
    result = run(sandbox, f"import os, sys\ndef main():\n    print('bye')\n    {call}")
    assert result.error == error and not result.ok
    assert result.stdout == "bye\n"


def test_closed_result_pipe(sandbox):
    result = run(sandbox, "import os\ndef main():\n    os.closerange(3, 1 << 16)\n    return 1")
    assert result.error == "exited with code 0 without a result"
    assert "could not write the result" in result.stderr
    assert_clean_and_serving(sandbox)


def test_garbage_on_result_pipe(sandbox):
    result = run(
        sandbox,
        """
        import os
        def main():
            for fd in range(3, 1 << 11):
                try:
                    os.write(fd, b"garbage{")
                except OSError:
                    pass
            return 1
        """,
    )
    assert result.error.startswith("result is not JSON: ")
    assert_clean_and_serving(sandbox)


def test_return_value_that_is_not_json(sandbox):
    result = run(sandbox, "def main():\n    return {1, 2}")
    assert result.error == "result is not JSON: TypeError: Object of type set is not JSON serializable"


def test_huge_return_value(sandbox):
    result = run(sandbox, "def main():\n    return 'x' * (3 << 20)")
    assert result.error == "result too large (> 1 MB)"
    assert_clean_and_serving(sandbox)


def test_parallel_runs_share_the_workers(sandbox):
    code = (
        "import time\ndef main(i):\n    start = time.time()\n    time.sleep(0.3)\n"
        "    return [i, start, time.time()]"
    )

    async def many():
        return await asyncio.gather(*(sandbox.run(code, {"i": i}) for i in range(8)))

    results = asyncio.run(many())
    assert all(r.ok for r in results) and [r.value[0] for r in results] == list(range(8))
    spans = [r.value[1:] for r in results]
    most = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert most <= 2  # never more runs at once than workers


async def until_started(mark: str | None = None) -> None:
    """Waits for a run's processes to appear. A worker's first run can take tens of seconds to
    start on a loaded machine (a CI run beside other jobs): the runs waited for sleep longer."""
    deadline = time.monotonic() + STARTUP_S
    while not leftovers(mark) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert leftovers(mark), "the run never started"


def test_cancelled_run_kills_its_process_tree(entry):
    sb = Sandbox(entry, workers=1, limits=Limits(wall_s=3 * STARTUP_S))
    mark = marker()
    code = f"""
import os, time
def main():
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{mark}"])
    time.sleep({2 * STARTUP_S})
"""

    async def start_then_cancel():
        task = asyncio.create_task(sb.run(code))
        await until_started(mark)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        follow = await sb.run("def main(): return 'next'")  # sent while the kill may be under way
        assert follow.value == "next", follow

    try:
        asyncio.run(start_then_cancel())
        assert_clean_and_serving(sb, mark)
    finally:
        sb.close()


def test_dead_worker_gives_an_error_and_is_replaced(entry):
    before = worker_pids()
    sb = Sandbox(entry, workers=1, limits=Limits(wall_s=3 * STARTUP_S))

    async def kill_worker_mid_run():
        task = asyncio.create_task(sb.run(f"import time\ndef main():\n    time.sleep({2 * STARTUP_S})"))
        await until_started()
        (pid,) = worker_pids() - before
        os.kill(pid, 9)
        return await task

    try:
        result = asyncio.run(kill_worker_mid_run())
        assert result.error == "sandbox worker died (restarted)"
        assert_clean_and_serving(sb)
        (pid,) = worker_pids() - before
        os.kill(pid, 9)  # dead while idle: replaced before the next run
        time.sleep(0.1)
        assert_clean_and_serving(sb)
    finally:
        sb.close()


def test_close_stops_workers_and_is_idempotent(entry):
    before = worker_pids()
    sb = Sandbox(entry, workers=2, limits=LIMITS)
    assert run(sb, "def main(): return 2").value == 2
    sb.close()
    sb.close()
    assert worker_pids() - before == set()
    assert run(sb, "def main(): return 2").error == "sandbox closed"
    other = Sandbox(entry, workers=1, limits=Limits(wall_s=30))

    async def close_while_busy():
        running = asyncio.create_task(other.run("import time\ndef main():\n    time.sleep(20)"))
        waiting = asyncio.create_task(other.run("def main(): return 1"))
        for _ in range(500):  # until the first run is under way
            if leftovers():
                break
            await asyncio.sleep(0.02)
        await other.aclose()
        return (await running).error, (await waiting).error

    assert asyncio.run(close_while_busy()) == ("sandbox closed", "sandbox closed")
    assert worker_pids() - before == set()
    assert not leftovers()


NOT_ROOT_SCRIPT = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from qd.sandbox import Limits, Sandbox

async def main():
    sb = Sandbox(sys.argv[2], workers=1, limits=Limits(wall_s=2))
    report = sb.isolation()
    codes = ["import os\\ndef main():\\n    return os.getuid()"]
    if report["pid_namespace"]:  # without one, kill(-1) would hit all of this user's processes
        codes += ["import os\\ndef main():\\n    os.kill(-1, 9)\\n    return 'survived'",
                  "import os\\ndef main():\\n    os.fork() or os.execv('/bin/sleep', ['sleep', sys.argv[3]])"]
    codes.append("def main():\\n    while True:\\n        pass")
    results = [await sb.run(code) for code in codes]
    await sb.aclose()
    print(json.dumps({"report": report, "results": [[r.ok, r.value, r.error] for r in results]}))

asyncio.run(main())
"""


@pytest.mark.skipif(not ROOT or not shutil.which("/usr/bin/python3"), reason="needs root to switch to nobody")
def test_degrades_without_root():
    """As an ordinary user: no uid switch, but a user namespace gives the rest where the kernel allows."""
    check = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; assert sys.version_info >= (3, 11)"],
        user=65534,
        group=65534,
        capture_output=True,
    )
    if check.returncode:
        pytest.skip("no Python >= 3.11 that the user nobody can run")
    work = Path(tempfile.mkdtemp(prefix="sbx_nobody_"))
    try:
        work.chmod(0o755)
        (work / "sbx_entry_nobody.py").write_text(ENTRY)
        # A copy of the package where nobody can read it (the checkout may be in a 0700 dir).
        shutil.copytree(REPO / "qd", work / "qd", ignore=shutil.ignore_patterns("__pycache__"))
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        mark = marker()
        out = subprocess.run(
            ["/usr/bin/python3", "-c", NOT_ROOT_SCRIPT, str(work), f"{work}/sbx_entry_nobody.py:run", mark],
            user=65534,
            group=65534,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=work,
        )
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        report, results = got["report"], got["results"]
        assert not report["unprivileged_uid"]
        assert results[0] == [True, 65534, None]
        assert results[-1][2] == "timeout after 2.0 s (killed)"
        if report["pid_namespace"]:
            assert report["user_namespace"] and report["network_off"] and report["private_tmp"]
            assert results[1][1] == "survived" or results[1][2].startswith("ProcessLookupError")
            assert not leftovers(mark)
    finally:
        shutil.rmtree(work)


def test_without_namespaces_the_process_tree_still_dies(entry, monkeypatch):
    """QD_SANDBOX_NAMESPACES=0: only rlimits, a session, the uid switch and the subreaper sweep."""
    monkeypatch.setenv("QD_SANDBOX_NAMESPACES", "0")
    sb = Sandbox(entry, workers=1, limits=LIMITS)
    try:
        report = sb.isolation()
        assert not (report["pid_namespace"] or report["network_off"] or report["private_tmp"])
        assert report["unprivileged_uid"] == ROOT
        mark = marker()
        daemon = run(
            sb,
            """
            import os, socket
            def main(mark):
                if os.fork() == 0:
                    os.setsid()
                    if os.fork() == 0:
                        os.execv("/bin/sleep", ["sleep", mark])
                    os._exit(0)
                os.wait()
                open("left_behind", "w").close()
                return os.path.abspath("left_behind")
            """,
            mark=mark,
        )
        assert daemon.ok and not os.path.exists(daemon.value)  # its files are removed too
        assert_clean_and_serving(sb, mark)
        if ROOT:  # otherwise nproc counts all of this user's processes
            assert run(sb, "import os\ndef main():\n    while True:\n        os.fork()").error
            assert_clean_and_serving(sb)
    finally:
        sb.close()
