"""qd.build from Python objects alone: no hydra config, no task file, a budgeted client."""

from __future__ import annotations

import numpy as np
from helpers import run_engine

import qd
from qd import archive
from qd.assembly import Run, Settings
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.task import Evaluation, Scored, Stage


class Sphere:
    """A numeric task defined here: minimise the sphere, placed by its first two genes."""

    kind = "vector"
    descriptor_dim = 2
    genome_dim = 4
    genome_bounds = (-1.0, 1.0)

    def initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(-1, 1, (n, self.genome_dim)).astype(np.float32)

    def evaluate(self, genomes) -> Evaluation:
        g = np.asarray(genomes, np.float32)
        return Evaluation(
            fitness=-np.sum(g * g, axis=1),
            descriptor=np.clip((g[:, :2] + 1) / 2, 0, 1),
            valid=np.ones(len(g), bool),
        )


def measure(text: str) -> dict:
    """The host entry: reads the text as data (never runs it)."""
    return {"chars": len(text), "digits": sum(ch.isdigit() for ch in text)}


class Digits:
    """A text task defined here, scored on the host: about 80 characters, placed by digit share."""

    kind = "text"
    descriptor_dim = 1
    description = "Write a short Python function f(x)."
    language = "python"
    host_entry = staticmethod(measure)
    stages = [Stage()]

    def initial(self, rng: np.random.Generator, n: int) -> list[str]:
        return [f"def f(x):\n    return x + {i}\n" for i in range(n)]

    def score(self, text: str, outputs: list) -> Scored:
        m = outputs[-1]
        share = m["digits"] / max(m["chars"], 1)
        return Scored(-abs(m["chars"] - 80) / 80, [min(1.0, 10 * share)], metrics={"chars": m["chars"]})


def test_a_numeric_run_from_python_objects(tmp_path):
    run = qd.build(
        run_dir=tmp_path / "sphere",
        task=Sphere(),
        spec=archive.GridSpec((5, 5), (0.0, 0.0), (1.0, 1.0)),
        budget=qd.Budget(max_evaluations=256),
        settings=Settings(batch_size=32, progress=False, seed=3),
    )
    assert isinstance(run, Run)
    summary = run_engine(run)
    assert summary["evaluations"] == 256
    elites = qd.elites(tmp_path / "sphere")
    assert 1 < len(elites) <= 25
    assert [e.fitness for e in elites] == sorted((e.fitness for e in elites), reverse=True)
    best = elites[0]
    assert best.fitness == float(-np.sum(np.asarray(best.candidate.vector) ** 2))
    assert (tmp_path / "sphere" / "elites.jsonl").is_file()


def test_a_text_run_from_python_objects_stops_at_its_call_budget(tmp_path, scripted_llm):
    from helpers import varied_program
    from scripted_llm import Rule

    server = scripted_llm([Rule("", varied_program)])
    client = LLMClient(LLMSettings(base_url=server.base_url, models=(ModelSpec("scripted"),)))
    run = qd.build(
        run_dir=tmp_path / "digits",
        task=Digits(),
        spec=archive.GridSpec((6,), (0.0,), (1.0,)),
        llm=client,
        operators=["rewrite"],
        budget=qd.Budget(max_llm_calls=9),
        settings=Settings(batch_size=1, in_flight=2, initial_population=2, progress=False),
    )
    summary = run_engine(run)
    assert len(server.requests) == 9  # the budget bound the calls that reached the server
    assert summary["llm"]["calls"] == 9
    elites = qd.elites(tmp_path / "digits")
    assert elites and all(e.candidate.kind == "text" for e in elites)
    founders = {f"def f(x):\n    return x + {i}\n" for i in range(2)}
    assert any(e.candidate.text not in founders for e in elites)  # a child of the model entered


def test_the_host_and_device_drivers_meet_the_run_protocol():
    from qd.device.driver import DeviceEngine
    from qd.loop import Engine

    members = [m for m in vars(Run) if not m.startswith("_")]
    assert sorted(members) == ["close", "on_close", "run", "summary"]
    for driver in (Engine, DeviceEngine):
        assert all(callable(getattr(driver, m, None)) for m in members), driver


class Answers:
    """A caller's own ChatClient (no HTTP): a new program for every call."""

    def __init__(self):
        self.calls = 0

    async def complete(
        self, messages, *, model, temperature, max_tokens, sample_index, stop=None, role="mutate"
    ):
        from qd.contract import Completion

        self.calls += 1
        body = "\n".join(f"    y = y + {self.calls * k}" for k in range(1, 4))
        text = f"```python\ndef f(x):\n    y = x\n{body}\n    return y\n```"
        return Completion(text, model, 10, 20, 0.0, False, "stop", 0.01)


def test_a_callers_chat_client_is_wrapped_in_the_ledger_budget_and_cache(tmp_path):
    chat = Answers()
    run_dir = tmp_path / "own"
    run = qd.build(
        run_dir=run_dir,
        task=Digits(),
        spec=archive.GridSpec((6,), (0.0,), (1.0,)),
        llm=chat,
        budget=qd.Budget(max_llm_calls=5),
        settings=Settings(batch_size=1, in_flight=1, initial_population=1, progress=False),
    )
    summary = run_engine(run)
    assert chat.calls == 5 and summary["llm"]["calls"] == 5  # the budget bound the caller's client
    assert any((run_dir / "llm_cache").rglob("*"))  # and its answers are cached for a replay
