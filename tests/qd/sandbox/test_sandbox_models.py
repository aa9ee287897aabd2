"""Agents in the sandbox call the run's model only through the host, within their budget.

An agent's ``llm(...)`` travels child -> worker -> host (``Sandbox.run(..., calls=)``),
where a ``ModelGateway`` answers it through the run's ``LLMClient`` (a real-HTTP
scripted server here). Hostile agents stay within their budget, end within seconds,
and leave the host and the sandbox serving.
"""

import asyncio
import json
import textwrap
import time

import pytest
from scripted_llm import Rule

from qd.llm import LLMClient, LLMSettings, ModelSpec, tally
from qd.llm.gateway import CallBudget, ModelGateway, call_index, candidate_key
from qd.sandbox import Limits, ModelCallError, Sandbox

WALL_S = 2.0
LIMITS = Limits(wall_s=WALL_S, cpu_s=5, memory_mb=768, file_mb=4, nproc=16, output_kb=4, output_cap_mb=4)
ENTRY = """
def run(text, **kwargs):
    ns = {}
    exec(compile(text, "agent", "exec"), ns)
    llm = kwargs.pop("llm", "absent")
    return ns["forward"](kwargs.get("task"), llm)
"""
ECHO = Rule("", reply=lambda body: "echo:" + body["messages"][-1]["content"][:40])
TRYING = """
def attempt(llm, *args, **kw):
    try:
        return llm(*args, **kw)
    except Exception as e:  # the agent catches its refusals and goes on
        return f"{type(e).__name__}: {e}"
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    path = tmp_path_factory.mktemp("sbx_models") / "agent_entry.py"
    path.write_text(ENTRY)
    sb = Sandbox(f"{path}:run", workers=2, limits=LIMITS)
    yield sb
    sb.close()


def client_for(server, cache_dir=None, models=(ModelSpec("m"),)) -> LLMClient:
    return LLMClient(
        LLMSettings(
            base_url=server.base_url,
            models=models,
            cache_dir=cache_dir,
            max_retries=0,
            timeout_s=30.0,
            seed=7,
        )
    )


def agent(code: str) -> str:
    return TRYING + textwrap.dedent(code)


async def run_agent(sb, client, code, budget=CallBudget(), task="t", stage="eval"):
    text = agent(code)
    gateway = ModelGateway(client, budget, candidate_key(text, stage))
    return await sb.run(text, {"task": task}, calls=gateway), gateway


async def still_serving(sb, client) -> None:
    """The sandbox answers a well-behaved agent normally."""
    result, gateway = await run_agent(sb, client, "def forward(task, llm):\n    return llm('are you there')")
    assert (result.ok, result.value) == (True, "echo:are you there"), result
    assert gateway.calls == 1


def run(server, main, **client_settings):
    """``await main(client)`` with a fresh client of ``server`` (closed after)."""

    async def go():
        client = client_for(server, **client_settings)
        try:
            return await main(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_agent_calls_reach_the_host_model_and_are_counted(sandbox, scripted_llm):
    server = scripted_llm([Rule("hello", reply="world"), Rule("again", reply="twice")])

    async def main(client):
        with tally() as proposal:
            result, gateway = await run_agent(
                sandbox,
                client,
                """
                def forward(task, llm):
                    a = llm("hello " + task)
                    b = llm([{"role": "system", "content": "be brief"}, {"role": "user", "content": "again"}],
                            temperature=0.25, max_tokens=5000, stop=["\\n"])
                    import qd.sandbox  # an entry can catch the host's name for the error
                    return [a, b, repr(llm), type(llm).Error is qd.sandbox.ModelCallError]
                """,
                budget=CallBudget(max_tokens=64),
                task="there",
            )
        return result, gateway, client.ledger, proposal

    result, gateway, ledger, proposal = run(server, main)
    assert result.ok, result
    assert result.value[:2] == ["world", "twice"]
    assert "llm(messages" in result.value[2] and result.value[3] is True
    first, second = server.requests
    assert first["messages"] == [{"role": "user", "content": "hello there"}] and first["max_tokens"] == 64
    assert (second["temperature"], second["max_tokens"], second["stop"]) == (0.25, 64, ["\n"])
    assert first["seed"] != second["seed"]  # each call its own sample index
    assert [e["n"] for e in gateway.trace] == [0, 1]
    assert gateway.trace[0]["messages"] == first["messages"] and gateway.trace[1]["text"] == "twice"
    assert gateway.trace[1]["sampling"] == {
        "temperature": 0.25,
        "max_tokens": 64,
        "stop": ["\n"],
        "model": None,
        "top_logprobs": None,
    }
    spent = sum(e["tokens_in"] + e["tokens_out"] for e in gateway.trace)
    assert gateway.calls == 2 and gateway.tokens == spent > 0
    assert all(e["model"] == "m" and not e["cached"] for e in gateway.trace)
    for counted in (ledger, proposal):
        agent_usage = counted.split("role")["agent"]
        assert (agent_usage.calls, agent_usage.tokens_in + agent_usage.tokens_out) == (2, spent)


def test_each_call_records_the_task_item_its_entry_named(sandbox, scripted_llm):
    """``llm.item``: the entry names the item it is on; the host's trace keeps it with each call
    (ints and short strings; anything else is not recorded)."""
    server = scripted_llm([ECHO])

    async def main(client):
        result, gateway = await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                out = [llm("before")]
                for item in (0, 1, "q-7", True, [2]):
                    llm.item = item
                    out.append(llm(f"on {item}"))
                return out
            """,
        )
        return result, gateway

    result, gateway = run(server, main)
    assert result.ok, result
    assert [e.get("item", "-") for e in gateway.trace] == ["-", 0, 1, "q-7", "-", "-"]
    assert all("text" in e for e in gateway.trace)  # an odd item is not recorded, and the call is answered


def test_agent_picks_a_run_model_and_reads_logprobs(sandbox, scripted_llm):
    """``model=`` names one of the run's models (another is refused inside the agent);
    ``top_logprobs=`` answers {"text", "top_logprobs"}: what judges in evaluations read."""
    server = scripted_llm(
        [
            Rule("digit", reply="7", logprobs=[{"7": -0.1, "6": -2.5}]),
            Rule("", reply=lambda body: "model:" + body["model"]),
        ]
    )

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return [llm("which", model="n"), llm("which"), llm("digit", max_tokens=1, top_logprobs=2),
                        attempt(llm, "which", model="gpt-9"), attempt(llm, "x", top_logprobs=99)]
            """,
        )

    (result, gateway) = run(server, main, models=(ModelSpec("m"), ModelSpec("n")))
    assert result.ok, result
    chosen, default, scored, unknown, too_many = result.value
    assert chosen == "model:n" and default in ("model:m", "model:n")
    assert scored == {"text": "7", "top_logprobs": [{"7": -0.1, "6": -2.5}]}
    assert unknown.startswith("ModelCallError: llm: model: 'gpt-9' is not one of the run's models ['m', 'n']")
    assert "top_logprobs: 99 is not a whole number in 1..20" in too_many
    assert server.requests[2]["logprobs"] is True and server.requests[2]["top_logprobs"] == 2
    assert gateway.calls == 3 and gateway.refused == 2


def test_blocking_calls_from_a_thread_count_in_the_tally_of_their_making(scripted_llm):
    server = scripted_llm([ECHO])

    async def main(client):
        with tally() as proposal:
            gateway = ModelGateway(client, CallBudget(calls=2), 5)
        llm = gateway.blocking(asyncio.get_running_loop())
        answers = [
            await asyncio.to_thread(llm, "q1"),
            await asyncio.to_thread(llm, [{"role": "user", "content": "q2"}]),
        ]
        with pytest.raises(ModelCallError, match=r"call budget spent \(2 calls"):
            await asyncio.to_thread(llm, "q3")
        with pytest.raises(RuntimeError, match="its own event loop"):
            llm("q4")
        gateway.close()
        with pytest.raises(ModelCallError, match=r"the evaluation is over"):
            await asyncio.to_thread(llm, "q5")
        return answers, proposal, gateway

    answers, proposal, gateway = run(server, main)
    assert answers == ["echo:q1", "echo:q2"]
    assert proposal.split("role")["agent"].calls == 2 and server.stats()["requests"] == 2
    assert [e["n"] for e in gateway.trace] == [0, 1, 2] and "error" in gateway.trace[2]


def test_rerun_of_the_same_agent_hits_the_cache(sandbox, scripted_llm, tmp_path):
    server = scripted_llm([ECHO])
    code = "def forward(task, llm):\n    return [llm('one'), llm('two')]"

    async def once(client):
        result, gateway = await run_agent(sandbox, client, code)
        return result, gateway, client.ledger.split("role")["agent"]

    first, gw1, usage1 = run(server, once, cache_dir=str(tmp_path / "cache"))
    assert first.value == ["echo:one", "echo:two"] and usage1.cached == 0
    assert server.stats()["requests"] == 2
    again, gw2, usage2 = run(server, once, cache_dir=str(tmp_path / "cache"))
    assert again.value == first.value
    assert server.stats()["requests"] == 2  # nothing new reached the model
    assert (usage2.calls, usage2.cached) == (2, 2) and all(e["cached"] for e in gw2.trace)
    # another agent text (another key) asks the model again
    assert candidate_key("a", "eval") != candidate_key("b", "eval") != candidate_key("b", "refine")
    assert call_index(candidate_key("a"), 0) >= 1 << 62 and call_index(1, 1) != call_index(2, 1)


def test_call_budget_refuses_inside_the_agent(sandbox, scripted_llm):
    server = scripted_llm([ECHO])

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return [attempt(llm, f"q{i}") for i in range(5)]
            """,
            budget=CallBudget(calls=3),
        )

    result, gateway = run(server, main)
    assert result.ok, result
    assert result.value[:3] == ["echo:q0", "echo:q1", "echo:q2"]
    assert result.value[3:] == ["ModelCallError: llm: call budget spent (3 calls per evaluation)"] * 2
    # the host refused call 3 for good; the worker answered call 4 itself
    assert server.stats()["requests"] == 3 and (gateway.calls, gateway.refused) == (3, 1)


def test_a_spent_budget_refuses_every_call(scripted_llm):
    """What a later stage gets once an earlier one spent everything: budgets of 0 are allowed."""
    server = scripted_llm([ECHO])

    async def main(client):
        no_calls = ModelGateway(client, CallBudget(calls=0), 1)
        no_tokens = ModelGateway(client, CallBudget(tokens=0), 2)
        return [await g({"n": 0, "messages": "x", "sampling": {}}) for g in (no_calls, no_tokens)]

    calls, tokens = run(server, main)
    assert calls == {"n": 0, "error": "llm: call budget spent (0 calls per evaluation)", "final": True}
    assert tokens["error"].startswith("llm: token budget") and server.stats()["requests"] == 0
    with pytest.raises(ValueError, match=r"budget.calls: 5000 is not allowed \(use 0..4096\)"):
        CallBudget(calls=5000)


def test_token_budget_and_bad_requests_refuse_inside_the_agent(sandbox, scripted_llm):
    server = scripted_llm([Rule("", reply="ok")])

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return [attempt(llm, "x" * 200, max_tokens=20), attempt(llm, "x" * 200, max_tokens=20),
                        attempt(llm, "short", max_tokens=5),
                        attempt(llm, "x", temperature=3), attempt(llm, "x", top_p=0.5),
                        attempt(llm, [{"role": "robot", "content": "x"}]), attempt(llm, [], stop="no"),
                        attempt(llm, {"not": "json-able", "x": {1, 2}})]
            """,
            budget=CallBudget(tokens=100, max_tokens=50),
        )

    result, gateway = run(server, main)
    assert result.ok, result
    v = result.value
    assert v[0] == "ok" and v[2] == "ok"  # 50 + 20 of 100; then 49 left: 50 + 20 no, 2 + 5 yes
    assert (
        v[1].startswith("ModelCallError: llm: token budget: this call may take ~70 tokens")
        and "49 of 100" in v[1]
    )
    assert v[3] == "ModelCallError: llm: temperature: 3 is not in [0, 2] (pass a number from 0 to 2)"
    assert v[4].startswith("ModelCallError: llm: top_p: not a sampling option")
    assert v[5].startswith("ModelCallError: llm: messages[0].role: 'robot' is not a role")
    assert v[6].startswith("ModelCallError: llm: stop: not a list")
    assert v[7].startswith("ModelCallError: llm: request is not JSON")
    assert server.stats()["requests"] == 2 and gateway.calls == 2


def test_calls_after_the_deadline_fail_inside_the_agent(sandbox, scripted_llm):
    server = scripted_llm([ECHO])

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            import time
            def forward(task, llm):
                first = attempt(llm, "early")
                time.sleep(0.6)   # past the gateway's 0.4 s, well within the sandbox's wall_s
                return [first] + [attempt(llm, "late") for _ in range(3)]
            """,
            budget=CallBudget(seconds=0.4),
        )

    result, gateway = run(server, main)
    assert result.ok, result
    assert result.value[0] == "echo:early"
    assert (
        result.value[1:]
        == ["ModelCallError: llm: time is up (no call starts after 0.4 s of the evaluation)"] * 3
    )
    assert server.stats()["requests"] == 1


def test_a_failed_model_call_fails_inside_the_agent(sandbox, scripted_llm):
    server = scripted_llm([Rule("bad", fault="500"), ECHO])

    async def main(client):
        result, gateway = await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return [attempt(llm, "bad"), attempt(llm, "good")]
            """,
        )
        return result, gateway, client.ledger.split("role")["agent"], client.down

    result, gateway, usage, down = run(server, main)
    assert result.ok, result
    assert result.value[0].startswith("ModelCallError: llm: ") and "HTTP 500" in result.value[0]
    assert result.value[1] == "echo:good"  # not final: the agent may go on
    assert (gateway.calls, usage.calls, usage.failed, down) == (2, 1, 1, None)
    assert gateway.trace[0]["error"] == result.value[0].removeprefix("ModelCallError: ")


def test_threads_in_an_agent_get_their_own_answers(sandbox, scripted_llm):
    server = scripted_llm([ECHO], latency_s=0.05)

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            import threading
            def forward(task, llm):
                got = {}
                def ask(i):
                    got[i] = llm(f"thread {i}")
                threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                return got
            """,
        )

    result, _ = run(server, main)
    assert result.ok, result
    assert result.value == {str(i): f"echo:thread {i}" for i in range(6)}
    assert server.stats()["max_in_flight"] > 1  # they did overlap


def test_without_calls_the_entry_gets_no_llm(sandbox, scripted_llm):
    result = asyncio.run(sandbox.run("def forward(task, llm):\n    return [task, llm]", {"task": 3}))
    assert (result.ok, result.value) == (True, [3, "absent"]), result
    with pytest.raises(ValueError, match="'llm' is the model callable's name"):
        asyncio.run(sandbox.run("", {"llm": 1}, calls=ModelGateway(None, CallBudget(), 0)))


def test_a_failing_handler_answers_with_its_error(sandbox):
    async def broken(request):
        raise KeyError("boom")

    result = asyncio.run(
        sandbox.run(agent("def forward(task, llm):\n    return attempt(llm, 'x')"), calls=broken)
    )
    assert (result.ok, result.value) == (True, "ModelCallError: llm: the host failed: KeyError: 'boom'"), (
        result
    )


# -- hostile agents -----------------------------------------------------------------------------


async def ticking(stop: asyncio.Event) -> float:
    """The longest the event loop went without running this task (the host must stay responsive)."""
    worst, last = 0.0, time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


async def hostile(sb, server, code, budget, **kw):
    """Run ``code`` while watching the loop; then check the sandbox still serves."""
    client = client_for(server)
    try:
        stop = asyncio.Event()
        watch = asyncio.create_task(ticking(stop))
        start = time.monotonic()
        result, gateway = await run_agent(sb, client, code, budget, **kw)
        took = time.monotonic() - start
        stop.set()
        lag = await watch
        model_calls = server.stats()["requests"]
        await still_serving(sb, client)
        return result, gateway, took, lag, model_calls
    finally:
        await client.aclose()


def test_flood_of_calls_stays_within_the_budget(sandbox, scripted_llm):
    server = scripted_llm([ECHO])
    result, gateway, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        def forward(task, llm):
            while True:
                try:
                    llm("flood")
                except Exception:
                    pass
        """,
            CallBudget(calls=4),
        )
    )
    assert result.error == f"timeout after {WALL_S} s (killed)"
    assert model_calls == 4 and gateway.calls == 4
    assert took < WALL_S + 1.5 and lag < 0.5, (took, lag)


def test_flood_past_the_budget_is_answered_without_the_host(sandbox, scripted_llm):
    server = scripted_llm([ECHO])
    cpu = time.process_time()
    result, gateway, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        import time
        def forward(task, llm):
            errors, last, end = 0, None, time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    llm("flood")
                except llm.Error as e:
                    errors, last = errors + 1, str(e)
            return [errors, last]
        """,
            CallBudget(calls=4),
        )
    )
    cpu = time.process_time() - cpu
    assert result.ok, result
    errors, last = result.value
    assert errors > 200 and last == "llm: call budget spent (4 calls per evaluation)"
    assert model_calls == 4 and (gateway.calls, gateway.refused) == (4, 1)  # the rest: the worker's
    assert len(gateway.trace) == 5 and lag < 0.5 and cpu < 0.3, (lag, cpu)


def test_huge_prompts_are_refused_or_kill_the_run(sandbox, scripted_llm):
    server = scripted_llm([ECHO])
    two_mb, _, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        def forward(task, llm):
            return attempt(llm, "x" * (2 << 20))
        """,
            CallBudget(),
        )
    )
    assert two_mb.ok and two_mb.value.startswith("ModelCallError: llm: token budget"), two_mb
    assert model_calls == 0 and took < 2.0 and lag < 0.5
    twenty_mb, gateway, took, lag, _ = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        def forward(task, llm):
            return attempt(llm, "x" * (20 << 20))
        """,
            CallBudget(),
        )
    )
    assert twenty_mb.error == "model call too large (> 4 MB)", twenty_mb
    assert gateway.trace == [] and took < 2.0 and lag < 0.5


def test_calls_from_a_forked_child_stay_within_the_budget(sandbox, scripted_llm):
    server = scripted_llm([ECHO])
    result, gateway, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        import os, time
        def forward(task, llm):
            if os.fork() == 0:
                while True:
                    attempt(llm, "from the grandchild")
            time.sleep(0.5)
            return "parent done"
        """,
            CallBudget(calls=3),
        )
    )
    assert (result.ok, result.value) == (True, "parent done"), result
    assert model_calls <= 3 and gateway.calls <= 3
    assert took < WALL_S and lag < 0.5, (took, lag)


@pytest.mark.parametrize(
    "garbage, error",
    [
        ("b'garbage!' * 100", "malformed model call"),
        ("struct.pack('>cQI', b'L', 0, 6) + b'{bad}!'", "malformed model call"),
        ("struct.pack('>cQI', b'L', 0, 8) + b'[1, 2]  '", "malformed model call"),
        (
            "(lambda b: struct.pack('>cQI', b'L', 0, len(b)) + b)"
            "(b'{\"messages\": ' + b'[' * 900 + b']' * 900 + b', \"sampling\": {}}')",
            "malformed model call",
        ),
        ("struct.pack('>cQI', b'L', 0, 1 << 30)", "model call too large (> 4 MB)"),
    ],
)
def test_garbage_on_the_call_pipe_kills_the_run(sandbox, scripted_llm, garbage, error):
    server = scripted_llm([ECHO])
    result, gateway, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            f"""
        import os, struct
        def forward(task, llm):
            os.write(llm.call_fd, {garbage})
            return llm("after the garbage")
        """,
            CallBudget(),
        )
    )
    assert result.error == error, result
    assert model_calls == 0 and took < 1.5 and lag < 0.5


def test_agent_that_never_reads_its_answers_is_killed(sandbox, scripted_llm):
    server = scripted_llm([ECHO])
    result, gateway, took, lag, model_calls = asyncio.run(
        hostile(
            sandbox,
            server,
            """
        import json, os, struct
        def forward(task, llm):
            body = json.dumps({"messages": "pipelined", "sampling": {}}).encode()
            frames = (struct.pack(">cQI", b"L", 0, len(body)) + body) * 200
            while True:
                os.write(llm.call_fd, frames)
        """,
            CallBudget(calls=4),
        )
    )
    assert result.error in ("agent does not read its model answers", f"timeout after {WALL_S} s (killed)"), (
        result
    )
    assert model_calls == 4 and gateway.calls == 4
    assert took < WALL_S + 1.5 and lag < 0.5, (took, lag)


def test_a_hanging_model_call_ends_with_the_run(sandbox, scripted_llm):
    server = scripted_llm([Rule("hang", fault="hang"), ECHO])

    async def main(client):
        start = time.monotonic()
        result, gateway = await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return llm("please hang")
            """,
        )
        took = time.monotonic() - start
        for _ in range(100):  # the call's task is cancelled as the run ends
            if gateway.trace:
                break
            await asyncio.sleep(0.01)
        in_flight = client.ledger.in_flight
        await still_serving(sandbox, client)
        return result, gateway, took, in_flight

    result, gateway, took, in_flight = run(server, main)
    assert result.error == f"timeout after {WALL_S} s (killed)"
    assert took < WALL_S + 1.0
    assert [e["error"] for e in gateway.trace] == ["llm: cancelled (the evaluation ended)"]
    assert in_flight == 0 and gateway.calls == 1


def test_a_call_under_way_when_the_time_is_up_fails_inside_the_agent(sandbox, scripted_llm):
    server = scripted_llm([Rule("hang", fault="hang"), ECHO])

    async def main(client):
        return await run_agent(
            sandbox,
            client,
            """
            def forward(task, llm):
                return [attempt(llm, "please hang"), attempt(llm, "and then?")]
            """,
            budget=CallBudget(seconds=0.5),
        )

    result, gateway = run(server, main)
    assert result.ok, result
    assert result.value == [
        "ModelCallError: llm: time is up (the call ran past 0.5 s of the evaluation)",
        "ModelCallError: llm: time is up (no call starts after 0.5 s of the evaluation)",
    ]
    assert 0.4 < result.seconds < WALL_S and gateway.calls == 1


def test_cancelling_a_run_cancels_its_calls(sandbox, scripted_llm):
    server = scripted_llm([Rule("hang", fault="hang"), ECHO])

    async def main(client):
        text = agent("def forward(task, llm):\n    return llm('please hang')")
        gateway = ModelGateway(client, CallBudget(), candidate_key(text, "eval"))
        task = asyncio.create_task(sandbox.run(text, calls=gateway))
        while not server.stats()["in_flight"]:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        in_flight = client.ledger.in_flight
        await still_serving(sandbox, client)
        return gateway, in_flight

    gateway, in_flight = run(server, main)
    assert [e["error"] for e in gateway.trace] == ["llm: cancelled (the evaluation ended)"] and in_flight == 0


def test_concurrent_runs_get_their_own_answers(sandbox, scripted_llm):
    server = scripted_llm([ECHO], latency_s=0.02)

    async def main(client):
        code = "def forward(task, llm):\n    return [llm(f'{task} {i}') for i in range(3)]"
        runs = await asyncio.gather(*(run_agent(sandbox, client, code, task=name) for name in "ab"))
        return [(result.value, gateway.calls) for result, gateway in runs]

    assert run(server, main) == [([f"echo:{name} {i}" for i in range(3)], 3) for name in "ab"]


def test_answers_json_round_trip(sandbox, scripted_llm):
    """Answers with every kind of character reach the agent unchanged."""
    text = 'é\u2028\n"{}\\ \x00 end'
    server = scripted_llm([Rule("", reply=text)])

    async def main(client):
        return await run_agent(sandbox, client, "def forward(task, llm):\n    return llm('x')")

    result, _ = run(server, main)
    assert result.value == text, result
    assert json.loads(json.dumps(result.value)) == text
