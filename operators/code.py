"""Turning an LLM answer into a child of a program: its EVOLVE-BLOCK regions (the code block and
its syntax are read by ``genomes.answers``).

A program may mark the parts evolution may change with lines containing
``EVOLVE-BLOCK-START`` and ``EVOLVE-BLOCK-END`` (usually comments). Everything
outside those regions (the marker lines included) is frozen: children always
carry the parent's frozen lines byte for byte, whatever the model answered.
A program without markers is evolvable as a whole.
"""

from __future__ import annotations

import dataclasses
import textwrap

from genomes.answers import MalformedAnswer

START, END = "EVOLVE-BLOCK-START", "EVOLVE-BLOCK-END"


class MarkerError(ValueError):
    """Unbalanced or nested EVOLVE-BLOCK markers in a parent: a bug in the task's seed program."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A program cut at its markers: ``frozen[0] + evolvable[0] + frozen[1] + ... + frozen[n]``.

    Frozen chunks include the marker lines; an unmarked program is one evolvable
    region between two empty frozen chunks (``marked`` is False).
    """

    frozen: tuple[str, ...]
    evolvable: tuple[str, ...]
    marked: bool

    def join(self, evolvable: list[str] | tuple[str, ...]) -> str:
        """The program with new region contents (each ends with a newline if non-empty)."""
        if len(evolvable) != len(self.evolvable):
            raise ValueError(f"{len(evolvable)} regions given, the program has {len(self.evolvable)}")
        parts = [self.frozen[0]]
        for region, frozen in zip(evolvable, self.frozen[1:]):
            if self.marked and region and not region.endswith("\n"):
                region += "\n"
            parts += [region, frozen]
        return "".join(parts)

    def spans(self) -> list[tuple[int, int]]:
        """Character ranges ``[start, end)`` of the evolvable regions in the program."""
        spans, pos = [], 0
        for frozen, region in zip(self.frozen, self.evolvable):
            pos += len(frozen)
            spans.append((pos, pos + len(region)))
            pos += len(region)
        return spans


def layout(text: str) -> Layout:
    """Splits a program at its EVOLVE-BLOCK markers.

    Raises:
        MarkerError: a START inside a region, an END without START, a region
            never closed, or both markers on one line (with the line number).
    """
    frozen: list[str] = []
    evolvable: list[str] = []
    chunk: list[str] = []
    inside, opened = False, 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        is_start, is_end = START in line, END in line
        if is_start and is_end:
            raise MarkerError(f"line {number}: {START} and {END} on one line")
        if is_start and inside:
            raise MarkerError(f"line {number}: nested {START} (the region opened before is not closed)")
        if is_end and not inside:
            raise MarkerError(f"line {number}: {END} without a {START} before it")
        if is_end:
            evolvable.append("".join(chunk))
            chunk, inside = [line], False
        else:
            chunk.append(line)
            if is_start:
                frozen.append("".join(chunk))
                chunk, inside, opened = [], True, number
    if inside:
        raise MarkerError(f"line {opened}: {START} is never closed by an {END}")
    if not evolvable:
        return Layout(("", ""), (text,), marked=False)
    return Layout(tuple(frozen) + ("".join(chunk),), tuple(evolvable), marked=True)


def evolvable_regions(text: str) -> list[str]:
    """The text the operators may change (the whole program when it has no markers)."""
    return list(layout(text).evolvable)


def rebuild(parent: str, answer: str) -> str:
    """The child: the parent's frozen code around the regions taken from ``answer``.

    ``answer`` may be the whole program with its markers (regions are taken by
    position; edits to frozen code are dropped), the whole program without
    markers (regions are the gaps between the parent's frozen chunks, found in
    order, compared line by line ignoring whitespace), or, for a one-region
    parent, just the region's new content. Region content is re-indented to the
    parent region's indentation when the model changed it.

    Raises:
        MalformedAnswer: the regions cannot be told apart from frozen code.
        MarkerError: the parent's markers are broken.
    """
    frame = layout(parent)
    if not frame.marked:
        return answer
    try:
        given = layout(answer)
    except MarkerError as err:
        raise MalformedAnswer(f"answer has broken EVOLVE-BLOCK markers: {err}") from None
    n = len(frame.evolvable)
    if given.marked:
        if len(given.evolvable) != n:
            raise MalformedAnswer(
                f"answer has {len(given.evolvable)} EVOLVE-BLOCK regions, the parent has {n}"
            )
        regions = list(given.evolvable)
    else:
        regions = _regions_between_frozen(frame, answer)
    return frame.join(
        [_reindent(new, old, fr) for new, old, fr in zip(regions, frame.evolvable, frame.frozen)]
    )


def _norm(line: str) -> str:
    return " ".join(line.split())


def _regions_between_frozen(frame: Layout, answer: str) -> list[str]:
    """Regions of an answer without markers, located by the parent's frozen code."""
    lines = answer.splitlines(keepends=True)
    keyed = [(i, _norm(line)) for i, line in enumerate(lines) if line.strip()]
    chunks = [
        [_norm(line) for line in f.splitlines() if line.strip() and START not in line and END not in line]
        for f in frame.frozen
    ]
    frozen_lines = [line for chunk in chunks for line in chunk]
    if not frozen_lines:  # nothing frozen but the markers themselves
        if len(frame.evolvable) == 1:
            return [answer]
        raise MalformedAnswer(
            f"answer has no EVOLVE-BLOCK markers, the parent has {len(frame.evolvable)} regions"
        )
    bounds: list[tuple[int, int]] = []  # per frozen chunk: [first line, end line) in the answer
    k = 0
    for index, chunk in enumerate(chunks):
        if not chunk:
            if 0 < index < len(chunks) - 1:
                break  # two regions with nothing between them: cannot be told apart
            at = 0 if index == 0 else len(lines)
            bounds.append((at, at))
            continue
        starts = range(k, len(keyed) - len(chunk) + 1)
        hit = next((s for s in starts if [t for _, t in keyed[s : s + len(chunk)]] == chunk), None)
        if hit is None:
            break
        bounds.append((keyed[hit][0], keyed[hit + len(chunk) - 1][0] + 1))
        k = hit + len(chunk)
    if len(bounds) == len(chunks):
        return ["".join(lines[a:b]) for (_, a), (b, _) in zip(bounds, bounds[1:])]
    seen = {t for _, t in keyed}
    if len(frame.evolvable) == 1 and sum(line in seen for line in frozen_lines) * 2 < len(frozen_lines):
        return [answer]  # the answer is the region's new content
    raise MalformedAnswer(
        "answer changes the frozen code outside the EVOLVE-BLOCK and has no markers to recover the regions"
    )


def _indent_of(text: str) -> str | None:
    widths = [line[: len(line) - len(line.lstrip())] for line in text.splitlines() if line.strip()]
    return min(widths, key=len) if widths else None


def _reindent(new: str, old: str, frozen_before: str) -> str:
    """``new`` shifted to the parent region's indentation (or its START marker's)."""
    marker = frozen_before.splitlines()[-1] if frozen_before else ""
    target = _indent_of(old)
    if target is None:
        target = marker[: len(marker) - len(marker.lstrip())]
    current = _indent_of(new)
    if current is None or current == target:
        return new
    return textwrap.indent(textwrap.dedent(new), target)
