"""How a model's output on one row is scored: ``metric_of(name_or_callable, **options)``.

A metric maps ``(row, output)`` to a :class:`Verdict`: a score in [0, 1] (for the built-in
ones) and, optionally, feedback text that the next operator prompt shows beside the row.
The built-in metrics read the *final answer* of an output: the text after its last
``Answer:``, else its last non-empty line, so a solver may reason first.

- ``exact``: the final answer equals the expected one (case, spaces and end punctuation aside).
- ``contains``: the expected answer appears in the output (same normalisation).
- ``numeric``: the last number of the final answer is within ``tolerance`` of the expected number
  (``relative=True``: within ``tolerance`` times its size).
- ``regex``: the expected answer is a regular expression the output matches (``ignore_case``).
- ``choice``: multiple choice; the expected answer is a letter or an option's text, the row's
  ``options`` column (renamed by ``options=``) lists the options; the output may give either.
- a callable ``(row, output) -> float | dict``: ``row`` is the row's dict; a dict gives the score as
  ``score`` (or ``combined_score``) and may add ``feedback``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from qd.contract import ConfigError
from qd.data.rows import Row

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")
_LETTER = re.compile(r"(?<![A-Za-z])\(?([A-Z])\)?(?![A-Za-z])")


@dataclasses.dataclass(frozen=True)
class Verdict:
    score: float
    feedback: str | None = None


@dataclasses.dataclass(frozen=True)
class Metric:
    """A named scoring rule: ``metric(row, output) -> Verdict``."""

    name: str
    judge: Callable[[Row, str], Verdict]

    def __call__(self, row: Row, output: str) -> Verdict:
        return self.judge(row, output)


def final_answer(output: str) -> str:
    """The part of ``output`` that is its answer: after the last ``Answer:``, else its last line."""
    text = str(output or "")
    at = text.lower().rfind("answer:")
    if at >= 0:
        return text[at + len("answer:") :].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _norm(text: Any) -> str:
    return " ".join(str(text).split()).strip(string.punctuation + " ").casefold()


def _exact(row: Row, output: str) -> Verdict:
    return Verdict(float(_norm(final_answer(output)) == _norm(row.answer)))


def _contains(row: Row, output: str) -> Verdict:
    return Verdict(float(_norm(row.answer) in _norm(output)))


def _number(text: Any) -> float | None:
    found = _NUMBER.findall(str(text))
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:
        return None


def _numeric(tolerance: float = 1e-6, relative: bool = False) -> Callable[[Row, str], Verdict]:
    def judge(row: Row, output: str) -> Verdict:
        expected = _number(row.answer)
        said = _number(final_answer(output))
        said = _number(output) if said is None else said
        if expected is None or said is None:
            return Verdict(0.0, None if said is not None else "no number in the output")
        allowed = tolerance * max(abs(expected), 1e-12) if relative else tolerance
        return Verdict(float(abs(said - expected) <= allowed))

    return judge


def _regex(ignore_case: bool = True) -> Callable[[Row, str], Verdict]:
    flags = re.IGNORECASE if ignore_case else 0
    return lambda row, output: Verdict(float(re.search(str(row.answer), str(output), flags) is not None))


def _choice(options: str = "options") -> Callable[[Row, str], Verdict]:
    def judge(row: Row, output: str) -> Verdict:
        listed = [str(o) for o in row.fields.get(options) or []]
        letters = string.ascii_uppercase[: len(listed)] if listed else string.ascii_uppercase
        expected = _letter_of(str(row.answer), listed, letters)
        said = _letter_of(final_answer(output), listed, letters) or _letter_of(str(output), listed, letters)
        return Verdict(float(expected is not None and said == expected))

    return judge


def _letter_of(text: str, listed: list[str], letters: str) -> str | None:
    """The option ``text`` picks: an option's text (alone in it), else its last standalone letter."""
    named = [letters[i] for i, option in enumerate(listed) if _norm(option) and _norm(option) in _norm(text)]
    if len(named) == 1:
        return named[0]
    found = [m for m in _LETTER.findall(text) if m in letters]
    return found[-1] if found else None


BUILTIN: dict[str, Callable[..., Callable[[Row, str], Verdict]]] = {
    "exact": lambda: _exact,
    "contains": lambda: _contains,
    "numeric": _numeric,
    "regex": _regex,
    "choice": _choice,
}


def metric_of(metric: Any, **options: Any) -> Metric:
    """The metric ``metric`` names (with its ``options``), or a user's callable made one."""
    if isinstance(metric, Metric) and not options:
        return metric
    if isinstance(metric, str):
        make = BUILTIN.get(metric)
        if make is None:
            raise ConfigError(
                "metric",
                f"unknown metric {metric!r}",
                f"use one of {sorted(BUILTIN)}, or a callable (row, output) -> float | dict",
            )
        takes = list(inspect.signature(make).parameters)
        unknown = [k for k in options if k not in takes]
        if unknown:
            offer = f"its options: {takes}" if takes else "it takes none"
            raise ConfigError("metric", f"{metric} has no option {unknown[0]!r}", offer)
        return Metric(metric, make(**options))
    if callable(metric) and not options:
        return Metric(getattr(metric, "__name__", "callable"), _calling(metric))
    raise ConfigError(
        "metric",
        f"a {type(metric).__name__} is not a metric" + (" (options go to a named metric)" if options else ""),
        f"use one of {sorted(BUILTIN)}, or a callable (row, output) -> float | dict",
    )


def _calling(fn: Callable[[Mapping, str], Any]) -> Callable[[Row, str], Verdict]:
    """A user's ``fn(row_dict, output)``, its number or dict read as a Verdict."""

    def judge(row: Row, output: str) -> Verdict:
        value = fn(dict(row.fields), output)
        feedback = None
        if isinstance(value, Mapping):
            feedback = value.get("feedback")
            value = value.get("score", value.get("combined_score"))
        if isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value):
            return Verdict(float(value), None if feedback is None else str(feedback))
        raise ValueError(
            f"metric {getattr(fn, '__name__', 'callable')}: returned {value!r} "
            "(return a finite number, or a dict with 'score' and optional 'feedback')"
        )

    return judge
