"""Promptbreeder material: the hand-written starting task-prompts and the fixed solver.

A task-prompt is the system message given to a fixed solver model before each
problem (``qd.reasoning.problems``). Every prompt is one line and short: the
solver is a 2,048-token model.
"""

from __future__ import annotations

SEED_PROMPTS: list[str] = [
    "Solve the problem. Give only the final answer.",
    "Let's think step by step, then write 'Answer:' and the answer.",
    "Work through the problem carefully, one fact at a time. End with a line 'Answer: <answer>'.",
    "First list the given facts, then compute or deduce the result. Finish with 'Answer: <answer>'.",
    "You are a precise puzzle solver. Check every step before answering. Write 'Answer:' then the answer.",
    "Answer in exactly the format the question asks for, on one line starting with 'Answer:'.",
]


def solve(prompt: str, problem, llm, max_tokens: int = 160) -> str:
    """The fixed solver: one call, the task-prompt as the system message, the question as the user message.

    ``problem`` is a Problem (or a question string). Exceptions from ``llm`` propagate.
    """
    question = getattr(problem, "question", problem)
    messages = [{"role": "system", "content": prompt}, {"role": "user", "content": question}]
    text = llm(messages, temperature=0.0, max_tokens=max_tokens)
    return "" if text is None else str(text)
