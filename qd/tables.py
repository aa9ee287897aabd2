"""What every experiment table shares: its command line, the model server, and runs of seeds.

A table runs an experiment (or several arms of it) once per seed, to the same
model-call budget, on one model server: the embedded llama.cpp server (started
once, stopped at the end) or any OpenAI-compatible one (``--base-url``). All
runs of a table share one response cache (``<out>/llm_cache``), so a rerun
replays them without asking the model again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from qd import heldout
from qd.llm import LLMClient, LLMSettings, ModelSpec
from qd.plan import compose, plan
from qd.run import run_in


def arguments(
    experiment: str,
    argv: Sequence[str] | None,
    doc: str | None = None,
    default_out: Path | None = None,
    held_out: int | None = 24,
    max_llm_calls: int | None = None,
) -> argparse.Namespace:
    """The options every table takes (seeds, budget, server, output, overrides), and the held-out size
    where the table scores held-out problems (``held_out`` not None). A table without a budget of its
    own (``max_llm_calls`` None) runs to the experiment's."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--max-llm-calls",
        type=int,
        default=max_llm_calls,
        help=f"per run, every call counted (default: {max_llm_calls or 'the experiment config'})",
    )
    if held_out is not None:
        ap.add_argument("--held-out", type=int, default=held_out, help="held-out problems")
    ap.add_argument(
        "--base-url", default=None, help="an OpenAI-compatible server (default: the embedded one)"
    )
    ap.add_argument("--model", default=None, help="the model name on --base-url")
    ap.add_argument("--api-key-env", default=None)
    ap.add_argument("--out", type=Path, default=default_out or Path("outputs") / experiment / "table")
    ap.add_argument("overrides", nargs="*", help="more qd-run overrides for every run")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    return a


def model_server(a: argparse.Namespace) -> contextlib.AbstractContextManager[tuple[str, str]]:
    """(base_url, model): ``--base-url``'s, or the embedded server's (started here, stopped after)."""
    return heldout.model_server(a.base_url, a.model, a.out)


def shared_overrides(experiment: str, a: argparse.Namespace, base_url: str, model: str) -> list[str]:
    """The overrides of every run of a table: the experiment, the server, the shared cache, the budget."""
    shared = [
        f"experiment={experiment}",
        "llm.provider=server",
        f"llm.base_url={base_url}",
        f"llm.models=[{{name: '{model}'}}]",
        f"llm.api_key_env={a.api_key_env or 'null'}",
        "runner.progress=false",
        f"llm.cache_dir={a.out / 'llm_cache'}",
        *a.overrides,
    ]
    if a.max_llm_calls is not None:
        shared.append(f"runner.max_llm_calls={a.max_llm_calls}")
    return shared


def run_seeds(overrides: Sequence[str], seeds: Sequence[int], out: Path) -> list[dict[str, Any]]:
    """One run per seed in ``out/seed<N>``: its seconds, model calls and evaluations."""
    runs = []
    for seed in seeds:
        started = time.monotonic()
        try:
            summary = run_in(plan(compose([*overrides, f"seed={seed}"])), out / f"seed{seed}")
        except SystemExit:  # stopped early (printed); the store holds what it evaluated
            summary = {}
        runs.append(
            {
                "seed": seed,
                "seconds": round(time.monotonic() - started, 1),
                "llm_calls": summary.get("llm", {}).get("calls"),
                "evaluations": summary.get("evaluations"),
            }
        )
        print(f"{out.name} seed {seed}: {runs[-1]}", flush=True)
    return runs


def measurement(measure: Callable[[LLMClient], Awaitable[Any]], doc: str | None, concurrency: int = 4) -> Any:
    """The command line of a judge measurement: ``await measure(client)`` against ``--base-url``
    (``--model``) or the embedded server (started and stopped here); its result is printed as JSON."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--base-url", help="an OpenAI-compatible server; default: start the embedded SmolLM2")
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()

    def client(base_url: str, model: str) -> LLMClient:
        return LLMClient(
            LLMSettings(base_url=base_url, models=(ModelSpec(model),), concurrency=concurrency, timeout_s=120)
        )

    if args.base_url:
        result = asyncio.run(measure(client(args.base_url, args.model)))
    else:
        from qd.llm.server import EmbeddedServer

        with EmbeddedServer(log_path=Path(tempfile.mkdtemp()) / "server.log") as server:
            result = asyncio.run(measure(client(server.base_url, server.model)))
    print(json.dumps(result, indent=1))
    return result


def client_for(cfg: Any, a: argparse.Namespace, base_url: str, model: str) -> LLMClient:
    """A client for scoring after the runs: the runs' settings and their shared cache."""
    return heldout.scoring_client(cfg, base_url, model, a.api_key_env, a.out / "llm_cache")
