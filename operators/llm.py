"""LLM variation operators: rewrite, diff (SEARCH/REPLACE), crossover, inspiration, meta_agent.

An operator renders a short prompt from file templates (``operators/prompts/``,
replaced per genome kind and per template), asks the client, and turns the answer
into a child. Every operator works on every genome kind (``genomes``): the kind
names the genome in the prompts (``$noun``), brings its system prompt, says
which fenced block of an answer holds the child and checks it; only ``diff``
needs a code kind. An unusable answer is still a child, with ``text=None`` and
the reason in ``error``, so the store records what the model said and the loop
moves on; with ``debug_rounds`` the reason is first shown to the model, which
answers again (up to that many extra calls, each reserved against the run's
budget). A failed call (``qd.llm.LLMError``) propagates, and the caller stores
the child as failed (``Child.unanswered``). Children of code kinds keep the
parent's code outside its EVOLVE-BLOCK regions byte for byte (``operators.code``).

``meta_agent`` is ADAS's meta agent search step: the model sees the archive as a
list of one-line summaries (each design's idea, score and metrics: whole designs
would not fit a 2,048-token context), the parent in full, and is asked for a new
design unlike those listed.

Prompts are sized for the default embedded model (2,048-token context): the
parent's code is shown whole (a diff must quote it), everything else is clipped.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from genomes import GenomeKind
from genomes.answers import MalformedAnswer, extract_code
from genomes.builtin import PROGRAM
from operators.code import layout, rebuild
from operators.diff import DiffError, apply_diff, parse_diff
from operators.recall import memory_block
from qd.contract import ChatClient, Child, ConfigError, LLMError, Parent, PromptContext, TextOperator

PROMPTS = Path(__file__).parent / "prompts"
_FEEDBACK_CHARS = 600  # evaluator feedback shown: head and tail (tracebacks end with the cause)
_METRICS_CHARS = 200
_INSPIRATION_CHARS = 1200  # per inspiration's code
_SUMMARY_CHARS = 120  # per design in meta_agent's archive list

# template name -> (placeholders it must use, placeholders it may use). ``$instruction`` is
# "" or one line ending in a newline (``Instruction: ...\n``), ``$memory`` "" or the run-memory
# block's lines ending in a newline (``operators.recall``): put each at the start of a line.
_COMMON = {"task", "language", "noun", "rules", "instruction", "memory"}
_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "system": (set(), {"language", "noun"}),
    "program": ({"code"}, {"label", "score", "metrics", "feedback", "language", "code"}),
    "rewrite": ({"parent"}, _COMMON | {"parent"}),
    "diff": ({"parent"}, _COMMON | {"parent"}),
    "crossover": ({"parents"}, _COMMON | {"parents"}),
    "inspiration": ({"parent", "inspirations"}, _COMMON | {"parent", "inspirations"}),
    "meta_agent": ({"parent", "archive"}, _COMMON | {"parent", "archive"}),
    "debug": ({"error"}, {"error", "noun", "language"}),
}
_SHAPES = {
    "rewrite": 1,
    "diff": 1,
    "crossover": 2,
    "inspiration": 1,
    "meta_agent": 1,
}  # operator -> parents per child
_SHOWS = {"inspiration": 3, "meta_agent": 8}  # operator -> default inspirations shown
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
            raise ConfigError(
                f"templates.{name}", f"malformed placeholder in {path}", "write $$ for a literal $"
            )
        used = set(template.get_identifiers())
        if used - allowed:
            raise ConfigError(
                f"templates.{name}",
                f"unknown placeholder ${sorted(used - allowed)[0]} in {path}",
                f"use {', '.join('$' + f for f in sorted(allowed))}",
            )
        if required - used:
            missing = sorted(required - used)[0]
            raise ConfigError(
                f"templates.{name}", f"missing placeholder ${missing} in {path}", "the prompt needs it"
            )
        templates[name] = template
    return templates


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class LLMOperator(TextOperator):
    """``await op(parents, inspirations, context)`` -> 1 child (2 when a diff falls back to a rewrite)."""

    name: str
    num_parents: int
    num_inspirations: int = dataclasses.field()  # required here (the base's default 0 is not a default)
    client: ChatClient = dataclasses.field(repr=False)
    templates: dict[str, Template] = dataclasses.field(repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    fallback_to_rewrite: bool = True
    genome: GenomeKind = PROGRAM
    debug_rounds: int = 0
    memory_tokens: int = 300  # cap of the run-memory block (``PromptContext.memory``) in tokens

    async def __call__(
        self, parents: list[Parent], inspirations: list[Parent], context: PromptContext
    ) -> list[Child]:
        if len(parents) != self.num_parents:
            raise ValueError(f"{self.name}: needs {self.num_parents} parent(s), got {len(parents)}")
        model = context.model
        if model is None and context.rng is not None:
            model = self.client.pick_model(context.rng)
        first = parents[0]
        if self.name == "diff":
            child = await self._ask(
                "diff",
                self._prompt("diff", parents, [], context),
                model,
                context,
                lambda answer: self._diffed(first, answer),
            )
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
        return [
            await self._ask(
                self.name, messages, model, context, lambda answer: self._whole(first.text, answer, parents)
            )
        ]

    async def _rewrite(
        self, operator: str, parent: Parent, context: PromptContext, model: str | None
    ) -> Child:
        return await self._ask(
            operator,
            self._prompt("rewrite", [parent], [], context),
            model,
            context,
            lambda answer: self._whole(parent.text, answer, [parent]),
        )

    async def _ask(
        self,
        operator: str,
        messages: list[dict],
        model: str | None,
        context: PromptContext,
        parse: Callable[[str], str],
    ) -> Child:
        """One call (plus up to ``debug_rounds`` more, each shown the reason the last answer
        failed); the answer parsed into a child, or the reason it could not be."""
        tokens_in = tokens_out = 0
        cost = 0.0
        for round_ in range(1 + self.debug_rounds):
            c = await self.client.complete(
                messages,
                model=model,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                sample_index=context.sample_index + (round_ << 48),
            )
            tokens_in, tokens_out, cost = tokens_in + c.tokens_in, tokens_out + c.tokens_out, cost + c.cost
            text, error = None, None
            try:
                text = parse(c.text)
            except (MalformedAnswer, DiffError) as err:
                reason = err.reason
                if c.finish_reason == "length" and "truncated" not in reason:
                    reason += " (answer cut at max_tokens)"
                error = f"{operator}: {reason}" + (
                    f" (after {round_} debug round{'s' * (round_ > 1)})" if round_ else ""
                )
            if (
                text is not None
                or round_ == self.debug_rounds
                or not (context.reserve_call and context.reserve_call())
            ):
                break
            debug = (
                self.templates["debug"]
                .substitute(error=reason, noun=self.genome.noun, language=self.genome.language)
                .strip()
            )
            messages = [
                *messages,
                {"role": "assistant", "content": c.text},
                {"role": "user", "content": debug},
            ]
        return Child(
            text=text,
            error=error,
            operator=operator,
            model=c.model,
            prompt=json.dumps(messages, ensure_ascii=False),
            response=c.text,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
        )

    def _whole(self, frame: str, answer: str, parents: list[Parent]) -> str:
        return whole_child(self.genome, frame, answer, parents)

    def _diffed(self, parent: Parent, answer: str) -> str:
        """A SEARCH/REPLACE answer applied to the parent, inside its EVOLVE-BLOCK regions only."""
        if not answer.strip():
            raise MalformedAnswer("empty answer")
        frame = layout(parent.text)
        child = apply_diff(parent.text, parse_diff(answer), frame.spans() if frame.marked else None)
        child = self.genome.check(
            rebuild(parent.text, child)
        )  # a REPLACE that adds or breaks markers fails here
        _check_new(child, [parent])
        return child

    def _prompt(
        self, kind: str, parents: list[Parent], inspirations: list[Parent], context: PromptContext
    ) -> list[dict]:
        """The chat messages: system, then the operator's template filled in."""
        t, lang, noun = self.templates, self.genome.language, self.genome.noun
        rules = _RULES if self.genome.code and layout(parents[0].text).marked else ""
        instruction = " ".join((context.instruction or "").split())  # one line, whatever it was given
        fields = {
            "task": context.task.strip(),
            "language": lang,
            "noun": noun,
            "rules": rules,
            "instruction": f"Instruction: {instruction}\n" if instruction else "",
            "memory": memory_block(context.memory, parents, self.memory_tokens, noun),
        }
        if kind == "crossover":
            fields["parents"] = "\n\n".join(
                self._show(f"{noun.capitalize()} {'AB'[i]}", p, p.text) for i, p in enumerate(parents)
            )
        else:
            fields["parent"] = self._show(f"Current {noun}", parents[0], parents[0].text)
        if kind == "inspiration":
            fields["inspirations"] = "\n\n".join(
                self._show(
                    f"{noun.capitalize()} {i}",
                    p,
                    _clip_code(_evolvable(p.text, self.genome.code), _INSPIRATION_CHARS),
                    feedback=False,
                )
                for i, p in enumerate(inspirations, 1)
            )
        if kind == "meta_agent":
            fields["archive"] = (
                "\n".join(_summary(i, p) for i, p in enumerate(inspirations, 1)) or "(none yet)"
            )
        return [
            {"role": "system", "content": t["system"].substitute(language=lang, noun=noun).strip()},
            {"role": "user", "content": t[kind].substitute(fields).strip()},
        ]

    def _show(self, label: str, p: Parent, code: str, feedback: bool = True) -> str:
        return show_genome(self.templates["program"], label, p, code, self.genome.language, feedback)


def show_genome(template: Template, label: str, p: Parent, code: str, language: str, feedback: bool) -> str:
    """One genome for a prompt (``template``: the ``program`` template): label, score, compact
    metrics, its text, clipped feedback. Every LLM operator shows genomes this one way."""
    notes = (
        _clip(p.feedback.strip(), _FEEDBACK_CHARS) if feedback and p.feedback and p.feedback.strip() else ""
    )
    return template.substitute(
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
    num_inspirations: int | None = None,
    fallback_to_rewrite: bool = True,
    genome: GenomeKind = PROGRAM,
    debug_rounds: int = 0,
    memory_tokens: int = 300,
) -> dict[str, Any]:
    """An LLM operator's settings, checked: the :class:`LLMOperator` fields except ``client``.

    A pure validator (no client, no operator): every template is read and checked
    here, so a config typo surfaces before a run starts. ``genome``'s own templates
    replace the defaults, and ``templates`` replace those.

    Raises:
        ConfigError: ``name: unknown operator ...``, a bad template (see ``load_templates``),
            ``num_inspirations`` < 1 for an operator that shows inspirations, a diff on a
            data kind, or ``debug_rounds`` or ``memory_tokens`` < 0; fields are relative to the operator entry
            (a builder puts them under ``operators.mix[i]``).
    """
    if name not in _SHAPES:
        raise ConfigError("name", f"unknown operator {name!r}", f"use one of {sorted(_SHAPES)}")
    shows = _SHOWS.get(name, 0) if num_inspirations is None else num_inspirations if name in _SHOWS else 0
    if name in _SHOWS and shows < 1:
        raise ConfigError("num_inspirations", f"must be >= 1 for the {name} operator, got {shows}")
    if name == "diff" and not genome.code:
        raise ConfigError(
            "name",
            f"diff edits code; {genome.name} genomes are {genome.language} data",
            "use rewrite, crossover, inspiration or meta_agent",
        )
    if debug_rounds < 0:
        raise ConfigError("debug_rounds", f"must be >= 0, got {debug_rounds}")
    if memory_tokens < 0:
        raise ConfigError("memory_tokens", f"must be >= 0, got {memory_tokens}")
    return dict(
        name=name,
        num_parents=_SHAPES[name],
        num_inspirations=shows,
        templates=load_templates({**genome.templates, **(templates or {})}),
        temperature=temperature,
        max_tokens=max_tokens,
        fallback_to_rewrite=fallback_to_rewrite,
        genome=genome,
        debug_rounds=debug_rounds,
        memory_tokens=memory_tokens,
    )


def make_llm_operator(name: str, client: ChatClient, **settings: Any) -> LLMOperator:
    """Builds an LLM operator by name (``settings``: see :func:`check_llm_operator`, which checks them)."""
    return LLMOperator(client=client, **check_llm_operator(name, **settings))


def whole_child(genome: GenomeKind, frame: str, answer: str, parents: list[Parent]) -> str:
    """A whole-genome answer -> the child; for code kinds, the parent's frozen code (``frame``)
    around the answer's EVOLVE-BLOCK regions.

    Raises:
        MalformedAnswer: no usable genome in it, or one that repeats a parent.
    """
    if not answer.strip():
        raise MalformedAnswer("empty answer")
    if genome.code:
        child = genome.check(rebuild(frame, extract_code(answer, genome.language)))
    else:
        child = genome.parse(answer)
    _check_new(child, parents)
    return child


def _check_new(child: str, parents: list[Parent]) -> None:
    """Rejects a child that repeats a parent (it would waste an evaluation)."""
    if any(child == p.text for p in parents):
        raise MalformedAnswer("answer repeats the parent unchanged")


def _summary(number: int, p: Parent) -> str:
    """One line for meta_agent's archive list: the design's idea (its docstring or first
    line), its score and metrics."""
    idea = _idea(p.text)
    score = "none" if p.fitness is None else f"{p.fitness:.3g}"
    return f"{number}. {idea} (score {score}{_metrics(p.metrics)})"


def _idea(text: str) -> str:
    """A genome's idea in a line: the first docstring in it, else its first meaningful line."""
    try:
        tree = ast.parse(text)
        nodes = [
            tree,
            *(
                n
                for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            ),
        ]
        doc = next((d for n in nodes if (d := ast.get_docstring(n))), None)
    except (SyntaxError, ValueError):
        doc = None
    lines = [
        line.strip()
        for line in (doc or text).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    first = lines[0] if lines else "(empty)"
    return first if len(first) <= _SUMMARY_CHARS else first[: _SUMMARY_CHARS - 3] + "..."


def _evolvable(text: str, code: bool) -> str:
    """What an inspiration contributes: its regions (frozen code is the same in every program)."""
    if not code:
        return text
    return "...\n".join(textwrap.dedent(region) for region in layout(text).evolvable)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head) :]}"


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
