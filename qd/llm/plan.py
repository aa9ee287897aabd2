"""The ``llm`` group, checked: :func:`plan_llm` turns it into the client's settings.

Part of ``qd.plan.plan``. Everything about the model that can fail before a run
starts fails here: an unknown provider, no models, a missing URL or API key, the
embedded server's missing package or model file. Nothing is built: no client, no server; the run
builds both from the :class:`LLMPlan` and checks nothing again.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig

from qd import extras
from qd.contract import ConfigError
from qd.llm.client import LLMSettings, ModelSpec

PROVIDERS = ("local", "openai", "vllm", "ollama", "server")


class LocalServer(NamedTuple):
    """``llm.local``: the embedded llama.cpp server qd starts for ``llm.provider=local``."""

    model_path: str | None
    n_ctx: int
    n_threads: int | None
    startup_timeout_s: float


@dataclasses.dataclass(frozen=True)
class LLMPlan:
    """The model client's settings, checked (text tasks only).

    ``settings`` are the client's ``LLMSettings`` but where the run directory or the
    embedded server decides: ``base_url`` is None for ``provider=local`` (the
    server's), and ``cache_dir`` None with ``cache`` means ``<run_dir>/llm_cache``.
    """

    provider: str
    settings: LLMSettings
    cache: bool
    local: LocalServer | None


def plan_llm(cfg: DictConfig) -> LLMPlan:
    """Everything about the model that can fail before the run starts, and the client's settings."""
    llm = cfg.llm
    if llm.provider not in PROVIDERS:
        raise ConfigError(
            "llm.provider", f"unknown provider {llm.provider!r}", f"use one of {list(PROVIDERS)}"
        )
    if not llm.models:
        raise ConfigError("llm.models", "is empty", "name at least one model, e.g. llm=local")
    if sum(m.weight for m in llm.models) <= 0:  # each weight >= 0: the schema's range
        raise ConfigError("llm.models", "weights must have a positive sum", "give some model a weight > 0")
    local = None
    if llm.provider == "local":
        _check_local_server(llm)
        local = LocalServer(
            llm.local.model_path, llm.local.n_ctx, llm.local.n_threads, llm.local.startup_timeout_s
        )
    elif not llm.base_url:
        raise ConfigError("llm.base_url", f"is not set for provider {llm.provider}", "give the server's URL")
    if llm.api_key_env and not os.environ.get(llm.api_key_env):
        raise ConfigError(
            "llm.api_key_env",
            f"environment variable {llm.api_key_env} is not set",
            f"export {llm.api_key_env}=... or set llm.api_key_env=null for a server without keys",
        )
    models = tuple(ModelSpec(m.name, m.weight, m.price_in, m.price_out) for m in llm.models)
    settings = LLMSettings(
        base_url=None if local else llm.base_url,
        models=models,
        api_key_env=llm.api_key_env,
        concurrency=llm.concurrency,
        timeout_s=llm.timeout_s,
        max_retries=llm.max_retries,
        backoff_s=llm.backoff_s,
        backoff_max_s=llm.backoff_max_s,
        give_up_after_s=llm.give_up_after_s,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens,
        seed=cfg.seed if llm.seed is None else llm.seed,
        cache_dir=str(Path(llm.cache_dir)) if llm.cache and llm.cache_dir else None,
    )
    return LLMPlan(llm.provider, settings, bool(llm.cache), local)


def _check_local_server(llm: DictConfig) -> None:
    extras.require("local", "llm=local")
    if llm.local.model_path is not None:
        if not Path(llm.local.model_path).is_file():
            raise ConfigError("llm.local.model_path", f"no file {llm.local.model_path}", "give a GGUF file")
        return
    from qd.llm.server import smollm2_path

    try:
        smollm2_path()
    except (FileNotFoundError, LookupError) as e:
        raise ConfigError("llm.local.model_path", str(e).splitlines()[0]) from None


__all__ = ["PROVIDERS", "LLMPlan", "LocalServer", "plan_llm"]
