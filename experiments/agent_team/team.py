"""What a team genome is: its schema, read with ``json.loads`` (never executed), and what is measured on it.

A team is a JSON object::

    {"merge": "sequential",
     "roles": [{"name": "expert", "instructions": "Think step by step ...", "model": null}]}

- ``merge``: how the roles' answers become the team's: ``sequential`` (each role
  sees the question and the previous role's answer and refines it; the last
  answer counts) or ``vote`` (each role answers alone; the majority of the
  extracted answers wins, ties go to the earlier role).
- ``roles``: 1 to 4 roles, each with a unique ``name``, non-empty ``instructions``
  (its system message) and ``model``: null (the run's choice) or one of the run's
  model names.

``parse`` turns a malformed team into a ``TeamError`` whose one-line message names
the field and the fix: the candidate is then invalid, before any model call.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

MERGES = ("sequential", "vote")
MAX_ROLES = 4
MAX_NAME = 40
MAX_INSTRUCTIONS = 600  # a role's system message: the solver is a 2,048-token model
CHECK_TOKENS = 4  # the duplicate check reads only a yes or a no
_FIELDS = {"merge", "roles"}
_ROLE_FIELDS = {"name", "instructions", "model"}


class TeamError(ValueError):
    """A malformed team: ``field`` is where, the message says what and how to fix it."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"team: {field}: {problem} ({fix})")


@dataclasses.dataclass(frozen=True)
class Role:
    name: str
    instructions: str
    model: str | None = None


@dataclasses.dataclass(frozen=True)
class Team:
    merge: str
    roles: tuple[Role, ...]


def _string(value: object, field: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TeamError(field, f"got {json.dumps(value)[:40]}", "give a non-empty string")
    if len(value) > limit:
        raise TeamError(field, f"{len(value)} characters", f"at most {limit}")
    return value.strip()


def _role(value: object, i: int, models: tuple[str, ...]) -> Role:
    where = f"roles[{i}]"
    if not isinstance(value, dict):
        raise TeamError(
            where, f"got {type(value).__name__}", 'write {"name": ..., "instructions": ..., "model": null}'
        )
    unknown = sorted(set(value) - _ROLE_FIELDS)
    if unknown:
        raise TeamError(f"{where}.{unknown[0]}", "unknown field", "use name, instructions and model")
    name = _string(value.get("name"), f"{where}.name", MAX_NAME)
    instructions = _string(value.get("instructions"), f"{where}.instructions", MAX_INSTRUCTIONS)
    model = value.get("model")
    if model is not None and model not in models:
        raise TeamError(
            f"{where}.model",
            f"{json.dumps(model)[:60]} is not one of the run's models",
            f"use null or one of {list(models)}",
        )
    return Role(name, instructions, model)


def parse(text: str, models: tuple[str, ...] = ()) -> Team:
    """The team in ``text`` (a JSON object), checked; ``models``: the run's model names.

    Raises:
        TeamError: not JSON, not an object, an unknown or missing field, a wrong type,
            an unknown merge, no roles or more than ``MAX_ROLES``, a name used twice,
            a model the run does not have.
    """
    try:
        value = json.loads(text)
    except ValueError as err:
        raise TeamError("(whole)", f"not JSON: {err}", "answer with one JSON object") from None
    if not isinstance(value, dict):
        raise TeamError(
            "(whole)", f"a JSON {type(value).__name__}", 'write an object {"merge": ..., "roles": [...]}'
        )
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise TeamError(unknown[0], "unknown field", "use merge and roles")
    merge = value.get("merge")
    if merge not in MERGES:
        raise TeamError("merge", f"{json.dumps(merge)[:40]} is not a merge", f"use one of {list(MERGES)}")
    roles = value.get("roles")
    if not isinstance(roles, list) or not 1 <= len(roles) <= MAX_ROLES:
        got = f"{len(roles)} roles" if isinstance(roles, list) else f"got {type(roles).__name__}"
        raise TeamError("roles", got, f"give a list of 1 to {MAX_ROLES} roles")
    parsed = tuple(_role(r, i, tuple(models)) for i, r in enumerate(roles))
    names = [r.name.lower() for r in parsed]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise TeamError(
                f"roles[{i}].name", f"{parsed[i].name!r} is used twice", "give each role its own name"
            )
    return Team(merge, parsed)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def normalised(role: Role) -> str:
    """A role's instructions as compared for exact duplicates: lower-case words only."""
    return " ".join(words(role.instructions))


def diversity(team: Team) -> float:
    """Mean pairwise 1 - Jaccard similarity of the roles' instruction word sets (0 for one role)."""
    sets = [set(words(r.instructions)) for r in team.roles]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return 0.0
    return sum(1.0 - len(a & b) / max(len(a | b), 1) for a, b in pairs) / len(pairs)


def duplicate_prompt(first: Role, second: Role) -> str:
    """The question the duplicate-role check asks the model about two roles (one call, yes or no)."""
    return (
        f"Role 1 ({first.name}): {first.instructions}\n"
        f"Role 2 ({second.name}): {second.instructions}\n\n"
        "Do these two roles do the same job? Answer yes or no."
    )


def says_yes(answer: str) -> bool:
    """The model's verdict: its first yes or no; anything else is not a yes (the role is kept)."""
    found = re.search(r"\b(yes|no)\b", answer.lower())
    return found is not None and found.group(1) == "yes"
