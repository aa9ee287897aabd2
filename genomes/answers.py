"""Reading a genome out of an LLM answer: the fenced block that holds it, and whether Python compiles.

A genome kind (``genomes.kind``) parses answers with these, and the LLM operators
(``operators``) reject a child with :class:`MalformedAnswer`; both import this
module and it imports neither, so the plug-ins form no circle.
"""

from __future__ import annotations

import re
import warnings

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
_ALIASES = {"python": {"python", "py", "python3", "py3"}}


class MalformedAnswer(Exception):
    """An LLM answer that cannot become a child; ``reason`` is one line for the store."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def extract_code(response: str, language: str = "python") -> str:
    """The program in a markdown-fenced answer.

    Candidates are blocks tagged with the language (``python``, ``py``, ...);
    untagged blocks count only when no block is tagged, and blocks in other
    languages (shell commands, sample output) never do. Of the candidates, the
    *last one at least half as long as the longest* wins: models often follow
    the program with a short usage snippet (too short to win) or show the old
    program before the new one (the later, comparable one wins).

    An answer cut off inside a Python block (small models often ramble on until
    ``max_tokens``) is salvaged: its longest prefix of whole lines that compiles
    becomes the program, if there is one. The stored response shows what was cut.

    Raises:
        MalformedAnswer: no candidate block, an empty one, or a candidate fence
            that never closes and has no compiling prefix.
    """
    accepted = _ALIASES.get(language, {language})
    tagged: list[str] = []
    untagged: list[str] = []
    lines = response.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent, info = opening["fence"], opening["indent"], opening["info"].lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            if info in accepted or (not info and not tagged):
                rest = salvage("\n".join(lines[i + 1 :])) if language == "python" else None
                if rest is None:
                    raise MalformedAnswer("unterminated code block (answer truncated?)")
                (tagged if info else untagged).append(rest)
            break
        body = [line[min(len(indent), len(line) - len(line.lstrip())) :] for line in lines[i + 1 : end]]
        if info in accepted:
            tagged.append("\n".join(body))
        elif not info:
            untagged.append("\n".join(body))
        i = end + 1
    blocks = tagged or untagged
    if not blocks:
        raise MalformedAnswer("no code block")
    longest = max(len(b.strip()) for b in blocks)
    if longest == 0:
        raise MalformedAnswer("empty code block")
    code = [b for b in blocks if len(b.strip()) * 2 >= longest][-1]
    return code.strip("\n") + "\n"


def _compile(code: str) -> None:
    """Compiles without printing the SyntaxWarnings a model's odd code triggers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(code, "<child>", "exec")


def salvage(code: str) -> str | None:
    """The longest prefix of whole lines of ``code`` that compiles, or None if none does."""
    lines = code.splitlines(keepends=True)
    for n in range(len(lines), 0, -1):
        prefix = "".join(lines[:n])
        if not prefix.strip():
            break
        try:
            _compile(prefix)
        except (SyntaxError, ValueError):
            continue
        return prefix
    return None


def check_syntax(code: str) -> None:
    """Rejects Python that does not compile, before it costs an evaluation."""
    try:
        _compile(code)
    except SyntaxError as err:
        raise MalformedAnswer(f"syntax error line {err.lineno}: {err.msg}") from None
    except ValueError as err:  # e.g. null bytes
        raise MalformedAnswer(f"syntax error: {err}") from None
