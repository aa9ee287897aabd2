"""The host side of a text's evaluation: the quality judge reads it and answers one digit.

A text is data: never executed, only shown to the judge (``judges.QUALITY``, the
run's model) through the evaluation's gateway ``llm`` (budget, cache, ledger,
trace). The score is the expected digit under the judge's top logprobs at the
answer token (``descriptors.ai_feedback.parse_score``), divided by 9.
"""

from __future__ import annotations

from pathlib import Path

from descriptors.ai_feedback import parse_score
from qd.task import load_module

judges = load_module(Path(__file__).resolve().parent / "judges.py", "experiments_creative_writing_judges")
JUDGE = judges.judge(judges.QUALITY)


def problem(text: str, max_chars: int) -> str | None:
    """Why ``text`` cannot be judged (empty, whitespace only, too long), or None."""
    if not text.strip():
        return "empty text (write a poem or a story)"
    if len(text.strip()) > max_chars:
        return f"text has {len(text.strip())} characters (at most {max_chars}); write a shorter piece"
    return None


def run(text: str, llm, max_chars: int = 600) -> dict:
    why = problem(text, max_chars)
    if why:
        return {"error": why}
    try:
        answer = llm(
            JUDGE.messages(judges.QUALITY, text.strip()),
            temperature=JUDGE.temperature,
            max_tokens=JUDGE.max_tokens,
            top_logprobs=JUDGE.top_logprobs,
        )
    except Exception as e:  # the budget is spent, or the model failed: no score
        return {"error": " ".join(f"quality judge: {type(e).__name__}: {e}".split())[:300]}
    score = parse_score(answer["text"], answer["top_logprobs"], JUDGE.scale)
    if score is None:
        return {"error": f"quality judge answered {answer['text'][:40]!r}, not one digit 0-{JUDGE.scale}"}
    return {"quality": score / JUDGE.scale, "answer": answer["text"]}
