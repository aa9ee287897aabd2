"""LLM variation operators: canned answers in, children (or reasons) out."""

import asyncio
import json

import numpy as np
import pytest
from helpers import FakeClient
from scripted_llm import Rule

from operators import Child, Parent, PromptContext, make_llm_operator
from qd.llm import LLMClient, LLMError, LLMSettings, ModelSpec

SEED = """import math

def solve(n):
    # EVOLVE-BLOCK-START
    total = 0
    for i in range(n):
        total += i
    return total
    # EVOLVE-BLOCK-END


if __name__ == "__main__":
    print(solve(10))
"""
IMPROVED = SEED.replace("total += i", "total += i * i")


def fenced(code: str) -> str:
    return f"Here is the improved program:\n```python\n{code}```\nIt squares the terms."


def run(op, parents, inspirations=(), **context):
    context = PromptContext(task=context.pop("task", "Make solve(n) as large as possible."), **context)
    return asyncio.run(op(list(parents), list(inspirations), context))


def user_prompt(client, call=0) -> str:
    return client.calls[call]["messages"][-1]["content"]


PARENT = Parent(
    id=7,
    text=SEED,
    fitness=45.0,
    metrics={"runtime_s": 0.012345, "lines": 12, "shape": [1, 2]},
    feedback="stderr: DeprecationWarning: old API",
)


# ---------------------------------------------------------------- rewrite, crossover, inspiration


def test_rewrite_makes_a_child_and_copies_the_call():
    client = FakeClient(fenced(IMPROVED))
    op = make_llm_operator("rewrite", client, temperature=0.3, max_tokens=400)
    (child,) = run(op, [PARENT], sample_index=42)
    assert child == Child(
        text=IMPROVED,
        error=None,
        operator="rewrite",
        model="default-model",
        prompt=json.dumps(client.calls[0]["messages"], ensure_ascii=False),
        response=fenced(IMPROVED),
        tokens_in=101,
        tokens_out=20,
        cost=0.25,
    )
    call = client.calls[0]
    assert (call["temperature"], call["max_tokens"], call["sample_index"], call["model"]) == (
        0.3,
        400,
        42,
        None,
    )
    assert [m["role"] for m in call["messages"]] == ["system", "user"]


def test_rewrite_keeps_frozen_code_when_the_answer_changes_it():
    answer = IMPROVED.replace("print(solve(10))", "print('hacked')").replace("import math", "import os")
    (child,) = run(make_llm_operator("rewrite", FakeClient(fenced(answer))), [PARENT])
    assert child.text == IMPROVED


def test_rewrite_accepts_only_the_region():
    answer = "```python\ntotal = 1\nfor i in range(n):\n    total *= i + 1\nreturn total\n```"
    (child,) = run(make_llm_operator("rewrite", FakeClient(answer)), [PARENT])
    assert "    total = 1\n    for i in range(n):\n        total *= i + 1\n    return total\n" in child.text
    assert child.text.startswith("import math\n\ndef solve(n):\n    # EVOLVE-BLOCK-START\n")


def test_model_is_picked_from_the_context_rng():
    client = FakeClient(fenced(IMPROVED))
    (child,) = run(make_llm_operator("rewrite", client), [PARENT], rng=np.random.default_rng(0))
    assert client.calls[0]["model"] in ("model-a", "model-b")
    assert child.model == client.calls[0]["model"]


def test_crossover_shows_both_parents():
    other = Parent(id=8, text=SEED.replace("total = 0", "total = 1"), fitness=46.5)
    client = FakeClient(fenced(IMPROVED))
    op = make_llm_operator("crossover", client)
    assert (op.num_parents, op.num_inspirations) == (2, 0)
    (child,) = run(op, [PARENT, other])
    assert child.text == IMPROVED and child.operator == "crossover"
    prompt = user_prompt(client)
    assert "Program A (score: 45;" in prompt and "Program B (score: 46.5)" in prompt
    assert "total = 1" in prompt and "total = 0" in prompt


def test_crossover_rejects_a_copy_of_either_parent():
    other = Parent(id=8, text=IMPROVED, fitness=50.0)
    (child,) = run(make_llm_operator("crossover", FakeClient(fenced(IMPROVED))), [PARENT, other])
    assert child.text is None and child.error == "crossover: answer repeats the parent unchanged"


def test_inspiration_shows_up_to_k_elites_with_scores():
    elites = [
        Parent(id=10 + i, text=SEED.replace("total = 0", f"total = {i}00"), fitness=50.0 + i)
        for i in range(3)
    ]
    client = FakeClient(fenced(IMPROVED))
    op = make_llm_operator("inspiration", client, num_inspirations=2)
    assert (op.num_parents, op.num_inspirations) == (1, 2)
    (child,) = run(op, [PARENT], elites)
    assert child.text == IMPROVED and child.operator == "inspiration"
    prompt = user_prompt(client)
    assert "Program 1 (score: 50)" in prompt and "Program 2 (score: 51)" in prompt
    assert "total = 000" in prompt and "total = 100" in prompt and "total = 200" not in prompt
    assert prompt.count("print(solve(10))") == 1  # inspirations show only their evolvable regions


def test_prompt_shows_task_scores_metrics_feedback_and_rules():
    client = FakeClient(fenced(IMPROVED))
    run(make_llm_operator("rewrite", client), [PARENT], task="TASK-TEXT: sum things")
    prompt = user_prompt(client)
    assert "TASK-TEXT: sum things" in prompt
    assert "score: 45; runtime_s=0.01235, lines=12)" in prompt  # non-scalar metrics are left out
    assert "DeprecationWarning: old API" in prompt
    assert SEED in prompt  # the parent's code, whole
    assert "EVOLVE-BLOCK-START and EVOLVE-BLOCK-END" in prompt
    assert "```python code block" in prompt


def test_prompt_clips_long_feedback_and_metrics():
    feedback = (
        "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "ZeroDivisionError: division by zero"
    )
    metrics = {f"metric_{i}": i / 3 for i in range(100)}
    parent = Parent(
        id=1, text="def solve(n):\n    return n\n", fitness=None, metrics=metrics, feedback=feedback
    )
    client = FakeClient(fenced("def solve(n):\n    return n * n\n"))
    run(make_llm_operator("rewrite", client), [parent])
    prompt = user_prompt(client)
    assert len(prompt) < 1500
    assert (
        "score: none" in prompt and "Traceback" in prompt and "ZeroDivisionError: division by zero" in prompt
    )
    assert "characters cut" in prompt and "metric_0=0" in prompt and "metric_99" not in prompt
    assert "EVOLVE-BLOCK" not in prompt  # no markers, no rule about them


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("I would square the terms.", "rewrite: no code block"),
        ("```python\ndef solve(n):\n    return sum(", "rewrite: unterminated code block (answer truncated?)"),
        ("```python\ndef solve(n:\n    pass\n```", "rewrite: syntax error line 5: "),  # line in the child
        ("   \n", "rewrite: empty answer"),
        (fenced(SEED), "rewrite: answer repeats the parent unchanged"),
        ("```python\ntotal = (\n```", "rewrite: syntax error line"),
        (
            fenced("import math\n# EVOLVE-BLOCK-START\nx = 1\n"),
            "rewrite: answer has broken EVOLVE-BLOCK markers",
        ),
        (
            fenced(
                SEED.replace("# EVOLVE-BLOCK-START\n", "")
                .replace("    # EVOLVE-BLOCK-END\n", "")
                .replace("print(solve(10))", 'print("other")')
            ),
            "rewrite: answer changes the frozen code",
        ),
    ],
)
def test_unusable_answers_give_a_child_without_text(answer, reason):
    (child,) = run(make_llm_operator("rewrite", FakeClient(answer)), [PARENT])
    assert child.text is None and child.error.startswith(reason), child.error
    assert child.response == answer and child.tokens_in == 101 and child.cost == 0.25


def test_truncation_is_noted_in_the_reason():
    client = FakeClient("```python\ndef solve(n:\n```", finish_reason="length")
    (child,) = run(make_llm_operator("rewrite", client), [PARENT])
    assert child.error.endswith("(answer cut at max_tokens)")


def test_wrong_number_of_parents():
    with pytest.raises(ValueError, match="crossover: needs 2 parent"):
        run(make_llm_operator("crossover", FakeClient()), [PARENT])


# ---------------------------------------------------------------- diff


DIFF = "<<<<<<< SEARCH\n        total += i\n=======\n        total += i * i\n>>>>>>> REPLACE\n"


def test_diff_applies_search_replace():
    client = FakeClient(f"Change the sum:\n{DIFF}")
    (child,) = run(make_llm_operator("diff", client), [PARENT])
    assert child.text == IMPROVED and child.operator == "diff" and child.error is None
    assert "<<<<<<< SEARCH" in user_prompt(client)


def test_diff_failure_falls_back_to_rewrite():
    client = FakeClient("Sure! I would square the terms.", fenced(IMPROVED))
    children = run(make_llm_operator("diff", client), [PARENT], rng=np.random.default_rng(1))
    assert [c.operator for c in children] == ["diff", "diff>rewrite"]
    failed, rewritten = children
    assert failed.text is None and failed.error == "diff: no SEARCH/REPLACE blocks in the answer"
    assert rewritten.text == IMPROVED and rewritten.error is None
    assert failed.prompt != rewritten.prompt and "<<<<<<< SEARCH" not in rewritten.prompt
    assert client.calls[0]["model"] == client.calls[1]["model"]  # one model choice per proposal
    assert (failed.tokens_in, rewritten.tokens_in) == (101, 102)


def test_diff_fallback_records_both_reasons():
    outside = "<<<<<<< SEARCH\nimport math\n=======\nimport os\n>>>>>>> REPLACE\n"
    children = run(make_llm_operator("diff", FakeClient(outside, "no code either")), [PARENT])
    assert [c.error for c in children] == [
        "diff: block 1 of 1: SEARCH text is in the frozen code outside the EVOLVE-BLOCK regions",
        "diff>rewrite: no code block",
    ]


def test_diff_without_fallback_gives_one_child():
    client = FakeClient("<<<<<<< SEARCH\nnot in the program\n=======\nx\n>>>>>>> REPLACE\n")
    (child,) = run(make_llm_operator("diff", client, fallback_to_rewrite=False), [PARENT])
    assert child.text is None and child.error.startswith("diff: block 1 of 1: SEARCH text not found")
    assert len(client.calls) == 1


def test_diff_that_adds_markers_is_rejected():
    answer = "<<<<<<< SEARCH\n        total += i\n=======\n        # EVOLVE-BLOCK-END\n>>>>>>> REPLACE\n"
    (child,) = run(make_llm_operator("diff", FakeClient(answer), fallback_to_rewrite=False), [PARENT])
    assert child.text is None and "EVOLVE-BLOCK" in child.error


# ---------------------------------------------------------------- errors and templates


@pytest.mark.parametrize("name", ["rewrite", "diff", "crossover", "inspiration"])
def test_llm_error_propagates(name):
    op = make_llm_operator(name, FakeClient(LLMError("llm: server unreachable")))
    with pytest.raises(LLMError, match="unreachable"):
        run(op, [PARENT] * op.num_parents, [PARENT])


def test_a_failed_fallback_call_keeps_the_answered_diff():
    """The diff's answer is paid for: a failed rewrite fallback is a failed second child, not a lost first."""
    op = make_llm_operator("diff", FakeClient("no diff here", LLMError("llm: server unreachable")))
    diff, fallback = run(op, [PARENT])
    assert diff.operator == "diff" and diff.text is None and diff.response == "no diff here"
    assert (fallback.operator, fallback.text, fallback.model, fallback.error) == (
        "diff>rewrite",
        None,
        None,
        "llm: server unreachable",
    )


def test_unknown_operator():
    expected = (
        r"^name: unknown operator 'mutate' "
        r"\(use one of \['crossover', 'diff', 'inspiration', 'meta_agent', 'rewrite'\]\)$"
    )
    with pytest.raises(ValueError, match=expected):
        make_llm_operator("mutate", FakeClient())


def test_template_override_from_a_file(tmp_path):
    path = tmp_path / "rewrite.txt"
    path.write_text("CUSTOM PROMPT for $language\n$parent\nReply with code.\n")
    client = FakeClient(fenced(IMPROVED))
    (child,) = run(make_llm_operator("rewrite", client, templates={"rewrite": str(path)}), [PARENT])
    assert child.text == IMPROVED
    assert user_prompt(client).startswith("CUSTOM PROMPT for python\nCurrent program (score: 45;")


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("rewrite", "Improve this: $task\n", r"templates\.rewrite: missing placeholder \$parent"),
        (
            "inspiration",
            "$parent $inspirations $scroe",
            r"templates\.inspiration: unknown placeholder \$scroe",
        ),
        ("program", "$label $code costs $5", r"templates\.program: malformed placeholder"),
        ("diff", None, r"templates\.diff: cannot read .*missing\.txt"),
    ],
)
def test_bad_template_fails_at_construction(tmp_path, name, text, message):
    path = tmp_path / "missing.txt"
    if text is not None:
        path.write_text(text)
    # every template is checked whatever the operator, so a config typo surfaces at once
    with pytest.raises(ValueError, match=message):
        make_llm_operator("rewrite", FakeClient(), templates={name: str(path)})


def test_unknown_template_name():
    with pytest.raises(ValueError, match=r"templates\.rewite: unknown template"):
        make_llm_operator("rewrite", FakeClient(), templates={"rewite": "x.txt"})


# ---------------------------------------------------------------- through the real client and a server


def through_client(server, op_name, parents):
    async def go():
        spec = ModelSpec("scripted", price_in=1.0, price_out=2.0)
        client = LLMClient(LLMSettings(base_url=server.base_url, models=(spec,), max_retries=0, timeout_s=10))
        try:
            op = make_llm_operator(op_name, client)
            context = PromptContext(task="Sum squares.", rng=np.random.default_rng(0), sample_index=3)
            return await op(parents, [], context)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_rewrite_through_llm_client(scripted_llm):
    server = scripted_llm([Rule("Current program", reply=fenced(IMPROVED))])
    (child,) = through_client(server, "rewrite", [PARENT])
    assert child.text == IMPROVED and child.model == "scripted"
    assert child.tokens_out == len(fenced(IMPROVED)) // 4 and child.tokens_in > 100
    assert child.cost == pytest.approx((child.tokens_in + 2 * child.tokens_out) / 1e6)
    assert json.loads(child.prompt) == server.requests[0]["messages"]


def test_diff_fallback_through_llm_client(scripted_llm):
    server = scripted_llm(
        [Rule("SEARCH", reply="I would rewrite the loop."), Rule("", reply=fenced(IMPROVED))]
    )
    failed, rewritten = through_client(server, "diff", [PARENT])
    assert failed.error == "diff: no SEARCH/REPLACE blocks in the answer"
    assert failed.response == "I would rewrite the loop."
    assert rewritten.text == IMPROVED and rewritten.operator == "diff>rewrite"
    assert len(server.requests) == 2


def test_truncated_answer_through_llm_client(scripted_llm):
    server = scripted_llm([Rule("", reply=fenced(IMPROVED), fault="truncate")])
    (child,) = through_client(server, "rewrite", [PARENT])
    # Salvaging keeps the part that compiles, but it is cut inside the EVOLVE-BLOCK.
    assert child.text is None and child.error.startswith("rewrite: answer has broken EVOLVE-BLOCK markers")
    assert child.error.endswith("(answer cut at max_tokens)")


def test_llm_error_through_llm_client(scripted_llm):
    server = scripted_llm([Rule("", fault="401")])
    with pytest.raises(LLMError, match="HTTP 401"):
        through_client(server, "crossover", [PARENT, PARENT])


@pytest.mark.slow
def test_every_operator_against_the_real_llama_server(llama_server):
    """Each operator returns children with the full record, whatever SmolLM2 answers, and some of
    their answers make valid programs (3 samples of each operator, pooled)."""
    ops, samples = ("rewrite", "diff", "crossover", "inspiration"), (1, 2, 3)

    async def go():
        client = LLMClient(
            LLMSettings(
                base_url=llama_server.base_url,
                models=(ModelSpec(llama_server.model),),
                max_tokens=128,
                seed=0,
            )
        )
        try:
            made = []
            for op_name in ops:
                op = make_llm_operator(op_name, client, num_inspirations=1)
                for sample_index in samples:
                    context = PromptContext(task="Sum the squares of 1..n.", sample_index=sample_index)
                    parents = [PARENT] * op.num_parents
                    made.append((op_name, await op(parents, [PARENT] * op.num_inspirations, context)))
            return made
        finally:
            await client.aclose()

    made = asyncio.run(go())
    for op_name, children in made:
        assert 1 <= len(children) <= 2
        for child in children:
            assert child.model == llama_server.model and child.tokens_in > 0 and child.tokens_out > 0
            assert child.response and child.prompt
            assert (child.text is None) == (child.error is not None)
            if child.text is not None:  # frozen code kept byte for byte
                assert child.text.startswith("import math\n\ndef solve(n):\n    # EVOLVE-BLOCK-START\n")
        if op_name == "diff" and len(children) == 2:
            assert children[0].error.startswith("diff: ") and children[1].operator == "diff>rewrite"
    valid = [(op_name, c.operator) for op_name, children in made for c in children if c.text is not None]
    print(f"\nSmolLM2 operators: {len(valid)} valid of {sum(len(cs) for _, cs in made)} children: {valid}")
    # Measured: one call of each operator with seeds 0-29 (sample_index 1): valid children from
    # rewrite 10/30, diff 6/30 (all from its rewrite fallback; a SEARCH/REPLACE answer parsed 0/30),
    # crossover 9/30, inspiration 14/30. Pooled as here (3 calls of each, 10 disjoint groups of
    # seeds): min 1, median 4, max 7 valid of 12; by those rates P(0 of 12) = 0.8%. Floor: 1.
    assert len(valid) >= 1, [c.error for _, children in made for c in children]
