"""The agent operator in a run: its trials are stored and counted but never placed, its calls stay
within the budget and replay exactly from the cache (scripted server); against SmolLM2 the loop
ends cleanly (slow)."""

import numpy as np
import pytest
from helpers import on_server, run_engine, scripted_text_config, stored
from scripted_llm import Rule

from qd.plan import compose
from qd.run import build_engine
from qd.search.gate import TRIAL

AGENT = "operators.mix=[{name: agent, max_steps: 3, max_trials: 1}]"


def draft(request: dict) -> str:
    """A different small program per sample seed."""
    seed = int(request.get("seed") or 0)
    return f"```python\ndef f(x):\n    return x * x + {seed % 5 * 0.25} * x + {seed % 3}\n```"


def tries_then_submits(request: dict) -> str:
    """The agent's first step tries a draft, the next submits it."""
    user = [m["content"] for m in request["messages"] if m["role"] == "user"]
    return ("TOOL: submit\n" if len(user) > 1 else "TOOL: trial\n") + draft(request)


def keeps_reading(request: dict) -> str:
    return "TOOL: read_parent"


def keeps_trying(request: dict) -> str:
    return "TOOL: trial\n" + draft(request)


def finished(cfg, path):
    engine = build_engine(cfg, path)
    summary = run_engine(engine)
    return summary, engine.state.archive, stored(path)


@pytest.mark.slow
def test_trials_are_stored_and_counted_never_placed_and_a_rerun_replays_them(tmp_path, scripted_llm):
    server = scripted_llm([Rule("", tries_then_submits)])
    # one child at a time: which step gets the budget's last calls is then fixed
    cfg = [AGENT, "runner.max_llm_calls=8", "runner.in_flight=1", "runner.batch_size=1"]
    cfg.append(f"llm.cache_dir={tmp_path / 'cache'}")
    summary, archive, rows = finished(scripted_text_config(server.base_url, *cfg), tmp_path / "a")
    trials = [c for c in rows if c.operator == "agent>trial"]
    children = [c for c in rows if c.operator == "agent"]
    assert len(trials) == len(children) == 4 and summary["evaluations"] == len(rows)
    assert all(not c.valid and TRIAL in c.artifacts and c.metrics["stages"] == 1 for c in trials)
    assert sum(c.valid for c in children) >= 3 and all(c.metrics["stages"] == 2 for c in children if c.valid)
    placed = set(np.asarray(archive.genome_id).ravel().tolist())
    assert placed & {c.id for c in children} and not placed & {c.id for c in trials}
    assert summary["llm"]["calls"] == 8

    server.stop()  # the replay must not need it
    _, _, again = finished(scripted_text_config(server.base_url, *cfg, "llm.max_retries=0"), tmp_path / "b")

    def fingerprint(c):
        return c.text, c.operator, list(c.parent_ids), c.fitness, c.valid, c.error, c.prompt, c.tokens_in

    assert [fingerprint(c) for c in again] == [fingerprint(c) for c in rows]


@pytest.mark.parametrize(
    "answer, budget",
    [(keeps_reading, "runner.max_llm_calls=10"), (keeps_trying, "runner.max_evaluations=14")],
)
def test_a_model_that_keeps_calling_tools_never_exceeds_the_budget(tmp_path, scripted_llm, answer, budget):
    server = scripted_llm([Rule("", answer)])
    # One child at a time: each child's trial reserves its evaluation before the next child
    # reserves its own (with several at once, faster evaluations let the children take the whole
    # budget first, and no trial would test it).
    one_at_a_time = ("runner.in_flight=1", "runner.batch_size=1")
    cfg = scripted_text_config(server.base_url, AGENT, "runner.max_llm_calls=40", *one_at_a_time, budget)
    summary, _, rows = finished(cfg, tmp_path)
    limit = int(budget.split("=")[1])
    if "llm_calls" in budget:
        assert summary["llm"]["calls"] == 10  # every call reserved before it was made
        assert all(c.error.startswith("agent: no ") for c in rows if c.operator == "agent")
    else:
        assert len(rows) == summary["evaluations"] <= limit
        assert any(c.operator == "agent>trial" for c in rows)


@pytest.mark.slow
def test_against_smollm2_the_loop_ends_cleanly_with_a_stored_reason(tmp_path, llama_server):
    cfg = compose(
        [
            "experiment=function_fit",
            *on_server(llama_server.base_url, llama_server.model),
            "runner.max_llm_calls=6",
            "runner.in_flight=1",
            "operators.mix=[{name: agent, max_steps: 2}]",
        ]
    )
    summary, _, rows = finished(cfg, tmp_path)
    children = [c for c in rows if c.operator == "agent"]
    assert children and summary["llm"]["calls"] <= 6
    # each child is a submitted program or stopped with the loop's reason, its conversation kept
    assert all(c.text is not None or c.error.startswith("agent: ") for c in children)
    assert all(c.prompt and '"assistant"' in c.prompt for c in children)
