"""The kinds qd ships: ``program``, ``agent``, ``prompt``, ``team`` and ``text``."""

from __future__ import annotations

import ast
import json

from genomes.kind import PROMPTS, GenomeKind


def agent_problem(text: str) -> str | None:
    """Why ``text`` is not an agent: it must define ``forward(task, llm)`` at top level."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            params = node.args.posonlyargs + node.args.args
            if len(params) < 2 and node.args.vararg is None:
                return "forward must take (task, llm)"
            return None
    return "no top-level function forward(task, llm)"


def team_problem(text: str) -> str | None:
    """Why ``text`` is not a team: a JSON object (``json``, never executed)."""
    try:
        value = json.loads(text)
    except ValueError as err:
        return f"team is not JSON: {err}"
    return None if isinstance(value, dict) else "team must be a JSON object"


PROGRAM = GenomeKind("program", "program", "python", code=True)
AGENT = GenomeKind(
    "agent",
    "agent",
    "python",
    code=True,
    templates={"system": str(PROMPTS / "agent_system.txt")},
    validate=agent_problem,
)
PROMPT = GenomeKind(
    "prompt",
    "prompt",
    "text",
    templates={"system": str(PROMPTS / "prompt_system.txt")},
    bare=True,
    max_chars=1_000,
)
TEAM = GenomeKind(
    "team",
    "team",
    "json",
    templates={"system": str(PROMPTS / "team_system.txt")},
    validate=team_problem,
    max_chars=8_000,
)
TEXT = GenomeKind("text", "text", "text", templates={"system": str(PROMPTS / "text_system.txt")}, bare=True)

BUILTIN = (PROGRAM, AGENT, PROMPT, TEAM, TEXT)
