"""LLM variation operators: rewrite, diff (SEARCH/REPLACE), crossover, inspiration.

An operator renders a short prompt from file templates (``operators/prompts/``,
overridable per template), asks the client once, and turns the answer into a
child. An unusable answer is still a child, with ``text=None`` and the reason in
``error``, so the store records what the model said and the loop moves on; a
failed call (``qd.llm.LLMError``) propagates, and the caller stores the child as
failed (``Child.unanswered``). Children keep the
parent's code outside its EVOLVE-BLOCK regions byte for byte (``operators.code``).

Prompts are sized for the default embedded model (2,048-token context): the
parent's code is shown whole (a diff must quote it), everything else is clipped.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from operators.code import MalformedAnswer, check_syntax, extract_code, layout, rebuild
from operators.diff import DiffError, apply_diff, parse_diff
from qd.contract import ChatClient, Child, ConfigError, LLMError, Parent, PromptContext

PROMPTS = Path(__file__).parent / "prompts"
_FEEDBACK_CHARS = 600  # evaluator feedback shown: head and tail (tracebacks end with the cause)
_METRICS_CHARS = 200
_INSPIRATION_CHARS = 1200  # per inspiration's code

# template name -> (placeholders it must use, placeholders it may use). ``$instruction`` is
# "" or one line ending in a newline (``Instruction: ...\n``): put it at the start of a line.
_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "system": (set(), {"language"}),
    "program": ({"code"}, {"label", "score", "metrics", "feedback", "language", "code"}),
    "rewrite": ({"parent"}, {"task", "language", "parent", "rules", "instruction"}),
    "diff": ({"parent"}, {"task", "language", "parent", "rules", "instruction"}),
    "crossover": ({"parents"}, {"task", "language", "parents", "rules", "instruction"}),
    "inspiration": ({"parent", "inspirations"}, {"task", "language", "parent", "inspirations", "rules", "instruction"}),
}
_SHAPES = {"rewrite": 1, "diff": 1, "crossover": 2, "inspiration": 1}  # operator -> parents per child
_RULES = (
    "Change only the code between the EVOLVE-BLOCK-START and EVOLVE-BLOCK-END lines; "
    "keep the rest exactly as it is."
)


def load_templates(
    overrides: dict[str, str] | None = None,
    fields: dict[str, tuple[set[str], set[str]]] = _FIELDS,
) -> dict[str, Template]:
    """All prompt templates named in ``fields``, the defaults replaced by ``overrides`` (name -> file path).

    Raises:
        ConfigError: ``templates.<name>: ...`` for an unknown template name, an
            unreadable file, a malformed or unknown ``$placeholder``, or a
            missing one the prompt needs (e.g. a rewrite template without ``$parent``).
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"templates.{unknown[0]}", "unknown template", f"use one of {sorted(fields)}")
    templates = {}
    for name, (required, allowed) in fields.items():
        path = Path(overrides.get(name) or PROMPTS / f"{name}.txt")
        try:
            template = Template(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or err
            raise ConfigError(f"templates.{name}", f"cannot read {path}", str(why)) from None
        if not template.is_valid():
            raise ConfigError(f"templates.{name}", f"malformed placeholder in {path}", "write $$ for a literal $")
        used = set(template.get_identifiers())
        if used - allowed:
            raise ConfigError(f"templates.{name}", f"unknown placeholder ${sorted(used - allowed)[0]} in {path}",
                              f"use {', '.join('$' + f for f in sorted(allowed))}")
        if required - used:
            missing = sorted(required - used)[0]
            raise ConfigError(f"templates.{name}", f"missing placeholder ${missing} in {path}", "the prompt needs it")
        templates[name] = template
    return templates


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class LLMOperator:
    """``await op(parents, inspirations, context)`` -> 1 child (2 when a diff falls back to a rewrite)."""

    name: str
    num_parents: int
    num_inspirations: int
    client: ChatClient = dataclasses.field(repr=False)
    templates: dict[str, Template] = dataclasses.field(repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    fallback_to_rewrite: bool = True

    async def __call__(self, parents: list[Parent], inspirations: list[Parent], context: PromptContext) -> list[Child]:
        if len(parents) != self.num_parents:
            raise ValueError(f"{self.name}: needs {self.num_parents} parent(s), got {len(parents)}")
        model = context.model
        if model is None and context.rng is not None:
            model = self.client.pick_model(context.rng)
        first = parents[0]
        if self.name == "diff":
            child = await self._ask("diff", self._prompt("diff", parents, [], context), model, context,
                                    lambda answer: self._diffed(first, answer, context.language))
            if child.text is None and self.fallback_to_rewrite:
                try:
                    return [child, await self._rewrite("diff>rewrite", first, context, model)]
                except LLMError as err:  # the diff's answer is paid for: keep it
                    return [child, Child.unanswered("diff>rewrite", str(err))]
            return [child]
        if self.name == "rewrite":
            return [await self._rewrite("rewrite", first, context, model)]
        shown = inspirations[: self.num_inspirations]
        messages = self._prompt(self.name, parents, shown, context)
        # Crossover keeps parent A's frozen code: the parents of one run share it anyway.
        return [await self._ask(self.name, messages, model, context,
                                lambda answer: self._program(first.text, answer, parents, context.language))]

    async def _rewrite(self, operator: str, parent: Parent, context: PromptContext, model: str | None) -> Child:
        return await self._ask(operator, self._prompt("rewrite", [parent], [], context), model, context,
                               lambda answer: self._program(parent.text, answer, [parent], context.language))

    async def _ask(self, operator: str, messages: list[dict], model: str | None, context: PromptContext,
                   parse: Callable[[str], str]) -> Child:
        """One call; the answer parsed into a child, or the reason it could not be."""
        c = await self.client.complete(messages, model=model, temperature=self.temperature,
                                       max_tokens=self.max_tokens, sample_index=context.sample_index)
        text, error = None, None
        try:
            text = parse(c.text)
        except (MalformedAnswer, DiffError) as err:
            reason = err.reason
            if c.finish_reason == "length" and "truncated" not in reason:
                reason += " (answer cut at max_tokens)"
            error = f"{operator}: {reason}"
        return Child(text=text, error=error, operator=operator, model=c.model,
                     prompt=json.dumps(messages, ensure_ascii=False), response=c.text,
                     tokens_in=c.tokens_in, tokens_out=c.tokens_out, cost=c.cost)

    @staticmethod
    def _program(frame: str, answer: str, parents: list[Parent], language: str) -> str:
        """A full-program answer -> the child (the parent's frozen code, the answer's regions)."""
        if not answer.strip():
            raise MalformedAnswer("empty answer")
        child = rebuild(frame, extract_code(answer, language))
        _check(child, parents, language)
        return child

    @staticmethod
    def _diffed(parent: Parent, answer: str, language: str) -> str:
        """A SEARCH/REPLACE answer applied to the parent, inside its EVOLVE-BLOCK regions only."""
        if not answer.strip():
            raise MalformedAnswer("empty answer")
        frame = layout(parent.text)
        child = apply_diff(parent.text, parse_diff(answer), frame.spans() if frame.marked else None)
        child = rebuild(parent.text, child)  # a REPLACE that adds or breaks markers fails here
        _check(child, [parent], language)
        return child

    def _prompt(self, kind: str, parents: list[Parent], inspirations: list[Parent],
                context: PromptContext) -> list[dict]:
        """The chat messages: system, then the operator's template filled in."""
        t, lang = self.templates, context.language
        rules = _RULES if layout(parents[0].text).marked else ""
        instruction = " ".join((context.instruction or "").split())  # one line, whatever it was given
        fields = {"task": context.task.strip(), "language": lang, "rules": rules,
                  "instruction": f"Instruction: {instruction}\n" if instruction else ""}
        if kind == "crossover":
            fields["parents"] = "\n\n".join(
                self._show(f"Program {'AB'[i]}", p, lang, p.text) for i, p in enumerate(parents)
            )
        else:
            fields["parent"] = self._show("Current program", parents[0], lang, parents[0].text)
        if kind == "inspiration":
            fields["inspirations"] = "\n\n".join(
                self._show(f"Program {i}", p, lang, _clip_code(_evolvable(p.text), _INSPIRATION_CHARS), feedback=False)
                for i, p in enumerate(inspirations, 1)
            )
        return [
            {"role": "system", "content": t["system"].substitute(language=lang).strip()},
            {"role": "user", "content": t[kind].substitute(fields).strip()},
        ]

    def _show(self, label: str, p: Parent, language: str, code: str, feedback: bool = True) -> str:
        """One program for the prompt: label, score, compact metrics, code, clipped feedback."""
        notes = _clip(p.feedback.strip(), _FEEDBACK_CHARS) if feedback and p.feedback and p.feedback.strip() else ""
        return self.templates["program"].substitute(
            label=label,
            score="none" if p.fitness is None else f"{p.fitness:.6g}",
            metrics=_metrics(p.metrics),
            language=language,
            code=code if code.endswith("\n") else code + "\n",
            feedback=f"Evaluator feedback:\n{notes}" if notes else "",
        ).rstrip()


def check_llm_operator(
    name: str,
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    templates: dict[str, str] | None = None,
    num_inspirations: int = 3,
    fallback_to_rewrite: bool = True,
) -> dict[str, Any]:
    """An LLM operator's settings, checked: the :class:`LLMOperator` fields except ``client``.

    A pure validator (no client, no operator): every template is read and checked
    here, so a config typo surfaces before a run starts.

    Raises:
        ConfigError: ``name: unknown operator ...``, a bad template (see ``load_templates``),
            or ``num_inspirations`` < 1 for the inspiration operator; fields are relative
            to the operator entry (a builder puts them under ``operators.mix[i]``).
    """
    if name not in _SHAPES:
        raise ConfigError("name", f"unknown operator {name!r}", f"use one of {sorted(_SHAPES)}")
    if name == "inspiration" and num_inspirations < 1:
        raise ConfigError("num_inspirations", f"must be >= 1 for the inspiration operator, got {num_inspirations}")
    return dict(
        name=name,
        num_parents=_SHAPES[name],
        num_inspirations=num_inspirations if name == "inspiration" else 0,
        templates=load_templates(templates),
        temperature=temperature,
        max_tokens=max_tokens,
        fallback_to_rewrite=fallback_to_rewrite,
    )


def make_llm_operator(name: str, client: ChatClient, **settings: Any) -> LLMOperator:
    """Builds an LLM operator by name (``settings``: see :func:`check_llm_operator`, which checks them)."""
    return LLMOperator(client=client, **check_llm_operator(name, **settings))


def _check(child: str, parents: list[Parent], language: str) -> None:
    """Rejects a child that cannot compile or repeats a parent (it would waste an evaluation)."""
    if language == "python":
        check_syntax(child)
    if any(child == p.text for p in parents):
        raise MalformedAnswer("answer repeats the parent unchanged")


def _evolvable(text: str) -> str:
    """What an inspiration contributes: its regions (frozen code is the same in every program)."""
    return "...\n".join(textwrap.dedent(region) for region in layout(text).evolvable)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head):]}"


def _clip_code(code: str, limit: int) -> str:
    if len(code) <= limit:
        return code
    cut = code.rfind("\n", 0, limit) + 1
    return code[: cut or limit].rstrip("\n") + "\n... (cut)\n"


def _metrics(metrics: dict | None) -> str:
    """``"; a=1.5, b=3"``: scalar metrics only, short, for the score line."""
    if not metrics:
        return ""
    parts = []
    for key, value in metrics.items():
        if isinstance(value, (float, np.floating)):
            parts.append(f"{key}={float(value):.4g}")
        elif isinstance(value, (int, np.integer)):
            parts.append(f"{key}={int(value)}")
        elif isinstance(value, str):
            parts.append(f"{key}={value[:40]}")
    text = ", ".join(parts)
    if len(text) > _METRICS_CHARS:
        cut = text.rfind(", ", 0, _METRICS_CHARS)
        text = text[: cut if cut > 0 else _METRICS_CHARS] + ", ..."
    return f"; {text}" if text else ""
