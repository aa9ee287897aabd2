"""``qd.optimize``: a program scored by a function, called from a notebook's event loop, an
agent genome, a call interrupted by SIGINT and continued, bad arguments, ``qd-run resume=``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import runpy
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import sums_or, varied_program
from scripted_llm import Rule

import qd
from qd import cli
from qd.contract import ConfigError
from qd.optimizer import drive

ROOT = Path(__file__).resolve().parents[2]
SEED = "def f(x):\n    return x\n"


def evaluate(program_path):
    """A program's score: how close its f(2) is to 7 (run in the sandbox, shipped as source)."""
    f = runpy.run_path(program_path)["f"]
    return {"score": -abs(f(2.0) - 7.0), "feedback": f"f(2) = {f(2.0)}"}


def stored(run_dir: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        return db.execute("SELECT id, text FROM candidates ORDER BY id").fetchall()


def test_optimize_completes_when_called_from_inside_a_running_event_loop(scripted_llm, tmp_path, capsys):
    server = scripted_llm([Rule("", varied_program)])

    async def notebook_cell():  # a notebook runs each cell inside its own event loop
        asyncio.get_running_loop()
        return qd.optimize(
            SEED,
            evaluate=evaluate,
            base_url=server.base_url,
            model="scripted",
            budget={"llm_calls": 6},
            descriptors="code_metrics",  # placed by qd's describer (conf/descriptor/code_metrics.yaml)
            run_dir=tmp_path / "run",
        )

    result = asyncio.run(notebook_cell())
    assert result.ledger.calls == 6 and server.stats()["requests"] == 6
    assert result.best is not None and result.best.fitness == max(r["fitness"] for r in result.elites)
    assert result.best.text != SEED and result.best.metrics["score"] == result.best.fitness
    assert {"id", "fitness", "text", "AST nodes", "score"} <= set(result.elites[0])  # rows a DataFrame reads
    assert repr(result).startswith("OptimizeResult(best=") and str(result.run_dir) in repr(result)
    assert json.loads((result.run_dir / "optimize.json").read_text())["made_by"] == "qd.optimize"
    assert result.summary["descriptor"]["name"] == "code_metrics"
    cli.main(["show", str(result.run_dir)])  # a run directory like any other
    assert f"{result.summary['evaluations']} evaluations" in capsys.readouterr().out


AGENT = "def forward(task, llm):\n    return llm(task)\n"


def test_an_agent_genome_runs_end_to_end_through_optimize_on_a_dataset(scripted_llm, tmp_path):
    """The agent's code runs in the sandbox and asks the run's model through the host."""
    rows = [{"input": f"What is {n} + {n}?", "answer": str(2 * n)} for n in range(12)]
    told = f"```python\n{AGENT}    # asks the model directly\n```"
    server = scripted_llm([Rule("", sums_or(lambda request: told))])
    result = qd.optimize(
        AGENT,
        genome="agent",
        dataset=rows,
        metric="numeric",
        base_url=server.base_url,
        model="scripted",
        budget={"llm_calls": 40},
        run_dir=tmp_path / "agent",
    )
    assert result.best is not None and result.best.fitness == 1.0  # the model answers every sum
    assert result.heldout[0] == 1.0 and result.ledger.split("role")["heldout"].calls == 3  # 3 test rows
    with sqlite3.connect(result.run_dir / "store.sqlite") as db:
        assert {g for (g,) in db.execute("SELECT DISTINCT genome FROM candidates")} == {"agent"}
        assert db.execute("SELECT COUNT(*) FROM trace").fetchone()[0] > 0  # its model calls, traced
    held_out = json.loads((result.run_dir / "optimize.json").read_text())["held_out"]
    out = tmp_path / "sft.jsonl"
    cli.main(["export", str(result.run_dir), "--kind", "sft", "--out", str(out)])  # its task is in no file
    exported = out.read_text()
    assert len(held_out) == 3 and exported and not [q for q in held_out if q in exported]


def test_an_interrupt_in_a_notebook_stops_the_run_on_its_thread():
    """A notebook runs the call inside its event loop, so the run has a thread of its own and
    Ctrl-C (a KeyboardInterrupt in the main thread) asks the engine there to stop."""

    class Engine:
        reason = None

        def run(self):
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            deadline = time.monotonic() + 20
            while self.reason is None and time.monotonic() < deadline:
                time.sleep(0.01)
            return {"stop_reason": self.reason}

        def request_stop(self, reason):
            self.reason = reason

    async def cell():
        return drive(Engine())

    loop = asyncio.new_event_loop()  # (asyncio.run would take the SIGINT itself; a kernel does not)
    try:
        assert loop.run_until_complete(cell()) == {"stop_reason": "interrupted"}
    finally:
        loop.close()


NOTEBOOK = textwrap.dedent(
    """
    import runpy
    import sys

    import qd


    def evaluate(program_path):  # defined in __main__, as in a notebook
        f = runpy.run_path(program_path)["f"]
        return -abs(f(2.0) - 7.0)


    result = qd.optimize(
        "def f(x):\\n    return x\\n",
        evaluate=evaluate,
        base_url=sys.argv[1],
        model="scripted",
        budget={"llm_calls": 40},
        run_dir=sys.argv[2],
    )
    print("calls", result.ledger.calls, "stop", result.summary.get("stop_reason"))
    """
)


@pytest.mark.slow
def test_an_interrupted_call_keeps_its_candidates_and_the_same_call_continues_it(scripted_llm, tmp_path):
    server = scripted_llm([Rule("", varied_program)], latency_s=0.3)
    script, run_dir = tmp_path / "notebook.py", tmp_path / "run"
    script.write_text(NOTEBOOK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(script), server.base_url, str(run_dir)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None:
        with contextlib.suppress(sqlite3.OperationalError):  # (its tables not made yet)
            if (run_dir / "store.sqlite").exists() and len(stored(run_dir)) >= 6:
                break
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err[-2000:]
    kept = stored(run_dir)
    assert 6 <= len(kept) and int(out.split()[1]) < 40  # stopped cleanly, before its budget
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split()[:2] == ["calls", "40"]  # the budget counts both calls' model calls
    rows = stored(run_dir)
    assert rows[: len(kept)] == kept  # what the first call evaluated stays, once
    assert len(rows) == 1 + 40  # the seed, and one child per model call: nothing evaluated twice
    assert [t for _, t in rows].count("def f(x):\n    return x\n") == [t for _, t in kept].count(
        "def f(x):\n    return x\n"
    )  # no founder evaluated again


def test_bad_arguments_each_give_one_line_naming_the_argument(tmp_path):
    def fails(**kwargs) -> ConfigError:
        args = {"seed": SEED, "evaluate": evaluate, "run_dir": tmp_path / "never"} | kwargs
        with pytest.raises(ConfigError) as e:
            qd.optimize(**args)
        assert "\n" not in str(e.value) and e.value.fix
        return e.value

    assert fails(genome="sonnet").field == "genome"
    assert "budget" == fails(budget={"llm_calls": 0}).field == fails(budget={"evaluation": 5}).field
    rows = [{"question": f"{n} + 1?", "answer": str(n + 1)} for n in range(10)]
    on_rows = {"genome": "prompt", "evaluate": None, "dataset": rows}
    assert "'input'" in fails(**on_rows).problem and fails(**on_rows).field == "columns"
    on_rows["columns"] = {"input": "question"}
    assert fails(**on_rows, metric=3).field == fails(**on_rows, metric="closest").field == "metric"
    assert fails(seed=[]).field == fails(seed="  ").field == "seed"
    assert fails(llm="no-such-preset").field == "llm"
    assert fails(evaluate=None).field == "evaluate"
    assert fails(islands=0).field == "islands"
    assert fails(operators=["mutate"]).field == fails(operators=[]).field == "operators"
    assert fails(objectives=[("score", "up")]).field == "objectives"
    assert fails(**on_rows, objectives=[("score", "max")]).field == "objectives"  # not a dataset's own
    assert (
        fails(parents="instance").field == fails(parents="pareto").field == "parents"
    )  # no rows, no objectives
    assert fails(inspirations="nearest").field == "inspirations"
    assert fails(front_size=3).field == "front_size"  # fronts of no objectives
    assert fails(objectives=[("error", "min")], front_size=0).field == "front_size"
    assert fails(model="m", api_key_env="QD_TEST_UNSET_KEY").field == "api_key_env"
    assert not (tmp_path / "never").exists()  # nothing starts before the arguments are checked


def test_qd_run_resume_refuses_a_run_made_by_optimize_in_one_line(tmp_path, capsys):
    from qd.run import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "optimize.json").write_text(json.dumps({"made_by": "qd.optimize"}))
    with pytest.raises(SystemExit) as e:
        main([f"resume={run_dir}"])
    assert e.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"qd.optimize(..., run_dir='{run_dir}')" in line


def test_a_run_dir_qd_run_made_is_refused_by_optimize(tmp_path):
    run_dir = tmp_path / "cli_run"
    run_dir.mkdir()
    (run_dir / "store.sqlite").write_bytes(b"")
    with pytest.raises(ConfigError, match=f"qd-run resume={run_dir}") as e:
        qd.optimize(SEED, evaluate=evaluate, run_dir=run_dir)
    assert e.value.field == "run_dir"


def error_and_size(program_path):
    """function_fit's two objectives on a small target (x * x + 2): the error of f on 5 points
    (min) and the program's AST size (min); the fitness is minus the error."""
    import ast

    source = open(program_path).read()
    f = runpy.run_path(program_path)["f"]
    error = sum(abs(f(x) - (x * x + 2)) for x in (-2.0, -1.0, 0.0, 1.0, 2.0)) / 5
    return {"score": -error, "error": error, "size": float(len(list(ast.walk(ast.parse(source)))))}


def one_cell(text):
    """Every program in one cell, so its front is decided by the objectives alone."""
    return 0.5


@pytest.mark.slow
def test_front_size_keeps_a_pareto_front_of_the_objectives_in_each_cell(scripted_llm, tmp_path):
    from qd.archive.hypervolume import hypervolume
    from qd.fronts import own_units
    from qd.rundir.reader import RunDir

    server = scripted_llm([Rule("", varied_program)])
    result = qd.optimize(
        SEED,
        evaluate=error_and_size,
        objectives=[("error", "min"), ("size", "min")],
        front_size=3,
        descriptors=[one_cell],
        parents="pareto",
        base_url=server.base_url,
        model="scripted",
        budget={"llm_calls": 24},
        run_dir=tmp_path / "run",
    )
    run = RunDir(result.run_dir)
    fronts = run.fronts()
    assert fronts is not None and fronts.objectives.shape[2:] == (3, 2)
    members = np.asarray(fronts.genome_id) >= 0
    values = np.asarray(fronts.objectives)
    held = members.sum(axis=2)
    assert held.max() >= 2  # the seed (smallest, worse) beside the fittest child: a trade-off kept
    for island, cell in zip(*np.nonzero(held)):
        front = values[island, cell][members[island, cell]]
        for a in front:  # no member dominates another
            assert not any((b >= a).all() and (b > a).any() for b in front)
    objectives = (("error", "min"), ("size", "min"))
    reference = own_units(objectives, result.summary["hypervolume"]["reference"])  # maximised
    total = sum(hypervolume(values[i, c][members[i, c]], reference) for i, c in zip(*np.nonzero(held)))
    assert result.summary["hypervolume"]["total"] == pytest.approx(total, rel=1e-5)
