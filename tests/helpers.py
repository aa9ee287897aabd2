"""Shared builders for tests: small engines on the numeric experiments."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from qd.run import _compose


def small_config(*overrides: str) -> DictConfig:
    """The sphere experiment shrunk to run in about a second."""
    return _compose([
        "experiment=sphere", "experiment.params.dim=10", "archive.bins=[20,20]",
        "archive.lower=[-26,-26]", "archive.upper=[26,26]", "runner.batch_size=32",
        "runner.max_evaluations=640", "runner.progress=false", "runner.checkpoint_every=3",
        *overrides,
    ])


def run_dir(tmp_path: Path, name: str = "run") -> Path:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def evaluate_in_sandbox(task, texts: list[str]):
    """A text task's ``Evaluation`` of ``texts``, through the real sandbox (2 workers, 5 s)."""
    import asyncio

    from qd.evaluator import SandboxEvaluator
    from qd.sandbox import Limits, Sandbox

    evaluator = SandboxEvaluator(task, Sandbox(task.sandbox_entry, workers=2, limits=Limits(wall_s=5)))

    async def go():
        try:
            return await evaluator(texts)
        finally:
            evaluator.close()

    return asyncio.run(go())
