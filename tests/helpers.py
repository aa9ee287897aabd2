"""Shared builders for tests: small engines on the numeric experiments, a fake model client."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from qd.contract import Completion
from qd.plan import compose

# A small sphere run of qd-run's command line (4-D, 32 evaluations, quiet), and what an
# in-process run adds: hydra must not reconfigure logging (its dictConfig closes every
# handler, pytest's too).
SPHERE_RUN = [
    "experiment=sphere",
    "experiment.params.dim=4",
    "archive.bins=[8,8]",
    "archive.lower=[-26,-26]",
    "archive.upper=[26,26]",
    "runner.batch_size=16",
    "runner.max_evaluations=32",
    "runner.progress=false",
]
HYDRA_IN_PROCESS = ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def small_config(*overrides: str) -> DictConfig:
    """The sphere experiment shrunk to run in about a second, on the host loop
    (whose parts the tests drive; ``tests/qd/device/test_device.py`` covers the device loop)."""
    return compose(
        [
            "experiment=sphere",
            "experiment.params.dim=10",
            "archive.bins=[20,20]",
            "archive.lower=[-26,-26]",
            "archive.upper=[26,26]",
            "runner.batch_size=32",
            "runner.max_evaluations=640",
            "runner.progress=false",
            "runner.checkpoint_every=3",
            "runner.loop=host",
            *overrides,
        ]
    )


class FakeClient:
    """Answers from a list, records every call; raises an answer that is an exception."""

    def __init__(self, *answers, finish_reason="stop"):
        self.answers = list(answers)
        self.calls: list[dict] = []
        self.finish_reason = finish_reason

    def pick_model(self, rng):
        return ["model-a", "model-b"][int(rng.integers(2))]

    async def complete(
        self, messages, *, model=None, temperature=None, max_tokens=None, sample_index=0, stop=None
    ):
        self.calls.append(
            dict(
                messages=messages,
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
                sample_index=sample_index,
            )
        )
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Completion(
            text=answer,
            model=model or "default-model",
            tokens_in=100 + len(self.calls),
            tokens_out=20,
            cost=0.25,
            cached=False,
            finish_reason=self.finish_reason,
            seconds=0.1,
        )


def evaluate_on_host(task, base_url: str, texts: list[str], budget, models: tuple[str, ...] = ("scripted",)):
    """``task``'s evaluation of ``texts`` through the real host runner and model gateway,
    asking ``base_url``."""
    import asyncio

    from qd.evaluator import HostRunner, StagedEvaluator
    from qd.llm import LLMClient, LLMSettings, ModelSpec

    client = LLMClient(
        LLMSettings(base_url=base_url, models=tuple(map(ModelSpec, models)), timeout_s=10, max_retries=0)
    )
    evaluator = StagedEvaluator(task, HostRunner(task.host_entry), client, budget)

    async def go():
        try:
            return await evaluator(texts)
        finally:
            evaluator.close()
            await client.aclose()

    return asyncio.run(go())


def run_dir(tmp_path: Path, name: str = "run") -> Path:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def evaluate_in_sandbox(task, texts: list[str]):
    """A text task's ``Evaluation`` of ``texts``, through the real sandbox (2 workers, 5 s)."""
    import asyncio

    from qd.evaluator import StagedEvaluator
    from qd.sandbox import Limits, Sandbox

    evaluator = StagedEvaluator(task, Sandbox(task.sandbox_entry, workers=2, limits=Limits(wall_s=5)))

    async def go():
        try:
            return await evaluator(texts)
        finally:
            evaluator.close()

    return asyncio.run(go())


def text_engine(cfg: DictConfig, path: Path, describer, stack, spec=None):
    """A function_fit-style engine from ``cfg`` with ``describer`` placing candidates
    (default archive: an 8-cell grid on [0, 1] per descriptor axis)."""
    from qd import Budget, Settings, archive, build
    from qd.plan import plan
    from qd.run import _build_evaluator, build_llm, build_operators

    p = plan(cfg)
    client = build_llm(p, path, stack)
    d = describer.dim
    settings = Settings(
        batch_size=1,
        in_flight=4,
        checkpoint_every=5,
        progress=False,
        initial_population=cfg.runner.initial_population,
    )
    return build(
        task=p.task,
        spec=spec or archive.GridSpec((8,) * d, (0.0,) * d, (1.0,) * d),
        operators=build_operators(p, client),
        evaluator=_build_evaluator(p, client, path),
        run_dir=path,
        budget=Budget(max_llm_calls=cfg.runner.max_llm_calls),
        settings=settings,
        llm=client,
        describer=describer,
    )


def run_engine(engine) -> dict:
    """Runs an engine to its budget and closes it; its summary."""
    try:
        return engine.run()
    finally:
        engine.close()


def run_config(cfg: DictConfig, path: Path) -> dict:
    """``build_engine`` + :func:`run_engine`: a whole run of ``cfg`` in ``path``."""
    from qd.run import build_engine

    return run_engine(build_engine(cfg, path))


def stored(path: Path) -> list:
    """Every candidate in the run directory's store, by id."""
    from qd.store import Store

    with Store(path / "store.sqlite", readonly=True) as store:
        return list(store.iter())


def varied_program(request: dict) -> str:
    """A scripted model's answer: a different small program per sample seed, one in seven
    without code (an invalid child), so runs get varied fitness, cells, diffs and errors."""
    seed = int(request.get("seed") or 0)
    if seed % 7 == 6:
        return "I am sorry, I cannot write code."
    a, b = seed % 5 * 0.25, seed % 3
    extra = "\n    y = y + 0.0 * x\n" if seed % 2 else "\n"
    return f"```python\ndef f(x):\n    y = x * x + {a} * x + {b}{extra}    return y\n```"


def sums_or(proposal):
    """A scripted reply for a dataset of sums: a solver asked "What is A + B?" gets A + B (right),
    any other request (an operator's) ``proposal(request)``."""
    import re

    def reply(request: dict) -> str:
        asked = re.fullmatch(r"What is (\d+) \+ (\d+)\?", str(request["messages"][-1]["content"]).strip())
        return str(int(asked[1]) + int(asked[2])) if asked else proposal(request)

    return reply


def text_run(path: Path, base_url: str, *overrides: str) -> Path:
    """A finished function_fit run in ``path``: 2 islands, 24 scripted model calls."""
    from qd.plan import compose

    run_config(
        compose(
            [
                "experiment=function_fit",
                "llm.provider=server",
                f"llm.base_url={base_url}",
                "llm.models=[{name: scripted, price_in: 1.0, price_out: 2.0}]",
                "llm.api_key_env=null",
                "llm.timeout_s=5",
                "runner.progress=false",
                "runner.max_llm_calls=24",
                "runner.in_flight=4",
                "runner.workers=2",
                "islands.count=2",
                "operators.mix=[{name: rewrite}]",
                *overrides,
            ]
        ),
        path,
    )
    return path


def cvt_run(path: Path, *overrides: str) -> Path:
    """A finished sphere run in ``path``: 3 islands on a 500-cell CVT archive, 1,500 evaluations."""
    run_config(
        small_config(
            "archive=cvt", "archive.cells=500", "islands.count=3", "runner.max_evaluations=1500", *overrides
        ),
        path,
    )
    return path


def qd_run(*args: str, cwd: Path, check: bool = True, timeout: float = 300, python: str | Path | None = None):
    """``qd-run`` as a user runs it from ``cwd``, with this checkout's qd (not an installed copy)."""
    return run_python("-m", "qd.run", *args, cwd=cwd, check=check, timeout=timeout, python=python)


def run_python(
    *args: str, cwd: Path, check: bool = True, timeout: float = 300, python: str | Path | None = None
):
    """``python ARGS`` (this interpreter, or ``python``: another environment's) from ``cwd``, with
    this checkout's qd first on its path; asserts it succeeded unless ``check`` is False."""
    import subprocess
    import sys

    proc = subprocess.run(
        [str(python or sys.executable), *args],
        cwd=cwd,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def start_qd_run(*args: str, cwd: Path):
    """``qd-run ARGS`` from ``cwd`` in a process of its own (this checkout's qd), not waited for:
    its stderr is a text pipe, its stdout dropped."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "qd.run", *args],
        cwd=cwd,
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def checkout_env() -> dict[str, str]:
    """This process's environment with this checkout first on ``PYTHONPATH``."""
    import os

    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def on_server(base_url: str, model: str = "scripted") -> list[str]:
    """The overrides that point a run at the OpenAI-compatible server at ``base_url`` (scripted
    or the embedded llama.cpp one), no API key, no progress bar."""
    return [
        "llm.provider=server",
        f"llm.base_url={base_url}",
        f"llm.models=[{{name: {model}}}]",
        "llm.api_key_env=null",
        "runner.progress=false",
    ]


def scripted_text_config(base_url: str, *overrides: str) -> DictConfig:
    """function_fit asking the scripted server at ``base_url``: rewrites only, 2 workers, quiet."""
    return compose(
        [
            "experiment=function_fit",
            *on_server(base_url),
            "llm.timeout_s=5",
            "runner.in_flight=4",
            "runner.workers=2",
            "sandbox.wall_s=2",
            "operators.mix=[{name: rewrite}]",
            *overrides,
        ]
    )


# ----- driving one LLMClient (tests/qd/llm/) -------------------------------------

MSG = [{"role": "user", "content": "hello"}]


def run(client, *calls):
    """Run calls on one event loop and close the client, as a run does at its end."""
    import asyncio

    async def main():
        try:
            return [await c(client) for c in calls]
        finally:
            await client.aclose()

    return asyncio.run(main())


def call(messages=MSG, **kw):
    return lambda client: client.complete(messages, **kw)


def fast_settings(url: str, **kw):
    """``LLMSettings`` for model "m" (priced 2 and 10 USD per 1M tokens) at ``url``: fast retries
    so fault tests stay quick, a short timeout so "hang" costs little."""
    from qd.llm import LLMSettings, ModelSpec

    base = dict(
        models=(ModelSpec("m", price_in=2.0, price_out=10.0),),
        backoff_s=0.01,
        backoff_max_s=0.05,
        max_retries=3,
        timeout_s=0.5,
    )
    return LLMSettings(base_url=url, **{**base, **kw})


def counts(client) -> tuple[int, int, int]:
    """(answered calls, retries, failed calls) in the client's ledger."""
    t = client.ledger.total()
    return t.calls, t.retries, t.failed
