"""Three views answer alone; the majority answer wins."""

import re
from collections import Counter

VIEWS = ("Write it as equations.", "Try every case.", "Compute exactly, then sanity-check.")


def final_answer(text):
    found = re.findall(r"Answer\s*[:=]\s*(.+)", str(text), re.I)
    return found[-1].strip() if found else str(text).strip()


def forward(task, llm):
    answers = []
    for view in VIEWS:
        try:
            answers.append(final_answer(llm(f"{view}\n{task}\nEnd with 'Answer: ...'.", max_tokens=96)))
        except Exception:
            break  # the budget is spent: vote over the answers given
    return Counter(answers).most_common(1)[0][0] if answers else ""
