"""``bench/quality_tasks.py`` and the parts of ``bench/quality.py`` that hand the prompt task to
the peers: a prompt is scored on the run seed's validation rows (not its test rows) on the bench's
server, a peer's file is scored without its markers, the proposals that fit a budget when each is
scored on those rows, and the seed a one-seed peer starts from."""

import sys
from pathlib import Path

from scripted_llm import Rule

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import quality  # noqa: E402
import quality_peers  # noqa: E402
import quality_tasks  # noqa: E402

SEED = 3


def test_a_prompt_is_scored_on_the_validation_rows_of_the_run_seed(scripted_llm):
    task = quality_tasks.prompt_task(SEED)
    validation = task.splits.validation
    right = {row.input: str(row.answer) for row in validation[::2]}  # every other row answered right

    def answer(body: dict) -> str:
        asked = body["messages"][-1]["content"]
        return next((a for q, a in right.items() if q in asked), "-999")

    server = scripted_llm([Rule("", answer)])
    prompt = "Solve it.\nAnswer with the number only."
    scored = quality_tasks.score_prompt(
        {"seed": SEED, "model": "scripted", "base_url": server.base_url}, prompt
    )
    assert scored["fitness"] == len(right) / len(validation)
    assert (
        scored["valid"]
        and scored["feedback"] == f"{len(right)} of {len(validation)} validation answers accepted"
    )
    assert scored["descriptor"] == [7.0, 2.0]  # words, lines
    asked = [m["content"] for body in server.requests for m in body["messages"] if m["role"] == "user"]
    assert sorted(asked) == sorted(row.input for row in validation)  # the test rows stay unseen


def test_a_peer_file_is_scored_without_its_evolve_markers():
    shinka = "<!-- EVOLVE-BLOCK-START -->\nSolve it.\nAnswer with the number.\n<!-- EVOLVE-BLOCK-END -->\n"
    assert quality_peers.prompt_text(shinka) == "Solve it.\nAnswer with the number."
    assert quality_peers.prompt_text("# EVOLVE-BLOCK-START\nSolve it.\n# EVOLVE-BLOCK-END") == "Solve it."
    said = "Mention EVOLVE-BLOCK-START in a sentence."
    assert quality_peers.prompt_text(said) == said  # a marker is a line of its own


def test_the_proposals_that_fit_a_budget_count_each_ones_validation_calls():
    rows = len(quality_tasks.prompt_task(SEED).splits.validation)
    params = quality._prompt_params(SEED, 80)
    assert params["scoring"] == rows
    # the seed scored once, then a proposal call and its scoring each
    assert rows + params["proposals"] * (1 + rows) <= 80 < rows + (params["proposals"] + 1) * (1 + rows)
    assert quality._prompt_params(SEED, rows)["proposals"] == 0


def test_a_one_seed_peer_starts_from_the_best_seed_by_the_task_scorer():
    task = quality_tasks.bench_task("function_fit", None)
    fitness = {s: task.score(s)["fitness"] for s in task.seeds}
    assert quality_tasks.best_seed(task) == max(fitness, key=fitness.get) != task.seeds[0]
    assert quality_tasks.best_seed(quality_tasks.bench_task("prompt", None)) == quality_tasks.PROMPT_SEED
