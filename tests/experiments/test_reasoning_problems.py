"""Reasoning problems (agent_design/problems.py), the seed agents and the Promptbreeder material:
no model needed."""

import ast
import importlib.util
import itertools
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


PE = _load("experiments_prompt_evolution_seeds", EXPERIMENTS / "prompt_evolution" / "seeds.py")
P = PE.reasoning_problems  # loaded once, by file path (qd.task.load_module)
AGENTS = _load("experiments_agent_design_seeds", EXPERIMENTS / "agent_design" / "seeds.py")
SPLITS = ("search", "held_out")


def dead_llm(messages, **sampling):
    raise RuntimeError("budget spent")


class FakeLLM:
    """Canned replies (a str, or a function of the last user text); records every call's sampling."""

    def __init__(self, reply, fail_after=None):
        self.reply, self.fail_after, self.calls = reply, fail_after, []

    def __call__(self, messages, **sampling):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("budget spent")
        self.calls.append((messages, sampling))
        text = messages if isinstance(messages, str) else messages[-1]["content"]
        return self.reply(text) if callable(self.reply) else self.reply


def forward_of(name):
    namespace = {}
    exec(compile(dict(AGENTS.SEEDS)[name], f"<seed {name}>", "exec"), namespace)
    return namespace["forward"]


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
    tree = ast.parse((EXPERIMENTS / "agent_design" / "problems.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# --------------------------------------------------------------------------- seed agents


def test_seed_agents_are_short_standard_library_sources_with_a_docstring():
    names = [name for name, _ in AGENTS.SEEDS]
    assert names == [
        "direct",
        "chain_of_thought",
        "self_consistency",
        "self_refine",
        "debate",
        "python_compute",
    ]
    for name, code in AGENTS.SEEDS:
        tree = ast.parse(code)
        assert isinstance(ast.get_docstring(tree), str) and "\n" not in ast.get_docstring(tree)
        assert any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in tree.body)
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported <= {"re", "collections", "ast", "itertools", "operator", "math"}, name
        assert len(code.splitlines()) <= (90 if name == "python_compute" else 35), name
        assert "eval(" not in code.replace('mode="eval"', ""), name


REPLIES = [
    "Step 1: 7 + 12 = 19. Step 2: 19 - 5 = 14.\nAnswer: 14",
    "",
    "I am not sure.",
    "```python\n__import__('os')\n```",
    "Answer: A: knight, B: knave",
    "lorem " * 300,
    "Answer:",
    "7 + 3 * 4 - 5",
]


@pytest.mark.parametrize("name", [name for name, _ in AGENTS.SEEDS])
def test_each_seed_runs_on_a_fake_llm_and_survives_odd_replies_and_a_spent_budget(name):
    forward = forward_of(name)
    tasks = [p.question for p in P.problems("search", 2) + P.problems("held_out", 2)]
    for reply in REPLIES:
        for task in tasks:
            llm = FakeLLM(reply)
            assert isinstance(forward(task, llm), str)
            for messages, sampling in llm.calls:
                assert sampling.get("max_tokens", 0) <= 160
                text = messages if isinstance(messages, str) else " ".join(m["content"] for m in messages)
                assert len(text) < 3_000  # fits a 2,048-token model with room to answer
    for task in tasks:
        assert isinstance(forward(task, dead_llm), str)
        for k in range(4):  # budget spent part-way
            assert isinstance(forward(task, FakeLLM(REPLIES[0], fail_after=k)), str)


def test_seeds_keep_their_best_answer_when_the_budget_runs_out():
    task = P.problems("search", 1)[0].question
    good = FakeLLM("Let me think. 7 + 12 = 19, minus 5.\nAnswer: 14", fail_after=1)
    assert forward_of("self_consistency")(task, good) == "14"
    assert forward_of("self_refine")(task, FakeLLM("Answer: 14", fail_after=1)) == "14"
    assert forward_of("debate")(task, FakeLLM("Answer: 14", fail_after=1)) == "14"
    assert forward_of("chain_of_thought")(task, FakeLLM("so it is 14.\nAnswer: 14")) == "14"
    votes = iter(["Answer: 3", "Answer: 5", "Answer: 5"])
    assert forward_of("self_consistency")(task, FakeLLM(lambda _: next(votes))) == "5"
    judged = iter(["Answer: 3", "Answer: 5", "Both checked.\nAnswer: 5"])
    assert forward_of("debate")(task, FakeLLM(lambda _: next(judged))) == "5"


def no_model_accuracy(split, family, n=120):
    forward = forward_of("python_compute")
    ps = P.problems(split, n, families=(family,))
    return sum(P.check(p, forward(p.question, dead_llm)) for p in ps) / n


def test_python_compute_solves_a_fair_share_of_search_problems_without_a_model():
    # measured on 200 per family (seed 0): search 50% arithmetic / 55% knights; held-out ~1% / 0%
    assert no_model_accuracy("search", "arithmetic") >= 0.4
    assert no_model_accuracy("search", "knights") >= 0.4
    assert no_model_accuracy("held_out", "knights") == 0.0  # its parser knows only search statement forms


def test_python_compute_evaluates_the_models_expression_safely():
    forward = forward_of("python_compute")
    p = next(q for q in P.problems("search", 8) if q.template == "savings")  # a*b - c
    a, b, c = re.findall(r"\d+", p.question)
    assert forward(p.question, FakeLLM(f"Expression: {a} * {b} - {c}")) == p.answer
    # numbers the task does not contain, or code, are refused: the word-math fallback answers instead
    for reply in (f"{a} * {b} - {c} + 1000", "__import__('os').system('true')", f"({a} * {b}"):
        assert isinstance(forward(p.question, FakeLLM(reply)), str)
    namespace = {}
    exec(dict(AGENTS.SEEDS)["python_compute"], namespace)
    with pytest.raises(ValueError):
        namespace["calc"](ast.parse("__import__('os')", mode="eval").body)
    assert namespace["calc"](ast.parse("6 * 4 / 3 - 1", mode="eval").body) == 7


# --------------------------------------------------------------------------- Promptbreeder material


def test_prompt_material_is_one_line_and_short():
    assert len(PE.SEED_PROMPTS) == 6
    for text in PE.SEED_PROMPTS:
        assert "\n" not in text and 0 < len(text) <= 200
    assert len(set(PE.SEED_PROMPTS)) == 6


def test_solve_sends_the_prompt_as_system_message_and_propagates_errors():
    p = P.problems("search", 2)[1]
    llm = FakeLLM("Answer: A: knight, B: knave")
    assert PE.solve(PE.SEED_PROMPTS[1], p, llm) == "Answer: A: knight, B: knave"
    [(messages, sampling)] = llm.calls
    assert messages == [
        {"role": "system", "content": PE.SEED_PROMPTS[1]},
        {"role": "user", "content": p.question},
    ]
    assert sampling["max_tokens"] == 160
    PE.solve("x", p, llm, max_tokens=32)
    assert llm.calls[-1][1]["max_tokens"] == 32
    with pytest.raises(RuntimeError, match="budget"):
        PE.solve("x", p, dead_llm)


def test_problems_module_is_loaded_once_by_file_path():
    from qd.task import load_task

    task = load_task("agent_design", {})  # its task.py loads problems.py under the same name
    assert sys.modules["experiments_agent_design_problems"] is P
    assert type(task.search[0]) is P.Problem
