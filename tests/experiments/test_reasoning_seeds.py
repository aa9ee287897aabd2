"""The seed agents (agent_design/seeds.py) and the Promptbreeder material (prompt_evolution/seeds.py),
run on the shared reasoning problems with fake models: no model needed."""

import ast
import re
from pathlib import Path

import pytest

from qd.reasoning import problems as P
from qd.task import load_module

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
PE = load_module(EXPERIMENTS / "prompt_evolution" / "seeds.py", "experiments_prompt_evolution_seeds")
AGENTS = load_module(EXPERIMENTS / "agent_design" / "seeds.py", "experiments_agent_design_seeds")


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


def test_the_reasoning_tasks_pose_the_shared_problems():
    from qd.task import load_task

    for name in ("agent_design", "agent_team", "prompt_evolution"):
        task = load_task(name, {"search_items": 2, "held_out_items": 2})
        assert type(task.search[0]) is P.Problem  # one module, whatever imports it
        assert task.search == P.problems("search", 2) and task.held_out() == P.problems("held_out", 2)
