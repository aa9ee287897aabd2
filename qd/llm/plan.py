"""The ``llm`` group, checked: :func:`plan_llm` turns it into the client's settings.

Part of ``qd.plan.plan``. Everything about the model that can fail before a run
starts fails here: an unknown provider, no models, a missing URL or API key, the
embedded server's missing package or model file, a reasoning effort no provider knows. Nothing
is built: no client, no server; the run builds both from the :class:`LLMPlan` and checks nothing
again. Here too each provider's quirks become request fields (how it is asked for a reasoning
effort), and models the config gives no price are priced from ``qd.llm.prices``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from qd import extras
from qd.contract import ConfigError
from qd.llm.client import LLMSettings, ModelSpec
from qd.llm.prices import price_of

EFFORTS = ("none", "minimal", "low", "medium", "high")
# Anthropic takes a thinking budget, not an effort: these, at least its 1024-token minimum
ANTHROPIC_THINKING = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}


def _top_level(effort: str) -> dict[str, Any]:
    return {"reasoning_effort": effort}


def _chat_template(effort: str) -> dict[str, Any]:
    return {"chat_template_kwargs": {"reasoning_effort": effort}}


def _openrouter(effort: str) -> dict[str, Any]:
    return {"reasoning": {"enabled": False} if effort == "none" else {"effort": effort}}


def _anthropic(effort: str) -> dict[str, Any]:
    if effort == "none":
        return {"thinking": {"type": "disabled"}}
    return {"thinking": {"type": "enabled", "budget_tokens": ANTHROPIC_THINKING[effort]}}


# How each provider is asked for ``llm.reasoning_effort`` (docs/providers.md has the rest of
# their quirks): what the plan adds to every request body.
PROVIDERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "local": _top_level,
    "server": _top_level,
    "openai": _top_level,
    "vllm": _top_level,
    "ollama": _top_level,
    "llamacpp": _chat_template,
    "openrouter": _openrouter,
    "anthropic": _anthropic,  # (its OpenAI-compatible endpoint ignores reasoning_effort)
    "gemini": _top_level,
}


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
    if llm.reasoning_effort is not None and llm.reasoning_effort not in EFFORTS:
        raise ConfigError(
            "llm.reasoning_effort", f"unknown effort {llm.reasoning_effort!r}", f"use one of {list(EFFORTS)}"
        )
    reasoning = {} if llm.reasoning_effort is None else PROVIDERS[llm.provider](llm.reasoning_effort)
    extra = OmegaConf.to_container(llm.extra_body) if isinstance(llm.extra_body, DictConfig) else None
    if llm.extra_body is not None and extra is None:
        raise ConfigError("llm.extra_body", "is not a mapping", "write it as llm.extra_body={top_k: 40}")
    models = tuple(ModelSpec(m.name, m.weight, *_prices(m)) for m in llm.models)
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
        max_completion_tokens=llm.max_completion_tokens,
        extra_body={**reasoning, **(extra or {})},
        retry_after_max_s=llm.retry_after_max_s,
        seed=cfg.seed if llm.seed is None else llm.seed,
        cache_dir=str(Path(llm.cache_dir)) if llm.cache and llm.cache_dir else None,
    )
    return LLMPlan(llm.provider, settings, bool(llm.cache), local)


def _prices(model: DictConfig) -> tuple[float, float]:
    """The config's prices where it gives them, else the published ones, else free."""
    listed = price_of(model.name) or (0.0, 0.0)
    price_in, price_out = model.price_in, model.price_out
    return (listed[0] if price_in is None else price_in, listed[1] if price_out is None else price_out)


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


__all__ = ["EFFORTS", "PROVIDERS", "LLMPlan", "LocalServer", "plan_llm"]
