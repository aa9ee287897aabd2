"""The sandbox on a Ray cluster: ``RaySandbox`` runs what ``Sandbox`` runs, on the cluster's nodes.

Evaluations are what outgrow one machine first, so only they move: the archive, the
store, the budgets, the LLM cache and the ledger stay with the driver (the engine's
process). Each node of the cluster with CPUs gets one actor, ``_NodeSandbox``, pinned
to it, holding a ``Sandbox`` of as many pre-forked workers as the node has CPUs: the
same isolation as a local run, a fork per run.

A run whose entry calls a model (``run(..., calls=gateway)``) keeps every call on the
driver: the actor hands each of the child's requests back (``next_call``), the driver
answers it with the run's ``ModelGateway`` (budget, cache, ledger, trace, all on the
driver) and returns the answer (``answer``). So every call is counted and cached once,
wherever the evaluation runs, and a worker never needs the model's address or key.

A node lost mid-run (its actor dies) costs the runs it held one retry on another node;
a second loss is a failed run with the reason, stored as any other failure. Lost nodes
are not used again. ``run`` never raises because of the cluster, as ``Sandbox.run``
never raises because of the candidate: once every node is lost, each run fails at once
and ``down`` says why, which the engine reads as a dead client's reason (it stops the run
at a checkpoint; ``resume=`` continues once nodes are back).

What each session of a run did on the cluster (the evaluations each node ran, the most
at once, the nodes lost) is appended to ``record`` at ``close``: where a run's
evaluations went is read there, not guessed.

Ray is an optional extra (``pip install ".[ray]"``); this module imports it on use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qd import extras
from qd.sandbox.pool import Calls, Limits, SandboxResult, _check_entry, _failed

RETRIES = 1  # a run whose node is lost is tried once more elsewhere
_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no reports home (nothing here reaches the internet anyway)
    "RAY_AUTH_MODE": "disabled",
}  # a token made by one local cluster would lock later nodes out
_START_S = 120.0  # a head node's start, on a loaded 2-core machine
_FORGET_S = 60.0  # a finished run's call queue is dropped this long after, if the driver never drained it


def need_ray() -> Any:
    """The ``ray`` module; :class:`~qd.extras.MissingExtra` naming the extra when it is missing."""
    extras.require("ray", "runner=ray")
    import ray

    return ray


class LocalCluster:
    """A one-node Ray cluster started here for ``runner=ray`` without an address: ``ray start
    --head --block`` under a lifeline, in a process group of its own, so it and every process
    Ray starts under it end with this process, however it ends (``close`` or ``kill -9``)."""

    def __init__(self, cpus: int, temp_dir: Path):
        import socket

        from qd.lifeline import module_command

        with socket.socket() as s:  # a free port for the head's GCS
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        temp_dir.mkdir(parents=True, exist_ok=True)
        self.log = temp_dir / "head.log"
        args = [
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--num-cpus={cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=100000000",
            f"--temp-dir={temp_dir}",
        ]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                module_command("ray.scripts.scripts", args, tag="qd-ray"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **_ENV},
                process_group=0,
            )
        deadline = time.monotonic() + _START_S
        while "Ray runtime started" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-600:].strip().splitlines()
                self.close()
                raise RuntimeError(
                    f"runner=ray: the local Ray head did not start ({tail[-1] if tail else 'no log'}; "
                    f"see {self.log})"
                )
            time.sleep(0.2)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the head and every process Ray started in its group
        except ProcessLookupError:
            pass
        self.proc.wait()
        shutil.rmtree(self.log.parent, ignore_errors=True)


def connect(address: str | None, cpus: int, entry: str) -> LocalCluster | None:
    """Joins the Ray cluster at ``address``, or starts a local one (returned, to close).

    The code reaches the workers through Ray's runtime environment: qd itself and the
    folder of a file entry (a task's ``entry.py`` and its siblings) are uploaded as
    ``py_modules``, so a node needs only Python and qd's dependencies."""
    ray = need_ray()
    os.environ.update(_ENV)
    modules = [str(Path(__file__).resolve().parents[1])]  # the qd package
    target = entry.rpartition(":")[0]
    if target.endswith(".py"):
        modules.append(str(Path(target).parent))
    # (under /tmp: Ray's socket paths inside it must stay under 108 bytes)
    cluster = None if address else LocalCluster(cpus, Path(tempfile.mkdtemp(prefix="qd-ray-", dir="/tmp")))
    try:
        ray.init(
            address=address or cluster.address,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"py_modules": modules, "env_vars": _ENV},
        )
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    return cluster


class _NodeSandbox:
    """One node's sandbox (a Ray actor; ``RaySandbox`` makes one per node). Model calls of a
    run are queued for the driver (``next_call``) and answered by it (``answer``)."""

    def __init__(self, entry: str, workers: int, limits: dict):
        from qd.sandbox import Sandbox

        self.sandbox = Sandbox(_on_this_node(entry), workers=workers, limits=Limits(**limits))
        self.calls: dict[int, asyncio.Queue] = {}  # run id -> the child's requests (None: the run ended)
        self.waiting: dict[tuple[int, Any], asyncio.Future] = {}  # (run id, call n) -> its answer

    async def run(self, run_id: int, text: str, args: dict, with_calls: bool) -> dict:
        if not with_calls:
            return dataclasses.asdict(await self.sandbox.run(text, args))
        # (an async actor runs its calls in no set order: ``next_call`` may come first)
        queue = self.calls.setdefault(run_id, asyncio.Queue())

        async def relay(request: dict) -> dict:
            answer = self.waiting[(run_id, request.get("n"))] = asyncio.get_running_loop().create_future()
            queue.put_nowait(request)
            try:
                return await answer
            finally:
                self.waiting.pop((run_id, request.get("n")), None)

        try:
            return dataclasses.asdict(await self.sandbox.run(text, args, calls=relay))
        finally:
            queue.put_nowait(None)
            asyncio.get_running_loop().call_later(
                _FORGET_S, self.calls.pop, run_id, None
            )  # if no one asks again

    async def next_call(self, run_id: int) -> dict | None:
        """The run's next model call, or None once the run has ended."""
        request = await self.calls.setdefault(run_id, asyncio.Queue()).get()
        if request is None:
            self.calls.pop(run_id, None)
        return request

    def answer(self, run_id: int, answer: dict) -> None:
        waiting = self.waiting.get((run_id, answer.get("n")))
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def isolation(self) -> dict[str, bool]:
        return self.sandbox.isolation()

    def close(self) -> None:
        self.sandbox.close()


def _on_this_node(entry: str) -> str:
    """A file entry as this node has it: at the driver's path (a node of the driver's machine),
    else in the folder the runtime environment uploaded (``connect``), found on ``sys.path``."""
    target, _, name = entry.rpartition(":")
    path = Path(target)
    if not target.endswith(".py") or path.is_file():
        return entry
    for root in map(Path, sys.path):
        if (root / path.parent.name / path.name).is_file():
            return f"{root / path.parent.name / path.name}:{name}"
    return entry  # (the sandbox names the missing file)


@dataclasses.dataclass
class _Node:
    """A node of the cluster as ``RaySandbox`` uses it: its sandbox actor and its CPUs (the
    actor's workers, so the runs it takes at once)."""

    id: str
    actor: Any
    cpus: int
    busy: int = 0
    ran: int = 0  # runs it finished (whatever the candidate did)
    lost: bool = False


class RaySandbox:
    """``Sandbox``'s ``run(text, args, calls=)`` on the Ray cluster ``ray.init`` joined
    (see the module doc). ``workers``: the runs it takes at once, the cluster's CPUs.
    ``down``: None, or why no run can go on (every node lost). ``record``: a file that
    ``close`` appends this session's line to (see the module doc)."""

    def __init__(
        self,
        entry: str,
        *,
        limits: Limits = Limits(),
        address: str | None = None,
        cpus: int = 2,
        record: Path | None = None,
    ):
        ray = need_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.entry, self.limits, self.record = _check_entry(entry), limits, record
        self._cluster = connect(address, cpus, self.entry)
        actor = ray.remote(_NodeSandbox)
        self._nodes: list[_Node] = []
        for node in sorted(
            (n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1),
            key=lambda n: n["NodeID"],
        ):
            cpus = int(node["Resources"]["CPU"])  # the node's workers follow its CPUs
            pinned = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            sandbox = actor.options(
                num_cpus=0, scheduling_strategy=pinned, max_restarts=0, max_concurrency=1000
            ).remote(self.entry, cpus, dataclasses.asdict(limits))
            self._nodes.append(_Node(node["NodeID"], sandbox, cpus))
        if not self._nodes:
            raise RuntimeError("runner=ray: the cluster has no node with a CPU to run evaluations on")
        self.workers = sum(n.cpus for n in self._nodes)
        self.down: str | None = None
        self._most = 0  # the most runs on the cluster at once
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._condition: asyncio.Condition | None = None
        self._ids = itertools.count()
        self._ray = ray

    def proposals_for(self, batch_size: int) -> int:
        """Proposals at once (of ``batch_size`` children each) that keep every CPU of the cluster
        busy: what ``runner.in_flight`` left unset means on ``runner=ray``."""
        return max(1, math.ceil(self.workers / batch_size))

    async def run(self, text: str, args: dict | None = None, *, calls: Calls | None = None) -> SandboxResult:
        """What ``Sandbox.run`` does, on the least busy live node; a lost node costs one retry."""
        lost = []
        for _ in range(RETRIES + 1):
            node = await self._slot()
            if node is None:  # every node is gone (``down``): the engine stops the run
                break
            try:
                result = await self._run_on(node, text, args or {}, calls)
                node.ran += 1
                return result
            except self._ray.exceptions.RayActorError as e:  # the node (or its actor) died
                self._lose(node, e)
                lost.append(f"node {node.id[:8]}: {type(e).__name__}")
            finally:
                node.busy -= 1
                freed = self._freed()
                async with freed:  # a CPU is free, or a node is gone: the waiters look again
                    freed.notify_all()
        if not lost:
            return _failed(self.down)
        gone = "; no node is left" if self.down else ""
        return _failed(
            f"ray: lost the worker running this evaluation ({'; '.join(lost)}); "
            f"tried {len(lost)} time(s){gone}"
        )

    def _lose(self, node: _Node, error: BaseException) -> None:
        """Marks ``node`` lost (its runs' retries go elsewhere); the last one sets ``down``."""
        if node.lost:
            return
        node.lost = True
        print(
            f"qd: ray: lost node {node.id[:8]} ({self._nodes.index(node) + 1} of {len(self._nodes)}, "
            f"{type(error).__name__}); its evaluations are retried once on the others",
            file=sys.stderr,
            flush=True,
        )
        if all(n.lost for n in self._nodes):
            self.down = (
                f"runner=ray: every node of the cluster is gone (last: {node.id[:8]}, "
                f"{type(error).__name__}); the run stopped at a checkpoint: qd-run resume=RUN_DIR "
                "continues it once nodes are back"
            )

    async def _slot(self) -> _Node | None:
        """A live node with a free CPU, marked busy (waits while every CPU of the cluster is busy:
        what is in flight on the cluster is sized to its CPUs, the rest waits here, on the driver,
        for whichever node frees first); None when no node is left."""
        freed = self._freed()
        async with freed:
            while True:
                live = [n for n in self._nodes if not n.lost]
                free = [n for n in live if n.busy < n.cpus]
                if free or not live:
                    break
                await freed.wait()
        if not live:
            return None
        node = min(free, key=lambda n: n.busy / n.cpus)  # (the first of the least busy: node order)
        node.busy += 1
        self._most = max(self._most, sum(n.busy for n in self._nodes))
        return node

    def _freed(self) -> asyncio.Condition:
        """Notified as a run ends (one per event loop: a runner may serve several ``asyncio.run``s)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._condition = loop, asyncio.Condition()
        return self._condition

    async def _run_on(self, node: _Node, text: str, args: dict, calls: Calls | None) -> SandboxResult:
        actor = node.actor
        run_id = next(self._ids)
        result = actor.run.remote(run_id, text, args, calls is not None)
        if calls is None:
            return SandboxResult(**await result)
        relay = asyncio.create_task(self._relay(actor, run_id, calls))
        try:
            return SandboxResult(**await result)
        finally:
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)

    @staticmethod
    async def _relay(actor: Any, run_id: int, calls: Calls) -> None:
        """Answers the run's model calls on the driver, each in a task of its own (an agent's
        threads may call at once), until the run ends."""
        answering: set[asyncio.Task] = set()

        async def answer(request: dict) -> None:
            await actor.answer.remote(run_id, await calls(request))

        try:
            while (request := await actor.next_call.remote(run_id)) is not None:
                task = asyncio.create_task(answer(request))
                answering.add(task)
                task.add_done_callback(answering.discard)
        finally:
            for task in answering:
                task.cancel()

    def isolation(self) -> dict[str, bool]:
        """The isolation in force on the first node (as ``Sandbox.isolation``)."""
        return self._ray.get(self._nodes[0].actor.isolation.remote())

    def close(self) -> None:
        """Records the session, stops the nodes' sandboxes, leaves the cluster, and stops a local one;
        a second call does nothing (the engine and the run's exit stack both close the evaluator)."""
        if self._closed:
            return
        self._closed = True
        if self.record is not None:
            session = {
                "ran": {n.id: n.ran for n in self._nodes if n.ran},
                "most_at_once": self._most,
                "cpus": self.workers,
                "lost": [n.id for n in self._nodes if n.lost],
            }
            with open(self.record, "a") as f:
                f.write(json.dumps(session) + "\n")
        for node in self._nodes:
            if not node.lost:
                try:
                    self._ray.get(node.actor.close.remote(), timeout=10)
                except Exception:  # a node lost since: nothing left to stop there
                    pass
        self._ray.shutdown()
        if self._cluster is not None:
            self._cluster.close()
