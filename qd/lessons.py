"""The lessons note: every ``memory.lessons_every`` commits, one ``meta``-role call phrases what
the run's own statistics say (which operators and instructions paid, the commonest failures).

The engine computes the statistics (``qd.memory.Tally``); the model only phrases them as a
short note, which every later LLM prompt shows (``operators.recall``). Like the instruction
pool's mutations (``operators.meta``), the call is made between commits, reserved against
``runner.max_llm_calls`` by the engine, ledgered under ``meta``, cached under its own
``sample_index`` stream (so a rerun from the cache replays it exactly) and stored as a
candidate row (``kind="lessons"``, the commit count in its metrics) with prompt, response and
cost; a resumed run reads its latest note and schedule back from that row.
"""

from __future__ import annotations

import asyncio
from typing import Any

from qd.contract import Candidate, CandidateLog, ChatClient, LLMError, sample_index
from qd.memory import LESSONS, ChildMemory

STREAM = 3  # the lessons note's ``sample_index`` stream (instruction mutations use 2)
_NOTE_CHARS = 400  # the note kept: about 100 tokens
_NOTE_TOKENS = 128  # the answer's cap
_INSTRUCTION_CHARS = 80
_PROMPT = """You advise a search that asks a model to improve {noun}s. Statistics of the search so far:

{stats}

Write a short lessons note (at most 3 sentences) for the model that writes the next {noun}s: \
what paid, what to avoid. Answer with the note only."""


class LessonsWriter:
    """Writes the lessons note into ``memory`` every ``every`` commits.

    Args:
        memory: the run's ``qd.memory.ChildMemory`` (its tally is read, its note set).
        log: the store's candidate log (instruction texts are read, the note's row written there).
        every: commits between two notes (> 0).
        model: the model that writes it (None: the client's pick).
        noun: what the genomes are called (``genomes.GenomeKind.noun``).
    """

    def __init__(self, memory: ChildMemory, log: CandidateLog, every: int, model: str | None, noun: str):
        self.memory, self.log, self.every, self.model, self.noun = memory, log, every, model, noun

    def due(self, batches: int) -> bool:
        return batches - self.memory.noted_at >= self.every

    def statistics(self) -> str:
        """The tally as the prompt shows it: per operator and instruction, children and archive
        entries per use; the commonest failures with their counts."""
        t = self.memory.tally
        lines = ["Operators (children made, entered the archive, entries per use):"]
        lines += [f"- {name}: {n}, {k}, {k / n:.2f}" for name, (n, k) in sorted(t.operators.items())]
        if t.instructions:
            rows = self.log.get(sorted(t.instructions))
            lines.append("Instructions (uses, entered the archive, entries per use):")
            for row in rows:
                n, k = t.instructions[int(row.id)]
                lines.append(f'- "{(row.text or "")[:_INSTRUCTION_CHARS]}": {n}, {k}, {k / n:.2f}')
        failures = t.common_failures(3)
        lines.append("Commonest failures:" if failures else "No failures so far.")
        lines += [f"- {count}x {reason}" for reason, count in failures]
        return "\n".join(lines)

    async def write(self, client: ChatClient, batches: int) -> dict[str, Any]:
        """One call; the note set in memory and stored as a row. Its ``lessons`` event.

        A failed call adds nothing (a client that is down stops the run at the next check);
        an empty answer is a row with the reason, and the previous note stays.
        """
        messages = [{"role": "user", "content": _PROMPT.format(noun=self.noun, stats=self.statistics())}]
        self.memory.noted(None, batches)  # before awaiting: no second call while this one runs
        try:
            c = await client.complete(
                messages,
                model=self.model,
                max_tokens=_NOTE_TOKENS,
                sample_index=sample_index(batches, 0, stream=STREAM),
                role="meta",
            )
        except LLMError as err:
            return {"error": str(err)}
        note = " ".join(c.text.split())[:_NOTE_CHARS] or None
        row = Candidate.logged(
            LESSONS,
            note,
            LESSONS,
            **c.provenance(messages),
            metrics={"batches": batches},
            error=None if note is not None else "lessons: empty answer",
        )
        await asyncio.to_thread(self.log.add, [row])
        self.memory.noted(note, batches)
        return {"id": row.id, "note": note}
