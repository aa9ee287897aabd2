"""Meta-prompt evolution: instructions in prompts, credit, evolution through a scripted server,
persistence."""

import asyncio
import json

import numpy as np
import pytest
from scripted_llm import Rule
from test_llm_operators import SEED as PROGRAM  # the same EVOLVE-BLOCK program

from operators import Parent, PromptContext, make_llm_operator
from operators.llm import PROMPTS
from operators.meta import HYPER, HYPER_SEED, META, SEED, Instruction, InstructionPool
from qd.llm import LLMClient, LLMError, LLMSettings, ModelSpec
from qd.store import Candidate, Store

IMPROVED = PROGRAM.replace("total += i", "total += i * i")
PARENT = Parent(id=7, text=PROGRAM, fitness=45.0)
OTHER = Parent(id=8, text=PROGRAM.replace("total = 0", "total = 1"), fitness=46.0)
MUTATE = "Answer with the new instruction only"  # in the mutate prompt only
HYPER_ASK = "Answer with the new prompt only"  # in the hyper-mutation prompt only
EVOLVED = "Square each term before adding it."


def with_client(server, go, models=("scripted",)):
    """Runs ``await go(client)`` with a real LLMClient on ``server``."""

    async def main():
        client = LLMClient(
            LLMSettings(
                base_url=server.base_url,
                models=tuple(ModelSpec(m) for m in models),
                max_retries=0,
                timeout_s=10,
            )
        )
        try:
            return await go(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "store.sqlite") as s:
        yield s


def evolve(server, pool, rng=None, **kwargs):
    return with_client(
        server, lambda client: pool.evolve(client, rng or np.random.default_rng(0), 5, **kwargs)
    )


def user_prompt(request) -> str:
    return request["messages"][-1]["content"]


# ---------------------------------------------------------------- the two PromptContext fields


@pytest.mark.parametrize("name", ["rewrite", "diff", "crossover", "inspiration"])
def test_instruction_is_shown_only_when_set(scripted_llm, tmp_path, name):
    server = scripted_llm([Rule("", reply=f"```python\n{IMPROVED}```")])
    # The default template without $instruction: what every prompt was before instructions existed.
    old = tmp_path / f"{name}.txt"
    old.write_text((PROMPTS / f"{name}.txt").read_text().replace("${instruction}", ""))

    async def go(client):
        parents = [PARENT, OTHER][: 2 if name == "crossover" else 1]
        for templates, instruction in [
            (None, "Simplify the arithmetic; prefer fewer constants."),
            (None, None),
            ({name: str(old)}, None),
        ]:
            op = make_llm_operator(
                name, client, templates=templates, num_inspirations=1, fallback_to_rewrite=False
            )
            await op(parents, [OTHER], PromptContext(task="Sum squares.", instruction=instruction))

    with_client(server, go)
    shown, plain, before = (user_prompt(r) for r in server.requests)
    assert "Instruction: Simplify the arithmetic; prefer fewer constants.\nAnswer with" in shown
    assert "Instruction" not in plain
    assert plain == before  # no instruction: exactly the prompt of a template without the placeholder


def test_model_in_the_context_is_the_model_sent(scripted_llm):
    server = scripted_llm([Rule("", reply=f"```python\n{IMPROVED}```")])

    async def go(client):
        op = make_llm_operator("rewrite", client)
        # the context's model wins over the rng's pick, whatever the rng
        return [
            await op([PARENT], [], PromptContext(task="t", rng=np.random.default_rng(s), model="b"))
            for s in range(4)
        ]

    results = with_client(server, go, models=("a", "b"))
    assert [r["model"] for r in server.requests] == ["b"] * 4
    assert {child.model for (child,) in results} == {"b"}


# ---------------------------------------------------------------- picking and credit


def test_credit_goes_to_the_instruction_whose_children_improved(store):
    pool = InstructionPool(store, seeds=("Instruction X.", "Instruction Y."))
    rng = np.random.default_rng(0)
    picked = []
    for _ in range(300):
        ins = pool.pick(rng)
        picked.append(ins.text)
        pool.credit(ins.id, 2.5 if ins.text == "Instruction X." else 0.0)
    x, y = pool.members
    assert x.mean == pytest.approx(2.5) and y.mean == 0.0 and y.uses >= 3  # Y was still explored
    assert x.uses + y.uses == 300 and pool.since_evolve == 300
    assert picked[-100:].count("Instruction X.") > 90


def test_pick_is_deterministic_for_an_rng(store, tmp_path):
    def picks(s):
        pool = InstructionPool(s)
        rng = np.random.default_rng(3)
        out = []
        for _ in range(50):
            ins = pool.pick(rng)
            pool.credit(ins.id, float(ins.id % 3))
            out.append(ins.id)
        return out

    with Store(tmp_path / "other.sqlite") as other:
        assert picks(store) == picks(other)


def test_new_instructions_are_tried_soon(store):
    pool = InstructionPool(store, seeds=("A.", "B."))
    rng = np.random.default_rng(0)
    for _ in range(100):
        pool.credit(pool.pick(rng).id, 1.0)
    pool.members.append(Instruction(99, "C.", 0))  # as evolve adds a child
    assert "C." in [pool.pick(rng).text for _ in range(10)]


def test_credit_ignores_dropped_ids_and_rejects_nan(store):
    pool = InstructionPool(store)
    pool.pick(np.random.default_rng(0))
    pool.credit(12345, 1.0)
    assert sum(m.credit for m in pool.members) == 0.0
    with pytest.raises(ValueError, match="improvement: must be finite"):
        pool.credit(pool.members[0].id, float("nan"))


def test_seeds_are_stored_at_first_use(store):
    pool = InstructionPool(store, seeds=("A.", "B."))
    assert store.count() == 0 and pool.state_dict()["mutation_id"] is None
    ins = pool.pick(np.random.default_rng(0))
    rows = store.get(range(3))
    assert [(r.kind, r.operator, r.text, list(r.parent_ids), r.valid, r.fitness) for r in rows] == [
        ("instruction", SEED, "A.", [], True, None),
        ("instruction", SEED, "B.", [], True, None),
        ("instruction", HYPER_SEED, pool.mutation.text, [], True, None),
    ]
    assert ins.id in (0, 1)


def test_due_after_evolve_every_picks(store):
    pool = InstructionPool(store, evolve_every=3)
    rng = np.random.default_rng(0)
    assert [(pool.pick(rng), pool.due())[1] for _ in range(3)] == [False, False, True]


# ---------------------------------------------------------------- evolution


def test_evolve_stores_a_child_with_lineage(scripted_llm, store):
    server = scripted_llm([Rule(MUTATE, reply=f"Instruction: {EVOLVED}")])  # the label is dropped
    pool = InstructionPool(store, task="Maximise solve(n).", evolve_every=2)
    rng = np.random.default_rng(0)
    pool.pick(rng), pool.pick(rng)
    assert pool.due()
    child = evolve(server, pool)
    assert child is not None and child.text == EVOLVED and child in pool.members and not pool.due()
    parent = next(m for m in pool.members if m.id == child.parent_id)
    (row,) = store.get([child.id])
    assert (row.kind, row.operator, row.text, list(row.parent_ids), row.valid) == (
        "instruction",
        META,
        EVOLVED,
        [parent.id],
        True,
    )
    assert row.model == "scripted" and row.tokens_in > 0 and row.tokens_out > 0 and row.error is None
    (request,) = server.requests
    assert json.loads(row.prompt) == request["messages"]
    prompt = user_prompt(request)
    assert (
        f"Instruction: {parent.text}" in prompt
        and "Maximise solve(n)." in prompt
        and pool.mutation.text in prompt
    )


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("   \n", "meta: empty answer"),
        ("Square the terms.\n\nThen add them up in a loop.", "meta: answer has 2 lines (expected one)"),
        ("Only instruction.", "meta: answer repeats the parent unchanged"),
        ('"only  INSTRUCTION."', "meta: answer repeats the parent unchanged"),
        ("x" * 201, "meta: answer has 201 characters (at most 200)"),
    ],
)
def test_unusable_answers_are_recorded_not_added(scripted_llm, store, answer, reason):
    server = scripted_llm([Rule(MUTATE, reply=answer)])
    pool = InstructionPool(store, seeds=("Only instruction.",))
    assert evolve(server, pool) is None
    assert [m.text for m in pool.members] == ["Only instruction."] and pool.failures == 1
    row = store.get([store.last_id()])[0]
    assert (row.kind, row.text, row.valid, row.error, row.response) == (
        "instruction",
        None,
        False,
        reason,
        answer,
    )
    assert list(row.parent_ids) == [pool.members[0].id]


def test_answer_repeating_another_member_is_recorded(scripted_llm, store):
    server = scripted_llm([Rule(MUTATE, reply="B.")])
    pool = InstructionPool(store, seeds=("A.", "B."))
    rng = np.random.default_rng(0)
    for _ in range(20):  # A is the good one: the parent
        ins = pool.pick(rng)
        pool.credit(ins.id, float(ins.text == "A."))
    assert evolve(server, pool) is None
    assert store.get([store.last_id()])[0].error == "meta: answer repeats instruction 1"


def test_llm_error_propagates(scripted_llm, store):
    server = scripted_llm([Rule("", fault="401")])
    pool = InstructionPool(store)
    with pytest.raises(LLMError, match="HTTP 401"):
        evolve(server, pool)
    assert len(pool.members) == 6 and store.count() == 7  # the seeds and the mutation prompt only


def test_population_is_capped_dropping_the_worst_experienced(scripted_llm, store):
    server = scripted_llm([Rule(MUTATE, reply=EVOLVED)])
    pool = InstructionPool(store, seeds=("Good.", "Bad.", "Untried."), size=3, min_uses=5)
    pool.pick(np.random.default_rng(0))  # seeds the pool
    good, bad, untried = pool.members
    good.uses, good.credit, bad.uses, bad.credit, untried.uses = 5, 5.0, 5, 0.0, 0
    child = evolve(server, pool)
    # the bad one goes; the untried one (mean 0 too, but not enough uses) and the newborn stay
    assert pool.members == [good, untried, child]


def test_newborn_is_never_dropped(scripted_llm, store):
    server = scripted_llm([Rule(MUTATE, reply=EVOLVED)])
    pool = InstructionPool(store, seeds=("Good.",), size=1)
    pool.pick(np.random.default_rng(0))
    pool.members[0].uses, pool.members[0].credit = 10, 10.0
    child = evolve(server, pool)
    assert pool.members == [child]


def test_model_for_evolve(scripted_llm, store):
    server = scripted_llm([Rule(MUTATE, reply=EVOLVED)])
    pool = InstructionPool(store)
    with_client(
        server, lambda client: pool.evolve(client, np.random.default_rng(0), 1, model="b"), models=("a", "b")
    )
    assert server.requests[0]["model"] == "b"


def test_hyper_mutation_changes_the_mutation_prompt(scripted_llm, store):
    new_prompt = "Rewrite the instruction so that it names one concrete code change."
    server = scripted_llm(
        [
            Rule(HYPER_ASK, reply=new_prompt),
            Rule(MUTATE, reply=EVOLVED, times=1),
            Rule(MUTATE, reply="Unroll the loop."),
        ]
    )
    pool = InstructionPool(store, hyper=True, hyper_every=2)
    first = evolve(server, pool)  # evolution 1: no hyper-mutation
    old = pool.mutation
    assert len(server.requests) == 1 and old.text != new_prompt
    second = evolve(server, pool)  # evolution 2: hyper-mutation first
    assert len(server.requests) == 3 and first is not None and second is not None
    assert pool.mutation.text == new_prompt and pool.mutation.parent_id == old.id
    (row,) = store.get([pool.mutation.id])
    assert (row.kind, row.operator, list(row.parent_ids), row.valid) == ("instruction", HYPER, [old.id], True)
    assert old.text in user_prompt(server.requests[1])
    assert new_prompt in user_prompt(server.requests[2])  # the child is made by the new mutation prompt
    assert store.get([second.id])[0].operator == META


def test_unusable_hyper_answer_keeps_the_mutation_prompt(scripted_llm, store):
    server = scripted_llm([Rule(HYPER_ASK, reply=""), Rule(MUTATE, reply=EVOLVED)])
    pool = InstructionPool(store, hyper=True, hyper_every=1)
    child = evolve(server, pool)
    assert child is not None and pool.failures == 1
    assert store.get([pool.mutation.id])[0].operator == HYPER_SEED
    assert pool.mutation.text in user_prompt(server.requests[1])
    failed = [r for r in store.iter() if not r.valid]
    assert [(r.operator, r.error) for r in failed] == [(HYPER, "meta>hyper: empty answer")]


# ---------------------------------------------------------------- persistence and settings


def test_state_dict_round_trip(scripted_llm, store):
    server = scripted_llm(
        [Rule(HYPER_ASK, reply="Make the instruction concrete."), Rule(MUTATE, reply=EVOLVED)]
    )
    pool = InstructionPool(store, hyper=True, hyper_every=1)
    rng = np.random.default_rng(0)
    for _ in range(30):
        ins = pool.pick(rng)
        pool.credit(ins.id, ins.id / 7)
    evolve(server, pool)
    state = json.loads(json.dumps(pool.state_dict()))
    restored = InstructionPool(store, hyper=True, hyper_every=1)
    restored.load_state_dict(state)
    assert restored.members == pool.members and restored.mutation == pool.mutation
    assert restored.state_dict() == state
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    assert [pool.pick(a).id for _ in range(20)] == [restored.pick(b).id for _ in range(20)]


def test_load_state_dict_rejects_a_program_id(store):
    store.add(
        [
            Candidate(
                kind="text",
                island=0,
                fitness=1.0,
                descriptor=np.zeros(2, np.float32),
                valid=True,
                text=PROGRAM,
            )
        ]
    )
    pool = InstructionPool(store)
    with pytest.raises(ValueError, match="state: candidate 0 is not a stored instruction"):
        pool.load_state_dict(
            {
                "members": [{"id": 0, "uses": 1, "credit": 0.0}],
                "mutation_id": None,
                "since_evolve": 0,
                "evolutions": 0,
                "failures": 0,
            }
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seeds=()), r"seeds: need 1 to size=12 seeds, got 0"),
        (dict(seeds=("A.",) * 2), r"seeds\[1\]: repeats another seed"),
        (dict(seeds=("Two\nlines.",)), r"seeds\[0\]: answer has 2 lines"),
        (dict(mutation_prompt=" "), r"mutation_prompt: empty answer"),
        (dict(size=0), r"size: must be >= 1, got 0"),
        (dict(temperature=0.0), r"temperature, explore"),
    ],
)
def test_bad_settings_fail_at_construction(store, kwargs, message):
    with pytest.raises(ValueError, match=message):
        InstructionPool(store, **kwargs)


def test_template_override_is_checked(store, tmp_path):
    path = tmp_path / "mutate.txt"
    path.write_text("Improve: $mutation\n")
    with pytest.raises(ValueError, match=r"templates\.mutate: missing placeholder \$instruction"):
        InstructionPool(store, templates={"mutate": str(path)})
    path.write_text("$mutation | $instruction | one line please")
    pool = InstructionPool(store, templates={"mutate": str(path)})
    assert pool._messages("mutate", mutation="M", instruction="I")[0]["content"] == "M | I | one line please"


# ---------------------------------------------------------------- the real model


@pytest.mark.slow
def test_smollm2_evolves_an_instruction(llama_server, store):
    """Each evolve gives a pool member or a recorded reason, whatever SmolLM2 answers; one of at most
    25 evolves gives a member."""
    # Measured: one evolve each with seeds 0-29 gave a member 5 times (17%); failures before each
    # success 4, 4, 3, 9, 0 (then 5 more); the rest are answers of 2-8 lines or > 200 characters.
    # Floor: a member within 25 evolves (longest measured run of failures: 9; P(25 failures) = 1%).
    # It stops at the first member, so a passing run costs a few calls.
    tries = 25

    async def go():
        client = LLMClient(
            LLMSettings(
                base_url=llama_server.base_url, models=(ModelSpec(llama_server.model),), max_tokens=64, seed=0
            )
        )
        try:
            pool = InstructionPool(store, task="Make solve(n) return the sum of the squares of 0..n-1.")
            rng, rows = np.random.default_rng(0), []
            for sample_index in range(1, tries + 1):
                child = await pool.evolve(client, rng, sample_index=sample_index)
                rows.append((child, store.get([store.last_id()])[0], pool.failures, len(pool.members)))
                if child is not None:
                    break
            return pool, rows
        finally:
            await client.aclose()

    pool, rows = asyncio.run(go())
    print(f"\nSmolLM2 meta: {len(rows)} evolves, a member: {rows[-1][0] is not None}")
    for n, (child, row, failures, members) in enumerate(rows, 1):
        assert row.kind == "instruction" and row.operator == META and row.model == llama_server.model
        assert row.tokens_in > 0 and row.response is not None and len(row.parent_ids) == 1
        if child is None:
            assert not row.valid and row.error.startswith("meta: ") and failures == n and members == 6
        else:
            assert row.valid and row.text == child.text and "\n" not in child.text and child in pool.members
            assert failures == n - 1 and members == 7
    assert rows[-1][0] is not None, f"no member in {tries} evolves: {[row.error for _, row, _, _ in rows]}"
