"""What an instruction pool (``operators.meta``) accepts, checked apart from the pool: its settings,
so a builder can check a config without building a pool, and each instruction text, seed or
model answer, which must be one new line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from genomes.answers import MalformedAnswer
from operators.llm import load_templates
from qd.contract import ConfigError

# template name -> (placeholders it must use, placeholders it may use), as in ``operators.llm``
TEMPLATE_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "mutate": ({"mutation", "instruction"}, {"task", "mutation", "instruction", "noun"}),
    "hyper": ({"mutation"}, {"task", "mutation", "noun"}),
}
_LABEL = re.compile(r"^(?:new |improved |better )?(?:instruction|prompt)\s*:\s*", re.IGNORECASE)
_QUOTES = "\"'`*"


def checked_settings(
    *,
    seeds: Sequence[str],
    mutation_prompt: str,
    size: int,
    evolve_every: int,
    min_uses: int,
    temperature: float,
    explore: float,
    hyper_every: int,
    max_chars: int,
    max_tokens: int,
    templates: dict[str, str] | None,
) -> tuple[list[str], str, dict[str, Any]]:
    """The seeds and the mutation prompt cut to one line each, and the templates; or ConfigError."""
    for name, value, least in [
        ("size", size, 1),
        ("evolve_every", evolve_every, 1),
        ("hyper_every", hyper_every, 1),
        ("min_uses", min_uses, 0),
        ("max_chars", max_chars, 1),
        ("max_tokens", max_tokens, 1),
    ]:
        if value < least:
            raise ConfigError(name, f"must be >= {least}, got {value}")
    if not temperature > 0 or not explore >= 0:
        raise ConfigError("temperature, explore", f"need > 0 and >= 0, got {temperature}, {explore}")
    if not 1 <= len(seeds) <= size:
        raise ConfigError("seeds", f"need 1 to size={size} seeds, got {len(seeds)}")
    kept: dict[str, str] = {}  # normalized -> text
    for name, text in [
        *((f"seeds[{i}]", s) for i, s in enumerate(seeds)),
        ("mutation_prompt", mutation_prompt),
    ]:
        try:
            text = parse_instruction(text, max_chars, None, {})
        except MalformedAnswer as err:
            raise ConfigError(name, err.reason) from None
        if instruction_key(text) in kept:
            raise ConfigError(name, "repeats another seed")
        kept[instruction_key(text)] = text
    *first, mutation = kept.values()
    return first, mutation, load_templates(templates, TEMPLATE_FIELDS)


def parse_instruction(answer: str, max_chars: int, parent: str | None, others: Mapping[int, str]) -> str:
    """An answer -> one instruction line; strict apart from a leading label and enclosing quotes.

    ``others`` maps the pool's members' ids to their texts.

    Raises:
        MalformedAnswer: empty, more than one line, longer than ``max_chars``,
            or the same (ignoring case and spacing) as the parent or another member.
    """
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if len(lines) > 1:
        raise MalformedAnswer(f"answer has {len(lines)} lines (expected one)")
    text = _LABEL.sub("", lines[0]).strip(_QUOTES + " ") if lines else ""
    if not text:
        raise MalformedAnswer("empty answer")
    if len(text) > max_chars:
        raise MalformedAnswer(f"answer has {len(text)} characters (at most {max_chars})")
    if parent is not None and instruction_key(text) == instruction_key(parent):
        raise MalformedAnswer("answer repeats the parent unchanged")
    for other_id, other in others.items():
        if instruction_key(text) == instruction_key(other):
            raise MalformedAnswer(f"answer repeats instruction {other_id}")
    return text


def instruction_key(text: str) -> str:
    """What makes two instructions the same: their words, ignoring case and spacing."""
    return " ".join(text.split()).casefold()
