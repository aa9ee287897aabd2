"""The host side of a prompt's evaluation: the fixed solver answers each question with it.

A prompt is data: it is never executed, only sent to the solver as its system
message (``seeds.solve``). This runs on the host, in a worker thread, with
``llm`` over the evaluation's model gateway (budget, cache, ledger, trace).
"""

from __future__ import annotations

from pathlib import Path

from qd.task import load_module

seeds = load_module(Path(__file__).resolve().parent / "seeds.py", "experiments_prompt_evolution_seeds")


def run(text: str, llm, questions: list[str], max_tokens: int = 160) -> list[dict]:
    prompt = text.strip()
    results = []
    for question in questions:
        try:
            results.append({"answer": seeds.solve(prompt, question, llm, max_tokens)})
        except Exception as e:  # the budget is spent, or the model failed: this question is lost
            results.append({"answer": None, "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]})
    return results
