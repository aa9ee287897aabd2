"""The host side of an attack's evaluation: each target variant answers the attack once.

An attack is data: it is never executed, only sent as the user message to the
target (``target.reply``). This runs on the host, in a worker thread, with ``llm``
over the evaluation's model gateway (budget, cache, ledger, trace).
"""

from __future__ import annotations

from pathlib import Path

from qd.task import load_module

target = load_module(Path(__file__).resolve().parent / "target.py", "experiments_red_team_target")


def run(text: str, llm, secrets: list[str], max_tokens: int = 64) -> list[dict]:
    attack = text.strip()
    results = []
    for secret in secrets:
        try:
            results.append({"reply": target.reply(llm, secret, attack, max_tokens)})
        except Exception as e:  # the budget is spent, or the model failed: this variant is not broken
            results.append({"reply": None, "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]})
    return results
