"""Published API prices of common models, so a run's cost column is filled without typing them.

USD per million tokens (prompt, completion), standard tier, uncached prompts,
as each provider published them on ``PRICES_AS_OF``. Reasoning tokens are billed
as completion tokens, which is how ``tokens_out`` counts them. Prices change:
a config's ``llm.models[i].price_in``/``price_out`` overrides the table, and a
model not in it costs 0 unless priced there. Open-weight models (Qwen, Llama,
...) have no single price (each host sets its own), so they are not listed.

:func:`price_of` matches a name exactly, then without a provider prefix
(``openai/gpt-4.1-mini`` on OpenRouter is ``gpt-4.1-mini``).
"""

from __future__ import annotations

PRICES_AS_OF = "2025-08-15"

PRICES: dict[str, tuple[float, float]] = {
    # OpenAI (platform.openai.com/docs/pricing)
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.0),
    "gpt-4o-mini": (0.15, 0.60),
    "o3": (2.0, 8.0),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    # Anthropic (anthropic.com/pricing): aliases and dated ids
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-1-20250805": (15.0, 75.0),
    "claude-opus-4-0": (15.0, 75.0),
    "claude-opus-4-20250514": (15.0, 75.0),
    "claude-sonnet-4-0": (3.0, 15.0),
    "claude-sonnet-4-20250514": (3.0, 15.0),
    "claude-3-7-sonnet-latest": (3.0, 15.0),
    "claude-3-7-sonnet-20250219": (3.0, 15.0),
    "claude-3-5-haiku-latest": (0.80, 4.0),
    "claude-3-5-haiku-20241022": (0.80, 4.0),
    "claude-opus-4.1": (15.0, 75.0),  # (OpenRouter's names, after its anthropic/ prefix)
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3.7-sonnet": (3.0, 15.0),
    "claude-3.5-haiku": (0.80, 4.0),
    # Google (ai.google.dev/gemini-api/docs/pricing; 2.5 Pro: prompts up to 200k tokens)
    "gemini-2.5-pro": (1.25, 10.0),
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
    "gemini-2.0-flash": (0.10, 0.40),
    "gemini-2.0-flash-lite": (0.075, 0.30),
    # DeepSeek (api-docs.deepseek.com/quick_start/pricing; standard hours, cache miss)
    "deepseek-chat": (0.27, 1.10),
    "deepseek-reasoner": (0.55, 2.19),
}


def price_of(model: str) -> tuple[float, float] | None:
    """(USD per 1M prompt tokens, per 1M completion tokens) of ``model``, or None if not listed."""
    if model in PRICES:
        return PRICES[model]
    return PRICES.get(model.rsplit("/", 1)[-1])


__all__ = ["PRICES", "PRICES_AS_OF", "price_of"]
