"""The run-memory block of an LLM prompt: the parents' recent children with their fates, and the
run's lessons note (``qd.contract.RunMemory``, read through ``PromptContext.memory``).

One compact line per child, newest first (``- child #812 (rewrite): failed: NameError: ...``,
``- child #790 (diff): scored -3.1 vs parent -2.0 (worse)``), then the note. The whole block is
capped at ``max_tokens`` tokens (estimated as characters / 4, as the client's ledger does for a
server that reports none): the oldest lines go first, then the note is clipped, so a prompt
sized for a 2,048-token context still fits with the block in it.
"""

from __future__ import annotations

from qd.contract import Attempt, Parent, RunMemory

CHARS_PER_TOKEN = 4
_MOST = 8  # children asked per parent (the memory keeps ``memory.children`` of them)
_REASON_CHARS = 100  # of a failure's reason, per line


def memory_block(memory: RunMemory | None, parents: list[Parent], max_tokens: int, noun: str) -> str:
    """The block for a prompt: "" without memory, or lines ending in a newline, within ``max_tokens``."""
    if memory is None or max_tokens <= 0:
        return ""
    lines = [attempt_line(a) for p in parents for a in memory.children(p.id, _MOST)]
    note = " ".join((memory.lessons() or "").split())
    head = f"Recent children of this {noun} and what became of them:"
    budget = max_tokens * CHARS_PER_TOKEN
    while lines and len("\n".join([head, *lines])) > budget:
        lines.pop()  # the oldest first
    out = "\n".join([head, *lines]) if lines else ""
    if note:
        room = budget - len(out) - len("\nLessons from this run: ")
        if room >= 20:
            text = note if len(note) <= room else note[: room - 3] + "..."
            out = "\n".join(filter(None, [out, f"Lessons from this run: {text}"]))
    return out + "\n" if out else ""


def attempt_line(a: Attempt) -> str:
    """One child: its id, operator and fate (the reason, or its score against its parent's)."""
    if a.fate in ("failed", "rejected", "duplicate") or (a.fate == "trial" and a.reason):
        reason = " ".join((a.reason or "no reason given").split())
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 4] + " ..."
        what = f"{a.fate}: {reason}"
    else:
        parent = "none" if a.parent_fitness is None else f"{a.parent_fitness:.4g}"
        what = f"scored {a.fitness:.4g} vs parent {parent} ({a.fate})"
    return f"- child #{a.id} ({a.operator}): {what}"
