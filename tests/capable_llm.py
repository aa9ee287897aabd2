"""A scripted *capable* model for the agent experiments' pipeline tests (never a result).

SmolLM2-135M almost never writes a usable agent or team, so the paths a real success takes
(a valid design scoring high and entering the archive, the duplicate-role check rejecting a
team, a committee outvoting its best member) would never run in a test. ``reply`` answers as
a capable model would, from the small shipped sets under ``tests/data/capable/``:

- an operator's prompt for an agent (agent_design: its system message says "You design LLM
  agents"): one of the shipped agents, ``agents/*.py``, in a python code block;
- an operator's prompt for a team (agent_team: "You design teams of LLM agents"): one of the
  shipped teams of ``teams.json``, one of which has two roles doing the same job; either way
  one the prompt does not already show (the parent), while the set has one;
- the duplicate-role check ("Do these two roles do the same job?"): yes exactly when the two
  roles' instructions are shipped ones of the same job (``teams.json``'s ``job``);
- a committee judge (``qd.committee.judge_prompt``): the number of a correct candidate;
- anything holding a generated problem (an agent's or a role's call): its right answer
  ``RIGHT_PERCENT`` % of the time, a wrong one otherwise; asked for an arithmetic expression
  (``Expression:``, as the hand-designed ``python_compute`` asks), one over the question's
  numbers that the agent then computes.

Every choice is a hash of the request's messages and sample seed: the same request gets the
same answer (caches and reruns agree), different agents' prompts err on different problems.
Use it as ``Rule("", capable_llm.reply)``; it is a module-level function, so it also serves
from a separate process (``ScriptedLLM.start(in_process=True)``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
from pathlib import Path

from qd.reasoning import problems

DATA = Path(__file__).resolve().parent / "data" / "capable"
AGENTS = {path.stem: path.read_text() for path in sorted((DATA / "agents").glob("*.py"))}
_TEAMS = json.loads((DATA / "teams.json").read_text())
JOBS = {role["instructions"]: role["job"] for role in _TEAMS["roles"].values()}
RIGHT_PERCENT = 80
_KNOWN = 48  # generated problems of each split it knows (problem_seed 0, the experiments' default)
PROBLEMS = [p for split in problems.SPLITS for p in problems.problems(split, _KNOWN)]
_ROLES = re.compile(r"Role 1 \(.*?\): (.*)\nRole 2 \(.*?\): (.*)\n")
_CANDIDATE = re.compile(r"^(\d+)\. (.*)$", re.M)


def team_text(team: dict) -> str:
    """A shipped team (its roles by key) as the team genome's JSON (``experiments/agent_team/team.py``)."""
    roles = [
        {"name": r["name"], "instructions": r["instructions"], "model": None}
        for r in (_TEAMS["roles"][key] for key in team["roles"])
    ]
    return json.dumps({"merge": team["merge"], "roles": roles}, indent=1)


TEAMS = [team_text(team) for team in _TEAMS["teams"]]


def repeats_a_job(team: dict) -> bool:
    """Whether two of a shipped team's roles do the same job (the duplicate-role check must say yes)."""
    jobs = [_TEAMS["roles"][key]["job"] for key in team["roles"]]
    return len(set(jobs)) < len(jobs)


DUPLICATED = [text for text, team in zip(TEAMS, _TEAMS["teams"]) if repeats_a_job(team)]


def draw(request: dict) -> int:
    """A number fixed by the request's messages and sample seed."""
    key = json.dumps([request.get("messages"), request.get("seed")], sort_keys=True)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def fresh(designs: list[str], shown: str, n: int) -> str:
    """A design the prompt does not show already (its parent's, say), drawn by ``n``; any when it shows
    them all: a capable designer does not hand the parent back unchanged."""
    new = [d for d in designs if d.strip() not in shown] or designs
    return new[n % len(new)]


def wrong(problem: problems.Problem, n: int) -> str:
    """A wrong answer: another number, or every islander's role flipped."""
    if problem.family == "arithmetic":
        return str(int(problem.answer) + 1 + n % 3)
    return problem.answer.replace("knight", "?").replace("knave", "knight").replace("?", "knave")


def solve(request: dict, problem: problems.Problem) -> str:
    """A worked answer, right ``RIGHT_PERCENT`` % of the time (by the request's draw)."""
    n = draw(request)
    answer = problem.answer if n % 100 < RIGHT_PERCENT else wrong(problem, n)
    return f"Working through it step by step.\nAnswer: {answer}"


@functools.cache
def expression(question: str, value: str) -> str | None:
    """An arithmetic expression over the question's numbers, each once, worth ``value`` (Python's
    precedence, or left to right), as a model that can compute writes one; None when there is none."""
    numbers = re.findall(r"\d+", question)
    for order in itertools.permutations(numbers):
        for ops in itertools.product("+-*/", repeat=len(order) - 1):
            flat = order[0] + "".join(f" {op} {n}" for op, n in zip(ops, order[1:]))
            nested = "(" * len(ops) + order[0] + "".join(f" {op} {n})" for op, n in zip(ops, order[1:]))
            for text in (flat, nested):
                try:
                    if eval(text) == int(value):  # digits and + - * / only
                        return text
                except ZeroDivisionError:
                    continue
    return None


def computed(request: dict, problem: problems.Problem) -> str:
    """An agent's request for an expression to compute: by the draw, a right one (the worked answer
    when the question's numbers make none, e.g. "twice"), or a wrong one: the numbers' sum."""
    n = draw(request)
    if n % 100 >= RIGHT_PERCENT:
        return " + ".join(re.findall(r"\d+", problem.question))
    return expression(problem.question, problem.answer) or solve(request, problem)


def same_job(prompt: str) -> str:
    found = _ROLES.search(prompt)
    jobs = [JOBS.get(text.strip()) for text in found.groups()] if found else [None, None]
    return "Yes." if jobs[0] is not None and jobs[0] == jobs[1] else "No."


def judged(prompt: str, problem: problems.Problem) -> str:
    """The number of a candidate that is the right answer (the first, when none is)."""
    right = [n for n, text in _CANDIDATE.findall(prompt) if text.strip() == problem.answer]
    return right[0] if right else "1"


def reply(request: dict) -> str:
    """The capable model's answer to one chat request (see the module doc)."""
    messages = request.get("messages") or []
    everything = "\n".join(str(m.get("content", "")) for m in messages)
    prompt = str(messages[-1].get("content", "")) if messages else ""
    if "You design teams of LLM agents" in everything:
        return f"```json\n{fresh(TEAMS, everything, draw(request))}\n```"
    if "You design LLM agents" in everything:
        return f"```python\n{fresh(list(AGENTS.values()), everything, draw(request))}```"
    if "Do these two roles do the same job?" in prompt:
        return same_job(prompt)
    problem = next((p for p in PROBLEMS if p.question in prompt), None)
    if problem is None:
        return "I cannot tell from this."
    if prompt.startswith("Question:") and "Candidate answers:" in prompt:
        return judged(prompt, problem)
    if prompt.rstrip().endswith("Expression:") and problem.family == "arithmetic":
        return computed(request, problem)
    return solve(request, problem)
