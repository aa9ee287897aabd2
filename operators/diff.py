"""SEARCH/REPLACE edits: parsing them from an answer and applying them tolerantly.

Weak models copy the SEARCH text imperfectly (OpenEvolve #241, #346), so a block
is located in three passes, first hit wins:

1. exact substring; if it occurs several times, the *first* occurrence (in an
   allowed region) is edited: the texts are identical, models quote the first,
   and refusing would waste an answer that is otherwise usable;
2. line by line ignoring indentation and runs of spaces; the replacement is
   re-indented by the difference between the matched and the quoted indentation;
3. fuzzy: the window of as many lines with the best ``difflib`` ratio, if it
   reaches ``threshold`` (0.8) and no other window scores the same (a tie is
   ambiguous, and a wrong guess would edit the wrong place).

Blocks apply in order, each to the text the previous ones produced.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence

_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$", re.IGNORECASE)
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$", re.IGNORECASE)


class DiffError(Exception):
    """A diff that cannot be applied; ``reason`` names the block and why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclasses.dataclass(frozen=True)
class DiffBlock:
    """One edit: ``search`` (text quoted from the program) becomes ``replace``."""

    search: str
    replace: str


def parse_diff(answer: str) -> list[DiffBlock]:
    """The SEARCH/REPLACE blocks in an answer (text around them is ignored).

    Markers tolerate 5-9 ``<``/``=``/``>`` characters, missing or extra spaces
    and any case.

    Raises:
        DiffError: no block, or a block that is not closed (answer truncated?).
    """
    blocks: list[DiffBlock] = []
    lines = answer.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        number = len(blocks) + 1
        divider = next((j for j in range(i + 1, len(lines)) if _DIVIDER.match(lines[j])), None)
        end = None
        if divider is not None:
            end = next((j for j in range(divider + 1, len(lines)) if _REPLACE.match(lines[j])), None)
        if divider is None or end is None:
            missing = "=======" if divider is None else ">>>>>>> REPLACE"
            raise DiffError(f"block {number}: no {missing} line after its SEARCH (answer truncated?)")
        blocks.append(DiffBlock("".join(lines[i + 1 : divider]), "".join(lines[divider + 1 : end])))
        i = end + 1
    if not blocks:
        raise DiffError("no SEARCH/REPLACE blocks in the answer")
    return blocks


def apply_diff(
    text: str,
    blocks: Sequence[DiffBlock],
    allowed_regions: Sequence[tuple[int, int]] | None = None,
    threshold: float = 0.8,
) -> str:
    """Applies the blocks in order.

    Args:
        allowed_regions: character ranges ``[start, end)`` of ``text`` that may
            change (the EVOLVE-BLOCK regions, ``Layout.spans()``); None: all of it.
            A SEARCH must lie inside one of them.
        threshold: minimum ``difflib`` ratio for a fuzzy match.
    Raises:
        DiffError: naming the block (``block 2 of 3``) and why it failed.
    """
    regions = [(0, len(text))] if allowed_regions is None else list(allowed_regions)
    for number, block in enumerate(blocks, 1):
        try:
            start, end, replacement = _locate(text, block, regions, threshold)
        except DiffError as err:
            raise DiffError(f"block {number} of {len(blocks)}: {err.reason}") from None
        delta = len(replacement) - (end - start)
        text = text[:start] + replacement + text[end:]
        regions = [(a if a <= start else a + delta, b + delta if b >= end else b) for a, b in regions]
    return text


def _inside(regions: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(a <= start and end <= b for a, b in regions)


def _occurrences(text: str, part: str) -> list[int]:
    """Start of every occurrence of ``part``, overlapping ones included."""
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


def _norm(line: str) -> str:
    return " ".join(line.split())


def _locate(
    text: str, block: DiffBlock, regions: list[tuple[int, int]], threshold: float
) -> tuple[int, int, str]:
    """``(start, end, replacement)`` for one block, or DiffError with the reason."""
    if not block.search.strip():
        raise DiffError("empty SEARCH (quote the lines to change)")
    # a SEARCH is whole lines: a hit inside a line (indentation dropped) is left to pass 2, which re-indents
    hits = [h for h in _occurrences(text, block.search) if h == 0 or text[h - 1] == "\n"]
    if hits:
        inside = [h for h in hits if _inside(regions, h, h + len(block.search))]
        if not inside:
            raise DiffError("SEARCH text is in the frozen code outside the EVOLVE-BLOCK regions")
        return inside[0], inside[0] + len(block.search), block.replace

    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    search = block.search.splitlines()
    while search and not search[0].strip():
        search.pop(0)
    while search and not search[-1].strip():
        search.pop()
    n = len(search)
    windows = range(len(lines) - n + 1)

    wanted = [_norm(line) for line in search]
    normalized = [_norm(line) for line in lines]
    exact = [s for s in windows if normalized[s : s + n] == wanted]
    if exact:
        inside = [s for s in exact if _inside(regions, offsets[s], offsets[s + n])]
        if not inside:
            raise DiffError(
                "SEARCH text (ignoring whitespace) is in the frozen code outside the EVOLVE-BLOCK regions"
            )
        s = inside[0]
        return offsets[s], offsets[s + n], _shifted(block.replace, search, lines[s : s + n])

    target = "\n".join(wanted)
    scored: list[tuple[float, int]] = []
    for s in windows:
        matcher = difflib.SequenceMatcher(None, "\n".join(normalized[s : s + n]), target, autojunk=False)
        if matcher.real_quick_ratio() >= threshold and matcher.quick_ratio() >= threshold:
            scored.append((matcher.ratio(), s))
    best = max((r for r, _ in scored), default=0.0)
    preview = search[0].strip()[:60]
    if best < threshold:
        raise DiffError(
            f"SEARCH text not found (first line {preview!r}; "
            f"no {n}-line window matches {threshold:.0%} or better)"
        )
    top = [s for r, s in scored if r == best]
    inside = [s for s in top if _inside(regions, offsets[s], offsets[s + n])]
    if not inside:
        raise DiffError(
            f"SEARCH text best matches frozen code outside the EVOLVE-BLOCK regions (line {top[0] + 1})"
        )
    if len(top) > 1:
        places = ", ".join(str(s + 1) for s in top[:5])
        raise DiffError(f"SEARCH text matches several places equally well (lines {places}; ratio {best:.2f})")
    s = inside[0]
    return offsets[s], offsets[s + n], _shifted(block.replace, search, lines[s : s + n])


def _indent(lines: Sequence[str]) -> str:
    first = next((line for line in lines if line.strip()), "")
    return first[: len(first) - len(first.lstrip())]


def _shifted(replace: str, quoted: list[str], matched: list[str]) -> str:
    """The replacement moved by (matched indentation - quoted indentation), keeping the matched
    line ending."""
    have, want = _indent(quoted), _indent(matched)
    shift = len(want) - len(have)
    out = []
    for line in replace.splitlines(keepends=True):
        if line.strip() and shift > 0:
            line = (want[0] * shift) + line
        elif line.strip() and shift < 0:
            lead = len(line) - len(line.lstrip())
            line = line[min(lead, -shift) :]
        out.append(line)
    result = "".join(out)
    if result and not result.endswith("\n") and matched[-1].endswith("\n"):
        result += "\n"
    return result
