"""``runner=ray`` on a real local Ray cluster: a head without CPUs and two worker nodes of
2 CPUs, each its own ``ray start --block`` process on this machine (usage stats and dashboard
off, a small object store, health checks every 0.5 s so a lost node is noticed in seconds), one
cluster for the module. Tests that lose nodes add their own first; the last ones lose every
node and bring one back. Without Ray the module is skipped, except under CI (``CI`` set), where
it fails.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import stored, text_run, varied_program
from ray_nodes import LocalCluster

from qd.search.gate import REUSED

if importlib.util.find_spec("ray") is None:
    if os.environ.get("CI"):
        pytest.fail(
            'Ray is not installed: pip install ".[ray]" (the README test command does)', pytrace=False
        )
    pytest.skip("Ray is not installed", allow_module_level=True)


class Cluster:
    """The module's ``LocalCluster`` (``tests/ray_nodes.py``), its worker nodes known by Ray node id."""

    def __init__(self, root: Path):
        self.nodes = LocalCluster(root)
        self.root, self.address = root, self.nodes.address
        self.workers: dict[str, str] = {}  # name -> node id of each worker node started
        self.lost: set[str] = set()  # node ids killed

    def add_worker(self, name: str, cpus: int = 1) -> str:
        """Starts a worker node (with a custom resource of its name); returns its node id."""
        self.nodes.add_worker(name, cpus, resources={name: 1})
        import ray

        ray.init(address=self.address, log_to_driver=False)
        try:
            node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and name in n["Resources"])
        finally:
            ray.shutdown()
        self.workers[name] = node
        return node

    def live(self) -> list[str]:
        """The worker nodes not killed, in the order ``RaySandbox`` uses them (by node id)."""
        return sorted(set(self.workers.values()) - self.lost)

    def kill_node(self, node_id: str) -> None:
        """The node lost as if its machine went down (a worker outliving its raylet a moment could
        still finish a run)."""
        self.nodes.kill_worker(next(name for name, node in self.workers.items() if node == node_id))
        self.lost.add(node_id)

    def stop(self) -> None:
        self.nodes.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    c = Cluster(
        Path(tempfile.mkdtemp(prefix="qdray", dir="/tmp"))
    )  # Ray's socket paths must stay < 108 bytes
    try:
        c.add_worker("w1", cpus=2)
        c.add_worker("w2", cpus=2)
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


def comparable(path: Path) -> list[dict]:
    """Every stored candidate's fields but its creation time, evaluation seconds and the
    ``reused`` mark: whether a twin copies an earlier twin's evaluation (the same values) or
    is evaluated again depends on whether that evaluation had finished when the twin was
    formed, which is timing, not placement."""

    def plain(c):
        row = {
            k: v.tolist() if isinstance(v, np.ndarray) else v
            for k, v in dataclasses.asdict(c).items()
            if k not in ("created", "eval_seconds")
        }
        row["artifacts"] = {k: v for k, v in (row["artifacts"] or {}).items() if k != REUSED}
        return row

    return [plain(c) for c in stored(path)]


def test_a_ray_run_stores_what_a_local_run_stores(cluster, scripted_llm, tmp_path):
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    local = text_run(tmp_path / "local", server.base_url)
    on_ray = text_run(tmp_path / "ray", server.base_url, "runner=ray", f"runner.address={cluster.address}")
    assert comparable(on_ray) == comparable(local)
    assert len(comparable(local)) > 20 and any(not c["valid"] for c in comparable(local))
    assert (on_ray / "elites.jsonl").read_text() == (local / "elites.jsonl").read_text()  # the archive
    assert events(on_ray) == events(local)
    assert [e["llm"] for e in read_events(on_ray)][-1] == [e["llm"] for e in read_events(local)][-1]


TIMING = ("time", "elapsed_s", "evals_per_s", "llm")  # llm: what concurrent proposals had called by then


def read_events(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


def events(path: Path) -> list[dict]:
    """``events.jsonl`` without its timing fields (the model calls made so far by the proposals
    running beside a commit depend on how fast evaluations came back; the totals do not)."""
    return [{k: v for k, v in e.items() if k not in TIMING} for e in read_events(path)]


def stored_so_far(path: Path) -> int:
    """Candidates a running run has stored; 0 until its store has its tables (the file appears
    first: reading it then would race the run creating them)."""
    import sqlite3

    try:
        return len(stored(path)) if (path / "store.sqlite").exists() else 0
    except sqlite3.OperationalError:
        return 0


def slow_program(request: dict) -> str:
    """``varied_program``, each call of ``f`` taking 0.05 s: an evaluation (two stages) lasts
    about a second, so a node can be lost in the middle of one."""
    return varied_program(request).replace(
        "def f(x):\n", "def f(x):\n    import time\n    time.sleep(0.05)\n", 1
    )


ASKS_TWICE = """```python
def forward(task, llm):
    first = llm([{"role": "user", "content": task}], max_tokens=16)
    return llm([{"role": "user", "content": task}, {"role": "assistant", "content": first},
                {"role": "user", "content": "Sure?"}], max_tokens=16)
```"""


def test_agents_on_ray_call_the_model_through_the_driver_as_a_local_run_does(cluster, scripted_llm, tmp_path):
    """agent_design: the agents' model calls travel node -> driver, where the run's gateway answers,
    counts and traces them; the store (with every call's trace) equals a local run's."""
    from helpers import run_config
    from scripted_llm import Rule

    from qd.plan import compose
    from qd.store import Store

    server = scripted_llm([Rule("You design LLM agents", ASKS_TWICE), Rule("", "Answer: 9")])

    def agents(path: Path, *overrides: str) -> Path:
        run_config(
            compose(
                [
                    "experiment=agent_design",
                    "llm.provider=server",
                    f"llm.base_url={server.base_url}",
                    "llm.models=[{name: scripted}]",
                    "llm.api_key_env=null",
                    "llm.timeout_s=10",
                    "runner.progress=false",
                    "experiment.params.search_items=2",
                    "runner.max_llm_calls=24",
                    "eval_llm.calls=4",
                    "runner.workers=2",
                    "sandbox.wall_s=20",
                    "operators.mix=[{name: meta_agent, num_inspirations: 1, debug_rounds: 0}]",
                    *overrides,
                ]
            ),
            path,
        )
        return path

    local = agents(tmp_path / "local")
    on_ray = agents(tmp_path / "ray", "runner=ray", f"runner.address={cluster.address}")
    assert comparable(on_ray) == comparable(local)

    def traces(path: Path) -> list:
        with Store(path / "store.sqlite", readonly=True) as store:
            return [
                [{k: v for k, v in call.items() if k != "seconds"} for call in store.traces.of(c.id)]
                for c in store.iter()
            ]

    assert traces(on_ray) == traces(local) and sum(map(len, traces(local))) >= 12  # the founders' calls


def test_runs_in_flight_on_the_cluster_are_its_cpus_and_the_rest_wait_on_the_driver(cluster, tmp_path):
    import asyncio

    from qd.sandbox import Limits, Sandbox
    from qd.sandbox.cluster import RaySandbox

    entry = tmp_path / "entry.py"
    entry.write_text(
        "def run(text):\n    import time\n    start = time.time()\n    time.sleep(0.4)\n"
        "    return [start, time.time()]\n"
    )
    sandbox = RaySandbox(f"{entry}:run", limits=Limits(wall_s=30), address=cluster.address)
    local = Sandbox(f"{entry}:run", workers=1, limits=Limits(wall_s=30))
    try:
        assert sandbox.isolation() == local.isolation()  # a node's sandbox is isolated as a local one
    finally:
        local.close()
    try:

        async def many() -> list:
            return await asyncio.gather(*(sandbox.run(str(i)) for i in range(10)))

        spans = [r.value for r in asyncio.run(many())]
        assert [sandbox.proposals_for(b) for b in (1, 3, 4, 8)] == [4, 2, 1, 1]  # what in_flight: null means
    finally:
        sandbox.close()
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)  # runs under way at each start
    assert len(spans) == 10 and most == sandbox.workers == 4  # w1 and w2, two CPUs each


@pytest.mark.slow
def test_in_flight_unset_is_the_clusters_cpus(cluster, scripted_llm, tmp_path):
    """``runner.in_flight`` null on ``runner=ray``: proposals enough for every CPU of the cluster
    (2 nodes of 2 CPUs, 1 child each: 4 evaluations at once), measured by the driver as it sends
    them (``ray.jsonl``). One founder at a time, so only the children can reach 4."""
    from scripted_llm import Rule

    server = scripted_llm([Rule("", slow_program)])
    path = text_run(
        tmp_path / "ray",
        server.base_url,
        "runner.max_llm_calls=8",
        "runner.in_flight=null",
        "runner.initial_population=1",
        "islands.count=1",
        "runner=ray",
        f"runner.address={cluster.address}",
    )
    [session] = sessions(path)
    assert session["cpus"] == 4 and session["most_at_once"] == 4
    assert set(session["ran"]) == set(cluster.live())


def sessions(path: Path) -> list[dict]:
    """``ray.jsonl``: what each session of a run on Ray did on the cluster."""
    import json

    return [json.loads(line) for line in (path / "ray.jsonl").read_text().splitlines()]


def slower_program(request: dict) -> str:
    """``varied_program`` whose ``f`` takes 1.5 s to define (a default argument that sleeps; the
    entry keeps only definitions): every stage lasts that long at least, so a node killed 0.3 s
    into one is lost mid-stage."""
    return varied_program(request).replace("def f(x):", 'def f(x, _pause=__import__("time").sleep(1.5)):', 1)


def wait_for(condition, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_sweep_sends_each_job_to_the_cluster(cluster, scripted_llm, tmp_path):
    """``qd-run -m`` with ``runner=ray runner.address=...``: hydra's basic launcher runs the jobs
    one after another, each joining the cluster for its evaluations (docs/scaling.md, Sweeps);
    each job's ``ray.jsonl`` names the nodes that ran them: the cluster's workers, both used."""
    from helpers import qd_run
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    qd_run(
        "-m",
        "seed=0,1",
        "experiment=function_fit",
        "llm.provider=server",
        f"llm.base_url={server.base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "runner.progress=false",
        "runner.max_llm_calls=12",
        "runner=ray",
        f"runner.address={cluster.address}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    jobs = sorted((tmp_path / "sweep").glob("*/store.sqlite"))
    assert len(jobs) == 2 and all(
        len(stored(job.parent)) == 8 + 12 for job in jobs
    )  # runner.initial_population=8 founders (formed at once: in flight and the wave ahead) + 12 children
    assert comparable(jobs[0].parent) != comparable(jobs[1].parent)  # two seeds, two runs
    workers = set(cluster.live())
    for job in jobs:
        [session] = sessions(job.parent)
        ran = session["ran"]
        assert set(ran) == workers and session["cpus"] == 4  # every node that ran one is a worker
        assert sum(ran.values()) >= 20  # every stored candidate's evaluation (stages: one run each)


def test_a_node_lost_mid_run_costs_a_retry_and_the_store_is_the_same(cluster, scripted_llm, tmp_path, capfd):
    import threading

    from scripted_llm import Rule

    server = scripted_llm([Rule("", slow_program)])
    small = ("sandbox.wall_s=30", "runner.max_llm_calls=14")
    local = text_run(tmp_path / "local", server.base_url, *small)
    node = cluster.add_worker("w3")
    path = tmp_path / "ray"
    run = threading.Thread(
        target=text_run,
        args=(path, server.base_url, *small, "runner=ray", f"runner.address={cluster.address}"),
    )
    run.start()
    deadline = time.monotonic() + 120
    while stored_so_far(path) < 9:  # children are under way
        assert run.is_alive() and time.monotonic() < deadline
        time.sleep(0.2)
    cluster.kill_node(node)
    run.join(timeout=300)
    assert not run.is_alive()
    assert comparable(path) == comparable(local)  # each child stored once, as a local run stores it
    assert "qd: ray: lost node" in capfd.readouterr().err  # the lost node held evaluations: they were retried


def test_a_run_lost_twice_is_a_failure_with_the_reason(cluster, tmp_path):
    import asyncio

    import ray

    from qd.sandbox import Limits
    from qd.sandbox.cluster import RaySandbox

    entry = tmp_path / "entry.py"
    entry.write_text("def run(text):\n    import time\n    time.sleep(float(text))\n    return text\n")
    sandbox = RaySandbox(f"{entry}:run", limits=Limits(wall_s=30), address=cluster.address)
    try:
        actors = [node.actor for node in sandbox._nodes]
        assert sandbox.workers == 4 and asyncio.run(sandbox.run("0")).value == "0"

        async def lose_both() -> object:
            running = asyncio.create_task(sandbox.run("20"))
            for actor in actors:  # the node running it, then the one it is retried on
                await asyncio.sleep(2.0)
                ray.kill(actor)
            return await running

        result = asyncio.run(lose_both())
        assert not result.ok and result.error.startswith("ray: lost the worker running this evaluation")
        assert "tried 2 time(s); no node is left" in result.error
        assert sandbox.down.startswith("runner=ray: every node of the cluster is gone (last: ")
        after = asyncio.run(sandbox.run("0"))  # fails at once, with why: the engine stops on ``down``
        assert not after.ok and after.error == sandbox.down
    finally:
        sandbox.close()


@pytest.mark.slow
def test_a_run_lost_twice_on_the_engine_is_stored_failed_and_the_run_goes_on(
    cluster, scripted_llm, tmp_path, capfd
):
    """One proposal at a time, so its evaluation runs on the first node (by id); that node is
    killed, the evaluation is retried on the second, which is killed too: the candidate is stored
    failed with the reason, and the run finishes its budget on the third node."""
    import threading

    from scripted_llm import Rule

    while len(cluster.live()) < 3:
        cluster.add_worker(f"w{len(cluster.workers) + 1}")
    first, second, third = cluster.live()[:3]
    server = scripted_llm([Rule("", slower_program)])
    path, calls = tmp_path / "ray", 4
    run = threading.Thread(
        target=text_run,
        args=(
            path,
            server.base_url,
            "sandbox.wall_s=30",
            f"runner.max_llm_calls={calls}",
            "runner.in_flight=1",
        )
        + (
            "runner.initial_population=1",
            "islands.count=1",
            "runner=ray",
            f"runner.address={cluster.address}",
        ),
    )
    run.start()
    wait_for(lambda: stored_so_far(path) >= 2, "children under way")
    cluster.kill_node(first)
    err = ""
    while "qd: ray: lost node" not in err:  # the first loss is noticed; its retry has started
        assert run.is_alive()
        err += capfd.readouterr().err
        time.sleep(0.05)
    assert f"lost node {first[:8]} (1 of 3" in err
    time.sleep(0.3)
    cluster.kill_node(second)
    run.join(timeout=300)
    err += capfd.readouterr().err
    assert not run.is_alive() and "Traceback" not in err, err[-3000:]
    candidates = stored(path)
    assert len(candidates) == 1 + calls  # the founder and every call's child: the run went on
    lost = [c for c in candidates if c.error and "ray: lost the worker" in c.error]
    assert len(lost) == 1, ([(c.id, c.error) for c in candidates], sessions(path), err)
    [failed] = lost
    assert "tried 2 time(s)" in failed.error and failed.id < candidates[-1].id
    [session] = sessions(path)
    assert sorted(session["lost"]) == sorted([first, second]) and third in session["ran"]


def start_driver(run: Path, base_url: str, *overrides: str, **popen) -> subprocess.Popen:
    """``qd-run`` of function_fit on ``runner=ray`` asking the scripted server at ``base_url``,
    into ``run``: a process of its own, as a user starts it (this checkout's qd)."""
    args = [
        "experiment=function_fit",
        "llm.provider=server",
        f"llm.base_url={base_url}",
        "llm.models=[{name: scripted}]",
        "llm.api_key_env=null",
        "runner.progress=false",
        "runner=ray",
        f"hydra.run.dir={run}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    return subprocess.Popen([sys.executable, "-m", "qd.run", *args], env=env, **popen)


@pytest.mark.slow
def test_losing_every_node_stops_the_run_at_a_checkpoint_and_resume_continues(
    cluster, scripted_llm, tmp_path
):
    """Every worker node killed mid-run: ``qd-run`` ends with one line saying so (no traceback) and
    a checkpoint; with a node back, ``resume=`` finishes the run to its budget."""
    from helpers import qd_run
    from scripted_llm import Rule

    server = scripted_llm([Rule("", slow_program)])
    run = tmp_path / "run"
    driver = start_driver(
        run,
        server.base_url,
        "runner.max_llm_calls=12",
        f"runner.address={cluster.address}",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: stored_so_far(run) >= 8, "children under way")
    killed = cluster.live()
    for node in killed:
        cluster.kill_node(node)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 1 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("qd-run: stopped: runner=ray: every node of the cluster is gone (last: ")
    assert last.endswith("resume=RUN_DIR continues it once nodes are back")
    assert (run / "checkpoints" / "checkpoint.npz").is_file()
    stopped = len(stored(run))
    assert stopped < 18
    cluster.add_worker(f"w{len(cluster.workers) + 1}", cpus=2)
    qd_run(f"resume={run}", cwd=tmp_path)
    children = [c for c in stored(run) if c.parent_ids]  # the founders' number follows in_flight
    assert len(children) == 12 and 1 <= len(stored(run)) - 12 <= 6  # each of the 12 calls' children
    assert [sorted(s["lost"]) for s in sessions(run)] == [killed, []]


def _cluster_of(driver: int) -> list[str]:
    """Live processes of the cluster the run ``driver`` started: the group its lifeline leads
    (the lifeline's command line names ``--parent <driver>``; Ray's processes join its group)."""
    listing = subprocess.run(
        ["ps", "-eww", "-o", "pid=,pgid=,stat=,args="], capture_output=True, text=True
    ).stdout
    ps = [line.split(None, 3) for line in listing.splitlines()]
    groups = {pid for pid, _, _, args in ps if f"--parent {driver} --tag qd-ray" in args}
    return [args for pid, pgid, stat, args in ps if pgid in groups and not stat.startswith("Z")]


def test_a_cluster_qd_starts_ends_with_a_killed_run_and_resume_finishes_it(scripted_llm, tmp_path):
    """No ``runner.address``: qd starts a one-node cluster; ``kill -9`` of qd-run takes the whole
    cluster down (the lifeline kills its process group), and ``resume=`` completes the run."""
    from helpers import qd_run
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    run = tmp_path / "run"
    log = open(tmp_path / "driver.log", "w")
    driver = start_driver(
        run, server.base_url, "runner.max_llm_calls=200", stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while stored_so_far(run) < 40:
            assert driver.poll() is None and time.monotonic() < deadline, (
                tmp_path / "driver.log"
            ).read_text()[-2000:]
            time.sleep(0.3)
        assert (
            len(_cluster_of(driver.pid)) >= 3
        )  # the cluster is up (the head: gcs, raylet, ...), under the run
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 15
    while _cluster_of(driver.pid):
        assert time.monotonic() < deadline, _cluster_of(driver.pid)
        time.sleep(0.3)
    qd_run(f"resume={run}", cwd=tmp_path)
    children = [c for c in stored(run) if c.parent_ids]  # the founders' number follows in_flight
    assert len(children) == 200 and 1 <= len(stored(run)) - 200 <= 6  # each of the 200 calls' children
