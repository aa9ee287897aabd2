"""The reasoning problems (``qd.reasoning.problems``): generated offline, checked exactly, no model needed."""

import ast
import itertools
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qd.reasoning import problems as P

SPLITS = ("search", "held_out")


# --------------------------------------------------------------------------- independent knights solver

STATEMENTS = [  # every statement form, evaluated independently of problems.py
    (r"([A-Z]) is a (knight|knave)\.", lambda v, s, m: v[m[1]] == (m[2] == "knight")),
    (r"([A-Z]) and I are both (knight|knave)s\.", lambda v, s, m: v[m[1]] == v[s] == (m[2] == "knight")),
    (r"Exactly one of us(?: three)? is a knight\.", lambda v, s, m: sum(v.values()) == 1),
    (r"([A-Z]) is a knight if and only if I am a knave\.", lambda v, s, m: v[m[1]] != v[s]),
    (r"([A-Z]) and I are the same kind\.", lambda v, s, m: v[m[1]] == v[s]),
    (r"At least one of ([A-Z]) and I is a knave\.", lambda v, s, m: not (v[m[1]] and v[s])),
    (r"If ([A-Z]) is a knight, then so am I\.", lambda v, s, m: v[s] or not v[m[1]]),
]
SEARCH_FORMS, HELD_OUT_FORMS = STATEMENTS[:3], STATEMENTS[3:]


def brute_force(question):
    said = re.findall(r'\b([A-Z]) says: "([^"]*)"', question)
    rules = []
    for speaker, text in said:
        [(m, truth)] = [(m, t) for p, t in STATEMENTS if (m := re.fullmatch(p, text))]
        rules.append((speaker, truth, m))
    names = sorted(s for s, _ in said)
    return [
        v
        for roles in itertools.product([True, False], repeat=len(names))
        for v in [dict(zip(names, roles))]
        if all(v[s] == t(v, s, m) for s, t, m in rules)
    ]


def roles_of(answer):
    return dict(re.findall(r"([A-Z]): (knight|knave)", answer))


# --------------------------------------------------------------------------- problems


def test_templates_are_disjoint_between_splits_and_cover_the_families():
    assert set(P.TEMPLATES) == {"arithmetic", "knights"}
    for family, by_split in P.TEMPLATES.items():
        assert set(by_split) == set(SPLITS)
        assert not set(by_split["search"]) & set(by_split["held_out"])
    assert sum(map(len, P.TEMPLATES["arithmetic"].values())) >= 6
    assert sum(map(len, P.TEMPLATES["knights"].values())) >= 4


@pytest.mark.parametrize("split", SPLITS)
def test_problems_are_deterministic_interleaved_and_prefix_stable(split):
    ps = P.problems(split, 40, seed=3)
    assert ps == P.problems(split, 40, seed=3)
    assert ps[:17] == P.problems(split, 17, seed=3)
    assert ps != P.problems(split, 40, seed=4)
    assert [p.family for p in ps] == ["arithmetic", "knights"] * 20
    assert len({p.id for p in ps}) == 40 and all(p.split == split for p in ps)
    assert P.problems(split, 2)[0].id == f"arith-{split[0]}-0000"
    for family in ("arithmetic", "knights"):
        used = {p.template for p in ps if p.family == family}
        assert used == set(P.TEMPLATES[family][split])  # every template appears, no other split's
    only = P.problems(split, 5, families=("knights",))
    assert [p.family for p in only] == ["knights"] * 5 and P.problems(split, 0) == []


def test_held_out_phrasing_never_appears_in_search_and_vice_versa():
    search = " ".join(p.question for p in P.problems("search", 300))
    held = " ".join(p.question for p in P.problems("held_out", 300))
    for marker in (
        "if and only if",
        "same kind",
        "At least one of",
        "then so am I",
        "passengers",
        "change",
        "in the morning",
    ):
        assert marker not in search and marker in held
    for marker in ("are both", "Exactly one of", "shelves", "saves", "shares them", "bags of"):
        assert marker in search and marker not in held


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), split=st.sampled_from(SPLITS))
def test_knights_puzzles_have_exactly_one_solution_which_is_the_answer(seed, split):
    forms = SEARCH_FORMS if split == "search" else HELD_OUT_FORMS
    for p in P.problems(split, 12, seed=seed, families=("knights",)):
        said = re.findall(r'says: "([^"]*)"', p.question)
        assert len(said) in (2, 3) and all(any(re.fullmatch(f, s) for f, _ in forms) for s in said)
        [solution] = brute_force(p.question)
        assert ", ".join(f"{n}: {'knight' if solution[n] else 'knave'}" for n in sorted(solution)) == p.answer
        assert (
            p.answer not in p.question and "knaves always lie" in p.question and "Answer like" in p.question
        )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), split=st.sampled_from(SPLITS))
def test_questions_are_short_and_never_show_the_answer(seed, split):
    for p in P.problems(split, 16, seed=seed):
        assert len(p.question) < 350
        if p.family == "arithmetic":
            assert re.fullmatch(r"[1-9]\d*", p.answer)
            assert p.answer not in re.findall(r"\d+", p.question)
        else:
            assert p.answer not in p.question
        assert P.check(p, p.answer) and P.extract(p, p.answer) == p.answer


def test_bad_arguments_raise_value_errors_naming_the_field():
    for kwargs, field in [
        ({"split": "train", "n": 3}, "split"),
        ({"split": "search", "n": -1}, "n"),
        ({"split": "search", "n": 2.5}, "n"),
        ({"split": "search", "n": True}, "n"),
        ({"split": "search", "n": 3, "families": ("algebra",)}, "families"),
        ({"split": "search", "n": 3, "families": ()}, "families"),
        ({"split": "search", "n": 3, "seed": "x"}, "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            P.problems(**kwargs)


def test_check_accepts_paraphrased_arithmetic_answers_and_rejects_wrong_ones():
    p = P.problems("search", 1)[0]
    a = int(p.answer)
    for good in (
        a,
        float(a),
        f"{a}",
        f"{a}.",
        f"{a}.0",
        f"The answer is {a}",
        f"Answer: {a} apples.",
        f"First 3 + 4 = 7, so the answer is {a}.",
        f"**{a}**",
    ):
        assert P.check(p, good), good
    for bad in (a + 1, f"{a}.5", f"{a} or maybe {a + 1}", "", "no idea", None, True, [a], object(), b"\xff"):
        assert not P.check(p, bad), bad
    assert P.extract(p, f"so {a + 1}, no wait, 1,0{a:02d}") == f"10{a:02d}"


def test_check_parses_knights_roles_from_free_text():
    p = next(q for q in P.problems("search", 20, families=("knights",)) if len(roles_of(q.answer)) == 2)
    (x, rx), (y, ry) = sorted(roles_of(p.answer).items())
    flip = {"knight": "knave", "knave": "knight"}
    for good in (
        f"{x}: {rx}, {y}: {ry}",
        f"{x} is a {rx} and {y} is a {ry}.",
        f"{x}={rx} {y}={ry}",
        f"{y} is a {ry}; {x} must be a {rx}",
        f"{x.lower()}: {rx.capitalize()}, {y.lower()}: {ry}",
        f"Maybe {x} is a {flip[rx]}... no. Answer: {x}: {rx}, {y}: {ry}",
    ):
        assert P.check(p, good), good
    if rx == ry:
        assert P.check(p, f"{x} and {y} are both {rx}s")
    for bad in (
        f"{x}: {flip[rx]}, {y}: {ry}",
        f"{x}: {rx}",
        f"{x}: knight/knave, {y}: knight/knave",
        f"{x}: knight or knave, {y}: knight or knave",
        f"{x} is not a {flip[rx]}, {y} is a {ry}",
        "",
        None,
        3,
        ["A: knight"],
    ):
        assert not P.check(p, bad), bad


@settings(max_examples=60, deadline=None)
@given(
    junk=st.one_of(
        st.text(max_size=300),
        st.integers(),
        st.floats(),
        st.none(),
        st.binary(max_size=50),
        st.lists(st.text(max_size=5), max_size=3),
    )
)
def test_check_and_extract_never_raise(junk):
    for p in P.problems("held_out", 2) + P.problems("search", 2):
        assert P.check(p, junk) in (True, False)
        assert P.extract(p, junk) is None or isinstance(P.extract(p, junk), str)
    assert P.check(object(), "17") is False and P.extract(None, "17") is None


def test_problems_module_uses_only_the_standard_library():
    tree = ast.parse(Path(P.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
