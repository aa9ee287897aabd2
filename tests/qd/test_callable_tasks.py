"""code_task and host_task: an evaluate function scores programs in the sandbox, data on the host."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import sqlite3
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import run_engine, run_python

import qd
from descriptors.code_metrics import code_metrics
from qd import archive
from qd.assembly import Settings
from qd.callable_tasks import MADE_BY, code_task, host_task
from qd.contract import ConfigError
from qd.evaluator import StagedEvaluator
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.sandbox import Limits, Sandbox

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(wall_s=3, cpu_s=5, memory_mb=512, file_mb=4, nproc=16, output_kb=4, output_cap_mb=1)


def run_main(program_path):
    """The hostile programs' evaluator: imports the candidate and reports what its main() did."""
    namespace = {"__name__": "candidate"}
    with open(program_path) as f:
        exec(compile(f.read(), program_path, "exec"), namespace)
    return {"score": 1.0, "feedback": repr(namespace["main"]())}


def evaluate_in(task, texts, limits=LIMITS):
    evaluator = StagedEvaluator(task, Sandbox(task.sandbox_entry, workers=2, limits=limits))
    try:
        return asyncio.run(evaluator(texts))
    finally:
        evaluator.close()


@pytest.mark.slow
def test_an_evaluate_of_main_evolves_a_program_in_the_sandbox(tmp_path, scripted_llm):
    """The notebook case: a script's ``evaluate`` (with a helper and a constant of ``__main__``)
    scores each candidate in the sandbox, on its file, while the scripted model proposes."""
    from helpers import varied_program
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, math, os, sys
            import qd
            from qd import archive
            from qd.assembly import Settings
            from qd.callable_tasks import code_task
            from qd.llm import LLMClient, LLMSettings, ModelSpec

            POINTS = [-2.0, -1.0, 0.0, 1.0, 2.0]

            def target(x):
                return x * x + 0.5 * x + 2.0

            def evaluate(program_path):
                namespace = {}
                exec(open(program_path).read(), namespace)
                error = sum((namespace["f"](x) - target(x)) ** 2 for x in POINTS)
                return {"score": -math.sqrt(error / len(POINTS)), "feedback": program_path}

            if __name__ == "__main__":
                task = code_task(["def f(x):\\n    return 0.0\\n"], evaluate)
                client = LLMClient(LLMSettings(base_url=sys.argv[1], models=(ModelSpec("scripted"),)))
                run = qd.build(
                    run_dir=sys.argv[2], task=task, llm=client,
                    spec=archive.GridSpec((6, 4), (0.0, 0.0), (60.0, 8.0)),
                    budget=qd.Budget(max_llm_calls=6),
                    settings=Settings(batch_size=2, in_flight=2, initial_population=1, progress=False),
                )
                try:
                    print(json.dumps(run.run()["evaluations"]))
                finally:
                    run.close()
            """
        )
    )
    run_dir = tmp_path / "run"
    done = run_python(str(script), server.base_url, str(run_dir), cwd=tmp_path, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) >= 7  # the founders and six children
    elites = qd.elites(run_dir)
    assert any(e.candidate.text != "def f(x):\n    return 0.0\n" for e in elites)  # the model's entered
    for elite in elites:  # each scored by evaluate, as it scores here, on its own file in the sandbox
        namespace: dict = {}
        exec(elite.candidate.text, namespace)
        error = sum((namespace["f"](x) - (x * x + 0.5 * x + 2.0)) ** 2 for x in (-2.0, -1.0, 0.0, 1.0, 2.0))
        assert elite.fitness == pytest.approx(-math.sqrt(error / 5), rel=1e-5)
        feedback = elite.candidate.artifacts["feedback"]
        assert feedback.endswith("/program.py") and not Path(feedback).exists()  # not the host's file


@pytest.mark.slow
def test_hostile_candidates_are_contained(tmp_path, scripted_llm):
    """The sandbox tests' hostile programs, as the model's answers in a code_task's run: the host's
    files, network and processes stay out of their reach, and the sandbox keeps scoring."""
    from scripted_llm import Rule

    task = code_task(["def main():\n    return 0\n"], run_main, descriptors=["lines"])
    sandbox = Sandbox(task.sandbox_entry, workers=2, limits=LIMITS)
    report = sandbox.isolation()
    token = f"cbx_{random.randrange(10**9)}"
    secret = tmp_path / "secret.txt"
    secret.write_text(token[::-1])  # what only reading the file shows
    outside = [str(REPO / token), str(tmp_path / token), f"/tmp/{token}", f"/dev/shm/{token}"]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0)
    hostile = {
        "read": f"def main():\n    return open({str(secret)!r}).read()\n",
        "write": f"def main():\n    for path in {outside!r}:\n        try:\n"
        "            open(path, 'w').write('x')\n        except OSError:\n            pass\n",
        "network": "import socket\ndef main():\n    socket.create_connection(('127.0.0.1', "
        f"{listener.getsockname()[1]}), timeout=1).close()\n    return 'connected'\n",
        "fork_bomb": "import os\ndef main():\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "kill_parent": "import os\ndef main():\n    os.kill(os.getppid(), 9)\n    return 'survived'\n",
        "fine": "def main():\n    return 'fine'\n",
    }
    server = scripted_llm([Rule("", f"```python\n{text}```", times=1) for text in hostile.values()])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),)))
    run = qd.build(
        run_dir=tmp_path / "run",
        task=task,
        spec=archive.GridSpec((8,), (0.0,), (16.0,)),
        llm=client,
        evaluator=StagedEvaluator(task, sandbox),
        budget=qd.Budget(max_llm_calls=len(hostile)),
        settings=Settings(batch_size=1, in_flight=1, initial_population=1, progress=False),
    )
    try:
        run.run()
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
    finally:
        run.close()
        listener.close()
    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as db:
        rows = db.execute("SELECT text, valid, error, artifacts FROM candidates").fetchall()
    assert token[::-1] not in json.dumps(rows)  # the secret never came back
    said = {name: row[1:] for name, text in hostile.items() for row in rows if row[0] == text}
    assert set(said) == set(hostile)  # each was evaluated
    if report["private_tmp"]:
        assert not said["read"][0] and "FileNotFoundError" in said["read"][1]
    if report["private_tmp"] and report["read_only_fs"]:
        assert [p for p in outside if os.path.exists(p)] == []
    assert report["network_off"] and not said["network"][0]
    assert not said["fork_bomb"][0] and "timeout" in said["fork_bomb"][1]
    valid, error, artifacts = said["kill_parent"]
    assert (valid and "survived" in artifacts) or "sandbox worker died" not in error
    assert said["fine"][0] and "fine" in said["fine"][2]  # the sandbox kept scoring after them all


def lengths(program_path):
    with open(program_path) as f:
        text = f.read()
    return {"combined_score": -len(text), "size": len(text), "note": "short is better"}


def test_a_code_task_scores_numbers_dicts_and_failures_in_the_sandbox():
    task = code_task(["x = 1\n"], lengths, descriptors=["size", "nodes"])
    assert task.made_by == MADE_BY and task.descriptor_names[0] == "size" and task.descriptor_dim == 2
    ev = evaluate_in(task, ["x = 1\n", "x = (\n"])
    assert ev.valid.tolist() == [True, False]
    assert ev.fitness[0] == -6.0 and ev.descriptor[0].tolist() == [6.0, code_metrics("x = 1\n")["nodes"]]
    assert ev.metrics[0]["size"] == 6.0 and ev.artifacts[0]["note"] == "short is better"
    assert ev.error[1] == "syntax error"  # a code-metric axis of a program that does not parse


def number(program_path):
    return 0.25


def raises(program_path):
    raise RuntimeError("no score for you")


def test_a_bare_number_is_the_fitness_and_a_raising_evaluate_fails_the_candidate():
    ev = evaluate_in(code_task(["x = 1\n"], number), ["x = 1\n"])
    assert ev.valid[0] and ev.fitness[0] == 0.25 and ev.metrics[0]["score"] == 0.25
    ev = evaluate_in(code_task(["x = 1\n"], raises), ["x = 1\n"])
    assert not ev.valid[0] and "RuntimeError: no score for you" in ev.error[0]


def asks_the_agent(program_path, llm):
    """An agent's evaluator: runs the candidate's ``forward(question, llm)`` with the run's model."""
    namespace = {}
    with open(program_path) as f:
        exec(f.read(), namespace)
    answer = namespace["forward"]("What is 2+2?", llm)
    return {"score": float(answer.strip() == "4"), "feedback": f"answered {answer!r}"}


def test_an_agents_evaluate_gets_the_runs_model_in_the_sandbox(scripted_llm):
    from scripted_llm import Rule

    server = scripted_llm([Rule(r"What is 2\+2", "4")])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),)))
    task = code_task(
        ["def forward(q, llm):\n    return q\n"], asks_the_agent, "agent", calls_per_evaluation=1
    )
    assert task.models and task.eval_budget.calls == 1 and not code_task(["x"], number).models
    agent = "def forward(question, llm):\n    return llm('Answer: ' + question)\n"
    greedy = "def forward(question, llm):\n    llm(question)\n    return llm(question)\n"
    evaluator = StagedEvaluator(task, Sandbox(task.sandbox_entry, limits=LIMITS), client, task.eval_budget)
    try:
        ev = asyncio.run(evaluator([agent, greedy]))
    finally:
        evaluator.close()
    assert ev.valid[0] and ev.fitness[0] == 1.0 and ev.artifacts[0]["feedback"] == "answered '4'"
    assert len(ev.traces[0]) == 1 and ev.metrics[0]["model_calls"] == 1
    assert not ev.valid[1] and "llm" in ev.error[1]  # its second call is over the candidate's budget
    assert len(server.requests) == 2


def graded(candidate, llm):
    answer = llm(f"{candidate}\nWhat is 2+2?")
    return {"score": float(answer.strip() == "4"), "feedback": f"answered {answer!r}"}


def test_a_host_task_gets_the_runs_budgeted_ledgered_model(tmp_path, scripted_llm):
    from scripted_llm import Rule

    server = scripted_llm([Rule(r"What is 2\+2", "4"), Rule("", "Answer with the number only.")])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),)))
    task = host_task(["Be brief."], graded, descriptors=["words"], calls_per_evaluation=2)
    run = qd.build(
        run_dir=tmp_path / "run",
        task=task,
        spec=archive.GridSpec((8,), (0.0,), (16.0,)),
        llm=client,
        operators=[qd_operator("rewrite", client, "prompt")],
        budget=qd.Budget(max_llm_calls=12),
        settings=Settings(batch_size=1, in_flight=1, initial_population=1, progress=False),
    )
    summary = run_engine(run)
    asked = [r for r in server.requests if "What is 2+2" in json.dumps(r)]
    assert len(server.requests) == summary["llm"]["calls"] <= 12  # evaluations' calls count in the budget
    assert len(asked) >= 2 and summary["llm"]["per_role"]["agent"]["calls"] == len(asked)
    elites = qd.elites(tmp_path / "run")
    assert {e.fitness for e in elites} == {1.0}
    assert all(e.candidate.artifacts["feedback"] == "answered '4'" for e in elites)
    assert any(e.candidate.text.strip() == "Answer with the number only." for e in elites)


async def answer_later(candidate, llm):
    return 1.0


def qd_operator(name, client, genome):
    import genomes
    from operators import make_llm_operator

    return make_llm_operator(name, client, genome=genomes.get(genome))


def test_host_task_descriptors_measure_the_text_or_call_a_function():
    def vowels(text):
        return sum(ch in "aeiou" for ch in text)

    task = host_task(["a b"], graded, descriptors=["words", "characters", vowels])
    scored = task.score("one two", [{"metrics": {"score": 0.5}, "artifacts": {}}])
    assert scored.valid and scored.fitness == 0.5 and scored.descriptor == [2.0, 7.0, 3.0]
    assert task.descriptor_names == ("words", "characters", "vowels")
    assert task.initial(np.random.default_rng(0), 3) == ["a b"] * 3


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda: code_task([], number), "seed: give one or more non-empty starting texts"),
        (lambda: code_task(["x"], number, descriptors=[]), "descriptors: must name at least one"),
        (lambda: code_task(["x"], lambda p: 1.0), "evaluate: a lambda cannot be shipped"),
        (lambda: host_task(["x"], "graded"), "evaluate: str, not callable"),
        (lambda: host_task(["x"], answer_later), "evaluate: an async def"),
        (lambda: code_task(["x"], answer_later), "evaluate: answer_later is an async def"),
        (lambda: code_task(["x"], number, genome="poem"), "genome: unknown genome kind 'poem'"),
        (lambda: code_task(["x"], number, genome="prompt"), "genome: 'prompt' is a data genome"),
        (lambda: host_task(["x"], graded, genome="program"), "genome: 'program' is a code genome"),
        (lambda: host_task(["x"], graded, calls_per_evaluation=-1), "calls_per_evaluation: -1 is not"),
    ],
)
def test_bad_arguments_are_one_line_errors(make, problem):
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value).startswith(problem) and "\n" not in str(e.value)


def test_each_task_carries_the_range_of_its_axes():
    def vowels(text):
        return sum(ch in "aeiou" for ch in text)

    assert code_task(["def f(x):\n    return x\n"], run_main).descriptor_bounds == ((0.0, 400.0), (0.0, 12.0))
    program = code_task(["def f(x):\n    return x\n"], run_main, descriptors=["lines", "tokens", "error"])
    assert program.descriptor_bounds == ((0.0, 50.0), (0.0, 1.0), (0.0, 1.0))  # a user's metric: [0, 1]
    text = host_task(["a b"], graded, descriptors=["words", "characters", vowels, "accuracy"])
    assert text.descriptor_bounds == ((0.0, 200.0), (0.0, 1500.0), (0.0, 1.0), (0.0, 1.0))
