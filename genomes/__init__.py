"""Genome kinds: what a text genome is to the operators, and the registry of kinds.

A task names its kind (``task.genome = "agent"``; ``program`` when it names none)
or carries a :class:`GenomeKind` itself. ``register`` adds a kind from anywhere
(an experiment, a test, a user's package) without touching the engine::

    from genomes import GenomeKind, register
    register(GenomeKind("haiku", "haiku", "text", bare=True, validate=three_lines))
"""

from __future__ import annotations

from typing import Any

from genomes.builtin import BUILTIN
from genomes.kind import GenomeKind
from qd.contract import ConfigError

_KINDS: dict[str, GenomeKind] = {k.name: k for k in BUILTIN}
DEFAULT = "program"


def register(kind: GenomeKind) -> GenomeKind:
    """Adds ``kind`` (a name registered twice must be the same kind); returns it."""
    if not isinstance(kind, GenomeKind):
        raise TypeError(f"register: expected a GenomeKind, got {type(kind).__name__}")
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"genome kind {kind.name!r} is already registered as another kind")
    _KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    return sorted(_KINDS)


def get(name: str) -> GenomeKind:
    """The registered kind ``name``; ConfigError naming the known ones otherwise."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError(
            "experiment.genome",
            f"unknown genome kind {name!r}",
            f"use one of {names()} or register it with genomes.register",
        ) from None


def of_task(task: Any) -> GenomeKind:
    """A text task's genome kind: its ``genome`` attribute (a name or a GenomeKind), else ``program``."""
    genome = getattr(task, "genome", DEFAULT)
    return register(genome) if isinstance(genome, GenomeKind) else get(genome)


__all__ = ["DEFAULT", "GenomeKind", "get", "names", "of_task", "register"]
