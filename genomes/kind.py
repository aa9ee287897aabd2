"""What a genome kind is: how operators ask for one, read it from an answer and check it.

The engine does not branch on kinds beyond "vector or text": a text genome is a
string, and its kind tells the LLM operators (``operators.llm``) what to call it
in prompts, which system prompt and templates to use, which fenced block of an
answer holds it, and how to check it before it costs an evaluation. The kind is
stored with every candidate (the store's ``genome`` column).

Two families, told apart by ``code``:

- code kinds (``program``, ``agent``): Python, run only in the sandbox; EVOLVE-BLOCK
  regions, SEARCH/REPLACE diffs and syntax checks apply.
- data kinds (``prompt``, ``team``, ``text``): parsed with safe loaders (plain text,
  ``json``) and used by trusted host code, never executed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from genomes.answers import MalformedAnswer, check_syntax, extract_code

PROMPTS = Path(__file__).parent / "prompts"
_LABEL = re.compile(
    r"^\s*(?:here is |here's )?(?:the |an? )?(?:new |improved |better )?"
    r"(?:prompt|instruction|text|answer)\s*:\s*",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True)
class GenomeKind:
    """One kind of text genome.

    Attributes:
        name: what the store records (``program``, ``agent``, ``prompt``, ...).
        noun: what prompts call one (``"Current $noun"``, ``"Answer with the complete $noun"``).
        language: the fence tag of the block an answer must hold (``python``, ``text``, ``json``).
        code: Python run in the sandbox (True) or data used by host code (False).
        templates: template name -> file, replacing ``operators/prompts/<name>.txt`` for
            this kind (usually just ``system``); a run's ``operators.mix[i].templates`` wins.
        validate: ``text -> None`` or a one-line reason the genome is unusable, checked
            after parsing (a syntax check comes first for code kinds).
        bare: an answer with no fenced block at all is taken whole (stripped of a
            leading ``Prompt:`` label): small models seldom fence a one-line prompt.
        max_chars: longer genomes are refused (a rambling answer would cost an evaluation).
    """

    name: str
    noun: str
    language: str
    code: bool = False
    templates: Mapping[str, str] = dataclasses.field(default_factory=dict)
    validate: Callable[[str], str | None] | None = None
    bare: bool = False
    max_chars: int = 20_000

    def parse(self, answer: str) -> str:
        """The genome in a model's answer, checked.

        Raises:
            MalformedAnswer: no block (and not ``bare``), an empty or oversized one,
                a syntax error (code kinds) or the kind's own validation reason.
        """

        if not answer.strip():
            raise MalformedAnswer("empty answer")
        try:
            genome = extract_code(answer, self.language)
        except MalformedAnswer as err:
            if not (self.bare and err.reason == "no code block"):
                raise
            genome = _LABEL.sub("", answer.strip(), count=1).strip() + "\n"
        return self.check(genome)

    def check(self, genome: str) -> str:
        """``genome`` if it is usable as this kind (see :meth:`parse`), else MalformedAnswer."""

        if not genome.strip():
            raise MalformedAnswer(f"empty {self.noun}")
        if len(genome) > self.max_chars:
            raise MalformedAnswer(f"{self.noun} has {len(genome)} characters (at most {self.max_chars})")
        if self.code and self.language == "python":
            check_syntax(genome)
        problem = self.validate(genome) if self.validate is not None else None
        if problem:
            raise MalformedAnswer(" ".join(str(problem).split())[:300])
        return genome
