"""Seeded, exactly-checkable reasoning problems for the agent_design, agent_team and prompt_evolution
experiments.

Two families, each with several surface templates; the ``held_out`` split uses
templates the ``search`` split never shows (other stories and operation orders
for arithmetic, other statement forms for knights), so a design that memorises
the generator's phrasing does not carry over:

- ``arithmetic``: 2-3 step word problems on small integers; the answer is an
  integer that never appears among the question's numbers.
- ``knights``: Knights-and-Knaves puzzles with 2 or 3 islanders, one statement
  each, kept only when exactly one assignment of roles is consistent.

Standard library only, so any process can import it cheaply. The problems are
generated and checked on the host: a sandboxed entry sees the questions only.
Nothing is downloaded; everything is generated from the seed.

    problems("search", 20, seed=0)       # 10 arithmetic + 10 knights, interleaved
    check(p, "The answer is 17.")        # exact after normalisation, never raises
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import re

__all__ = ["Problem", "TEMPLATES", "FAMILIES", "SPLITS", "problems", "check", "extract"]

FAMILIES = ("arithmetic", "knights")
SPLITS = ("search", "held_out")
_PREFIX = {"arithmetic": "arith", "knights": "knights"}
_SPLIT_CODE = {"search": "s", "held_out": "h"}


@dataclasses.dataclass(frozen=True)
class Problem:
    id: str  # stable per (split, seed, position): "arith-s-0007" (seed 0), "arith-s-0007-r3" (seed 3)
    family: str  # "arithmetic" | "knights"
    split: str  # "search" | "held_out"
    template: str  # template name, one of TEMPLATES[family][split]
    question: str  # what the solver sees (never the answer)
    answer: str  # canonical answer: "17" or "A: knight, B: knave"


# --------------------------------------------------------------------------- arithmetic

_PEOPLE = [
    ("Mia", "she"),
    ("Tom", "he"),
    ("Ana", "she"),
    ("Leo", "he"),
    ("Zoe", "she"),
    ("Sam", "he"),
    ("Ivy", "she"),
    ("Max", "he"),
]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "shells", "cards", "beads"]


def _name(rng: random.Random) -> tuple[str, str, str]:
    name, pron = rng.choice(_PEOPLE)
    return name, pron, pron.capitalize()


def _arith_buy_groups(rng):  # a + b*c - d
    name, pron, Pron = _name(rng)
    item = rng.choice(_ITEMS)
    a, b, c = rng.randint(3, 20), rng.randint(2, 5), rng.randint(2, 6)
    d = rng.randint(1, a + b * c - 1)
    return (
        f"{name} has {a} {item}. {Pron} buys {b} bags of {c} {item} each, then gives away {d}. "
        f"How many {item} does {pron} have now?"
    ), a + b * c - d


def _arith_shelves(rng):  # a*b - c + d
    a, b = rng.randint(2, 6), rng.randint(4, 12)
    c, d = rng.randint(1, a * b - 1), rng.randint(1, 15)
    place = rng.choice(["library", "classroom", "shop", "school"])
    return (
        f"A {place} has {a} shelves with {b} books on each shelf. Then readers borrow {c} books "
        f"and {d} new books arrive. How many books are on the shelves now?"
    ), a * b - c + d


def _arith_savings(rng):  # a*b - c
    name, pron, Pron = _name(rng)
    a, b = rng.randint(2, 12), rng.randint(2, 8)
    c = rng.randint(2, a * b - 1)
    thing = rng.choice(["game", "book", "ball", "kite", "puzzle"])
    return (
        f"{name} saves {a} dollars a week for {b} weeks, then spends {c} dollars on a {thing}. "
        f"How many dollars does {pron} have left?"
    ), a * b - c


def _arith_sharing(rng):  # a*b / c
    name, pron, Pron = _name(rng)
    item = rng.choice(_ITEMS)
    c = rng.randint(2, 6)
    a, b = rng.randint(2, 8), rng.randint(2, 10)
    while (a * b) % c:
        a, b = rng.randint(2, 8), rng.randint(2, 10)
    return (
        f"{name} buys {a} packs of {b} {item} and shares them equally among {c} friends. "
        f"How many {item} does each friend get?"
    ), a * b // c


def _arith_bus(rng):  # (a - b + c) * 2
    a = rng.randint(5, 25)
    b, c = rng.randint(1, a - 1), rng.randint(1, 12)
    vehicle = rng.choice(["bus", "train", "tram", "boat"])
    return (
        (
            f"A {vehicle} leaves with {a} passengers. At the first stop, {b} people get off and {c} get on. "
            f"At the second stop, the number of passengers doubles. How many passengers are there now?"
        ),
        (a - b + c) * 2,
    )


def _arith_baking(rng):  # a * (b + c)
    name, pron, Pron = _name(rng)
    a, b, c = rng.randint(2, 6), rng.randint(2, 7), rng.randint(2, 7)
    food, foods, unit = rng.choice(
        [
            ("cake", "cakes", "eggs"),
            ("pie", "pies", "apples"),
            ("loaf", "loaves", "cups of flour"),
            ("pizza", "pizzas", "tomatoes"),
        ]
    )
    return (
        f"One {food} needs {a} {unit}. "
        f"{name} makes {b} {foods} in the morning and {c} more in the afternoon. "
        f"How many {unit} does {pron} use in total?"
    ), a * (b + c)


def _arith_change(rng):  # a - b*c
    name, pron, Pron = _name(rng)
    b, c = rng.randint(2, 6), rng.randint(2, 9)
    a = rng.choice([x for x in (10, 20, 50, 100) if x > b * c])
    item = rng.choice(["pens", "notebooks", "tickets", "sandwiches", "flowers"])
    return (
        f"{name} buys {b} {item} that cost {c} dollars each and pays with a {a}-dollar bill. "
        f"How many dollars of change does {pron} get?"
    ), a - b * c


_ARITH = {
    "search": {
        "buy_groups": _arith_buy_groups,
        "shelves": _arith_shelves,
        "savings": _arith_savings,
        "sharing": _arith_sharing,
    },
    "held_out": {"bus": _arith_bus, "baking": _arith_baking, "change": _arith_change},
}


# --------------------------------------------------------------------------- knights
# A statement kind maps (speaker, other islander, all names) to its variants: (text, truth(v) -> bool),
# where v maps a name to True (knight) or False (knave). The puzzle space is small, so it is enumerated.


def _st_claim(s, x, names):
    return [(f"{x} is a {r}.", lambda v, r=r: v[x] == (r == "knight")) for r in ("knight", "knave")]


def _st_both(s, x, names):
    return [
        (f"{x} and I are both {r}s.", lambda v, w=(r == "knight"): v[x] == w and v[s] == w)
        for r in ("knight", "knave")
    ]


def _st_exactly_one(s, x, names):
    us = "us" if len(names) == 2 else "us three"
    return [(f"Exactly one of {us} is a knight.", lambda v: sum(v.values()) == 1)]


def _st_iff(s, x, names):
    return [(f"{x} is a knight if and only if I am a knave.", lambda v: v[x] == (not v[s]))]


def _st_same_kind(s, x, names):
    return [(f"{x} and I are the same kind.", lambda v: v[x] == v[s])]


def _st_at_least_one(s, x, names):
    return [(f"At least one of {x} and I is a knave.", lambda v: not v[x] or not v[s])]


def _st_if_then(s, x, names):
    return [(f"If {x} is a knight, then so am I.", lambda v: (not v[x]) or v[s])]


_KNIGHTS = {
    "search": {"claim": _st_claim, "both": _st_both, "exactly_one": _st_exactly_one},
    "held_out": {
        "iff": _st_iff,
        "same_kind": _st_same_kind,
        "at_least_one": _st_at_least_one,
        "if_then": _st_if_then,
    },
}

_KNIGHTS_INTRO = "Knights always tell the truth and knaves always lie. "


def _solutions(names, statements) -> list[dict[str, bool]]:
    """Every assignment under which each speaker's statement is true exactly when the speaker is a knight."""
    found = []
    for roles in itertools.product((True, False), repeat=len(names)):
        v = dict(zip(names, roles))
        if all(v[s] == truth(v) for s, truth in statements):
            found.append(v)
    return found


def _format_roles(v: dict[str, bool]) -> str:
    return ", ".join(f"{n}: {'knight' if v[n] else 'knave'}" for n in sorted(v))


@functools.lru_cache(maxsize=None)
def _knights_space(split: str, size: int) -> dict[str, dict[str, list[str]]]:
    """template -> answer -> sorted questions: every puzzle of ``size`` islanders, statement kinds from
    ``split``, with exactly one consistent assignment, filed under each statement kind it uses."""
    names = ["A", "B", "C"][:size]
    options = []  # per speaker: (kind, text, truth)
    for s in names:
        seen, opts = set(), []
        for kind, make in _KNIGHTS[split].items():
            for x in (n for n in names if n != s):
                for text, truth in make(s, x, names):
                    if text not in seen:
                        seen.add(text)
                        opts.append((kind, text, truth))
        options.append(opts)
    space: dict[str, dict[str, set[str]]] = {t: {} for t in _KNIGHTS[split]}
    for combo in itertools.product(*options):
        sols = _solutions(names, [(s, truth) for s, (_, _, truth) in zip(names, combo)])
        if len(sols) != 1:
            continue
        said = " ".join(f'{s} says: "{text}"' for s, (_, text, _) in zip(names, combo))
        form = ", ".join(f"{n}: knight/knave" for n in names)
        question = f"{_KNIGHTS_INTRO}{said} Who is a knight and who is a knave? Answer like: {form}"
        for kind in {kind for kind, _, _ in combo}:
            space[kind].setdefault(_format_roles(sols[0]), set()).add(question)
    return {t: {a: sorted(qs) for a, qs in sorted(by.items())} for t, by in space.items()}


def _knights_puzzle(rng: random.Random, split: str, template: str) -> tuple[str, str]:
    """A unique-solution puzzle using statement kind ``template``; answers drawn uniformly, then the
    puzzle."""
    by_answer = _knights_space(split, rng.choice((2, 3)))[template]
    answer = rng.choice(sorted(by_answer))
    return rng.choice(by_answer[answer]), answer


TEMPLATES: dict[str, dict[str, list[str]]] = {
    "arithmetic": {split: list(gens) for split, gens in _ARITH.items()},
    "knights": {split: list(kinds) for split, kinds in _KNIGHTS.items()},
}


# --------------------------------------------------------------------------- generation


def _numbers_in(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def _generate(family: str, split: str, rng: random.Random, k: int) -> tuple[str, str, str]:
    names = TEMPLATES[family][split]
    template = names[
        k % len(names)
    ]  # cycle templates so every one appears in any list of len(names)+ problems
    for _ in range(1_000):
        if family == "arithmetic":
            question, value = _ARITH[split][template](rng)
            if value <= 0 or str(value) in _numbers_in(question):
                continue  # the answer must not be readable off the question
            return template, question, str(value)
        question, answer = _knights_puzzle(rng, split, template)
        return template, question, answer
    raise RuntimeError(f"could not generate a {family}/{template} problem")  # pragma: no cover


def _family_stream(family: str, split: str, seed: int, count: int) -> list[Problem]:
    rng = random.Random(f"qd-reasoning|{family}|{split}|{seed}")
    out, seen = [], set()
    for k in range(count):
        for _ in range(20):  # avoid repeats while the space allows it (2-islander puzzles are few)
            template, question, answer = _generate(family, split, rng, k)
            if question not in seen:
                break
        seen.add(question)
        suffix = "" if seed == 0 else f"-r{seed}"
        pid = f"{_PREFIX[family]}-{_SPLIT_CODE[split]}-{k:04d}{suffix}"
        out.append(Problem(pid, family, split, template, question, answer))
    return out


def problems(split: str, n: int, seed: int = 0, families=("arithmetic", "knights")) -> list[Problem]:
    """``n`` problems of ``split``, families interleaved (round robin), deterministic in ``seed``.

    Each family is its own seeded stream, so ``problems(split, n)`` is a prefix of
    ``problems(split, n + 1)``. Raises ValueError naming the bad argument.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if isinstance(families, str):
        families = (families,)
    families = tuple(families)
    if not families or any(f not in FAMILIES for f in families) or len(set(families)) != len(families):
        raise ValueError(f"families must be distinct names from {FAMILIES}, got {families!r}")
    counts = [len(range(i, n, len(families))) for i in range(len(families))]
    streams = [_family_stream(f, split, seed, c) for f, c in zip(families, counts)]
    return [streams[i % len(families)][i // len(families)] for i in range(n)]


# --------------------------------------------------------------------------- checking

_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ROLE = r"((?i:knight|knave))s?\b(?!\s*(?:/|or\s+kn))"
_SINGLE = re.compile(
    r"\b([A-Z])\b\s*(?:[:=\-]|\b(?:is|was|must be|would be|is actually)\b)\s*"
    r"(?:(?i:an?|the)\s+)?" + _ROLE
)
_LOWER = re.compile(r"\b([a-z])\s*[:=]\s*" + _ROLE)  # "a: knight" (an article is never followed by ':')
_PAIR = re.compile(
    r"\b(?:(?i:both)\s+)?([A-Z])\s+(?i:and)\s+([A-Z])\s+(?i:are)\s+(?:(?i:both|all)\s+)?" + _ROLE
)


def _text(answer: object) -> str | None:
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, (int, float)):
        return repr(answer)
    if isinstance(answer, bytes):
        answer = answer.decode("utf-8", "replace")
    return answer[-20_000:] if isinstance(answer, str) else None


def _extract_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    raw = found[-1].replace(",", "")
    try:
        value = float(raw) if "." in raw else int(raw)
    except ValueError:  # pragma: no cover - the regex only matches numbers
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return raw
        value = int(value)
    return str(value)


def _extract_roles(text: str, names: list[str]) -> str | None:
    mentions = []  # (position, name, is_knight); the last mention of each name wins (models ramble first)
    for m in _SINGLE.finditer(text):
        mentions.append((m.start(), m.group(1), m.group(2).lower() == "knight"))
    for m in _LOWER.finditer(text):
        mentions.append((m.start(), m.group(1).upper(), m.group(2).lower() == "knight"))
    for m in _PAIR.finditer(text):
        for name in (m.group(1), m.group(2)):
            mentions.append((m.start(), name, m.group(3).lower() == "knight"))
    roles: dict[str, bool] = {}
    for _, name, knight in sorted(mentions, key=lambda t: t[0]):
        roles[name] = knight
    if any(n not in roles for n in names):
        return None
    return _format_roles({n: roles[n] for n in names})


def extract(problem: Problem, answer: object) -> str | None:
    """The normalised answer that ``check`` compares with ``problem.answer``; None when unparseable."""
    try:
        text = _text(answer)
        if text is None:
            return None
        if problem.family == "arithmetic":
            return _extract_number(text)
        if problem.family == "knights":
            names = re.findall(r"\b([A-Z]):", problem.answer)
            return _extract_roles(text, names)
    except Exception:  # noqa: BLE001 - check/extract never raise on odd input
        return None
    return None


def check(problem: Problem, answer: object) -> bool:
    """Exact match after normalisation: arithmetic compares the last number in the text, knights every
    role."""
    try:
        got = extract(problem, answer)
        return got is not None and got == problem.answer
    except Exception:  # noqa: BLE001
        return False
