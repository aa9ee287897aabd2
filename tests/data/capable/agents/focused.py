"""Focused: one careful call that names the method, then reads its last 'Answer:' line."""

import re

METHOD = (
    "Solve this exactly. For a word problem, compute each step in order; for a puzzle, test every "
    "assignment of roles against every statement."
)


def final_answer(text):
    found = re.findall(r"Answer\s*[:=]\s*(.+)", str(text), re.I)
    return found[-1].strip() if found else str(text).strip()


def forward(task, llm):
    try:
        return final_answer(llm(f"{METHOD}\n{task}\nEnd with 'Answer: <final answer>'.", max_tokens=96))
    except Exception:
        return ""
