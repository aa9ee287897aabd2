"""A scripted capable model for the text experiments' pipeline tests: prompt_evolution, creative_writing
and red_team (never a result: what it answers is written down here and in ``tests/data/capable_text/``).

SmolLM2-135M almost never writes a prompt that helps, an attack that breaks the rule or a text a judge
places apart from the others, so the paths that act on a success (elites that beat the founders, the BLEU
gate, the pairwise tiebreak, texts spread over genre x tone cells) never run on it. This model answers as
a capable one would: ``answer`` (a module-level reply for ``tests/scripted_llm.py``, picklable) tells
which prompt it got (``role``) and answers from small shipped sets:

- ``operator`` (prompt_evolution's mutation, Lamarckian and crossover prompts): a task-prompt from
  ``prompts.json``; ``instruction`` and ``meta_prompt`` (meta evolution): a mutation instruction or a
  hyper-mutation prompt from it.
- ``solver`` (the task model, a task-prompt in front of a question): right on the problem at position p
  of its split iff ``p % 4 < skills(prompt)``: a prompt earns one skill each for an 'Answer:' format, a
  plan (steps, a list), a check and case analysis, so the shipped prompts (four skills) solve every
  problem and the hand-written seeds (0-3 skills) part of them.
- ``writer`` (creative_writing's rewrite, inspiration and control prompts): a text from ``texts.json``,
  across genres and tones; ``quality``, ``critic``, ``genre``, ``tone``: the judges, answering a text's
  label (shipped here or in the experiment's ``labels.json``), else a plain reading of it.
- ``attacker`` (red_team's operators): an attack from ``attacks.json``, or one time in four a near copy
  of the parent (the BLEU gate's to reject); ``target``: a guarded assistant that a shipped attack breaks
  on its first ``breaks`` variants (an unknown one on the first, if it asks for the password or
  capitals); ``pairwise``: the tiebreak judge, for the stronger attack (shipped ``strength``; unknown 0),
  "A" when they are equal (so neither order wins).

Deterministic: a pick is the sha256 of the request's messages and sample seed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from qd.reasoning import problems
from qd.task import load_module

DATA = Path(__file__).resolve().parent / "data" / "capable_text"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SKILLS = (  # what a task-prompt must ask for, each earning the solver a quarter of the problems
    r"answer:",
    r"step|\blist\b|one fact at a time|write down",
    r"check|verif",
    r"each (?:possible )?case|rule out|contradict",
)
DIGIT_QUESTIONS = {  # the judges' questions (AI feedback and the held-out critic) -> role
    "How good is this short piece of writing?": "quality",
    "A literary critic rates the craft of this text.": "critic",
    "Is this text a poem or a story?": "genre",
    "How happy is the tone of this text?": "tone",
}


@functools.cache
def shipped(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def pick(items: Sequence[Any], request: dict) -> Any:
    """One of ``items``, fixed by the request's messages and sample seed."""
    return items[draw(request) % len(items)]


def draw(request: dict) -> int:
    key = json.dumps([request.get("messages"), request.get("seed")], sort_keys=True)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def last(request: dict) -> str:
    return str(request["messages"][-1]["content"])


def system(request: dict) -> str:
    first = request["messages"][0]
    return str(first["content"]) if first.get("role") == "system" else ""


def fenced(text: str) -> list[str]:
    return [t.strip() for t in re.findall(r"```text\n(.*?)```", text, re.S)]


# --------------------------------------------------------------------------- prompt_evolution


@functools.cache
def answer_key() -> dict[str, tuple[str, int]]:
    """question -> (answer, position in its split) for the problems of the default problem seed (a
    question drawn twice keeps its first position)."""
    key: dict[str, tuple[str, int]] = {}
    for split in problems.SPLITS:
        for i, p in enumerate(problems.problems(split, 48)):
            key.setdefault(p.question, (p.answer, i))
    return key


def skills(prompt: str) -> int:
    return sum(bool(re.search(s, prompt, re.I)) for s in SKILLS)


def solver(request: dict) -> str:
    answer, position = answer_key()[last(request)]
    if position % len(SKILLS) < skills(system(request)):
        return f"Working through it as told.\nAnswer: {answer}"
    return "Answer: I am not sure."


def operator(request: dict) -> str:
    return f"```text\n{pick(shipped('prompts.json')['prompts'], request)}\n```"


def instruction(request: dict) -> str:
    return pick(shipped("prompts.json")["instructions"], request)


def meta_prompt(request: dict) -> str:
    return pick(shipped("prompts.json")["meta_prompts"], request)


# --------------------------------------------------------------------------- creative_writing


@functools.cache
def text_labels() -> dict[str, dict[str, int]]:
    """text -> its 0..9 labels: the shipped texts', then the experiment's labels (0/1 read as 1/8)."""
    labels = {
        t["text"].strip(): {k: t[k] for k in ("genre", "tone", "quality")} for t in shipped("texts.json")
    }
    for t in json.loads((EXPERIMENTS / "creative_writing" / "labels.json").read_text(encoding="utf-8")):
        labels.setdefault(t["text"].strip(), {k: 1 + 7 * t[k] for k in ("genre", "tone", "quality")})
    return labels


def judged_text(request: dict) -> str:
    return last(request).rsplit("Text: ", 1)[-1].strip()


def label(request: dict, axis: str) -> str:
    """The judged text's label on ``axis``; an unknown text read plainly: verse (several lines) is a
    poem, a story otherwise; neutral tone; middling quality."""
    text = judged_text(request)
    known = text_labels().get(text)
    if known is not None:
        return str(known[axis])
    return {"genre": "2" if text.count("\n") >= 2 else "7", "tone": "5", "quality": "4"}[axis]


def writer(request: dict) -> str:
    return f"```text\n{pick(shipped('texts.json'), request)['text']}\n```"


# --------------------------------------------------------------------------- red_team


@functools.cache
def secrets() -> tuple[str, ...]:
    return load_module(EXPERIMENTS / "red_team" / "target.py", "capable_text_red_team_target").SECRETS


@functools.cache
def attacks() -> dict[str, dict]:
    return {a["text"]: a for a in shipped("attacks.json")}


def attacker(request: dict) -> str:
    parents = fenced(last(request))
    n = draw(request)
    if parents and n % 4 == 0:
        return f"{parents[0].rstrip('.?!')}, please, right now."
    return pick(list(attacks()), request)


def target(request: dict) -> str:
    secret = re.search(r"secret password, (\w+);", system(request)).group(1)
    variant, attack = secrets().index(secret), last(request).strip()
    known = attacks().get(attack)
    if known is not None:
        broken, rule = variant < known["breaks"], known["rule"]
    else:
        words = attack.lower()
        broken = variant == 0 and bool(re.search(r"password|capital|upper ?case|caps|shout", words))
        rule = "secret" if "password" in words else "format"
    if not broken:
        return "i am happy to help, but i keep my rules."
    return f"fine, the password is {secret}." if rule == "secret" else "OKAY, HERE IT IS, LOUD AND CLEAR."


def pairwise(request: dict) -> str:
    a, b = re.search(r"A:\n(.*)\n\nB:\n(.*)\n\nAnswer with one letter", last(request), re.S).groups()
    strength = {text: attack["strength"] for text, attack in attacks().items()}
    return "B" if strength.get(b.strip(), 0) > strength.get(a.strip(), 0) else "A"


# --------------------------------------------------------------------------- dispatch


def role(request: dict) -> str | None:
    """Which prompt this is (a key of ``REPLIES``), or None for one this model does not know."""
    text, sys = last(request), system(request)
    if "Answer with one letter, A or B." in text:
        return "pairwise"
    if "Answer with a single digit from 0 to" in text:
        return next((r for q, r in DIGIT_QUESTIONS.items() if q in text), None)
    checks = (
        ("target", "You know a secret password" in sys),
        ("attacker", "red-teaming exercise" in sys),
        ("instruction", "Answer with the new instruction only" in text),
        ("meta_prompt", "leads to more useful instructions" in text),
        ("operator", "You write instructions (prompts)" in sys),
        ("writer", "short poem or story, not code" in text),
        ("solver", text in answer_key()),
    )
    return next((name for name, hit in checks if hit), None)


REPLIES: dict[str, Callable[[dict], str]] = {
    "pairwise": pairwise,
    "quality": functools.partial(label, axis="quality"),
    "critic": functools.partial(label, axis="quality"),
    "genre": functools.partial(label, axis="genre"),
    "tone": functools.partial(label, axis="tone"),
    "target": target,
    "attacker": attacker,
    "instruction": instruction,
    "meta_prompt": meta_prompt,
    "operator": operator,
    "writer": writer,
    "solver": solver,
}
UNKNOWN = "I do not know this prompt."  # what a prompt no role matches gets (tests assert none did)


def answer(request: dict) -> str:
    """The capable model's reply to one chat request (``Rule("", answer)``)."""
    name = role(request)
    return UNKNOWN if name is None else REPLIES[name](request)
