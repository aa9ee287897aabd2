"""The agent operator: a bounded tool loop that mutates one parent into one child.

Each step is one model call (role ``operator``) whose answer names one tool on a line of its
own, ``TOOL: name [arg]``, a protocol small models can follow; the tool's result is the next
user message. The tools:

- ``read_parent``: the parent's text, score, metrics and evaluator feedback (its artifacts);
- ``failed_siblings``: the parent's recent children that failed or did not enter, with why
  (``PromptContext.memory``; with run memory off it says none are known);
- ``read_elite N``: the N-th of the elites the proposer drew as its inspirations;
- ``trial`` + a fenced block: the draft run on the first evaluation stage
  (``PromptContext.workbench``: the run stores the trial as a candidate of its own and counts
  it as an evaluation, but never places it);
- ``submit`` + a fenced block: the child; the loop ends.

Caps per child: ``max_steps`` calls, ``max_trials`` trials, and ``max_conversation_tokens``
for every step's prompt (a tool's result is clipped to what is left; when too little is left
the loop ends). Every step after the first reserves its call first (``PromptContext.reserve_call``),
so a run never exceeds ``runner.max_llm_calls``. Each step has its own sample index
(:func:`step_index`), so its call is cached and a rerun replays the loop exactly.

An answer that names no tool gets one reminder; a second such answer ends the loop, and so do
the caps: the child is then unusable (``text`` None), its ``error`` says why (``agent: ...``),
and nothing is guessed from a stray code block (a rewrite is what the ``rewrite`` arm is for).
The child's ``prompt`` is the JSON of the whole conversation (every step's answer included),
so its steps are the assistant messages there; its tokens and cost are the sums over its steps.
"""

from __future__ import annotations

import dataclasses
import json
import re
from string import Template
from typing import Any

from genomes import GenomeKind
from genomes.answers import MalformedAnswer
from genomes.builtin import PROGRAM
from operators.code import layout
from operators.llm import _FIELDS, _RULES, _clip, _metrics, load_templates, show_genome, whole_child
from operators.recall import CHARS_PER_TOKEN, attempt_line
from qd.contract import ChatClient, Child, ConfigError, Parent, PromptContext, TextOperator, sample_index

NAME = "agent"
STREAM = 5  # the agent's steps' sample-index stream (``qd.contract.sample_index``)
MAX_STEPS = 64  # a gate resample's steps must stay inside the stream's attempt range
_TOOL = re.compile(r"^[\W_]*TOOL[\W_]*:?[\W_]*([a-z_]+)[ \t]*(\S*)", re.IGNORECASE | re.MULTILINE)
_CHARS_PER_TOKEN = 3  # a conservative estimate where the server's count is smaller
_MIN_ROOM = 48  # tokens a tool result needs at least; with less left the loop ends
_CUT_LINE = 16  # tokens of the line ``_clip`` puts where it cuts
_SIBLINGS = 5  # failed siblings listed
_TEMPLATES = {
    "system": _FIELDS["system"],
    "program": _FIELDS["program"],
    "agent": (
        {"steps", "score"},
        {"task", "language", "noun", "rules", "instruction", "steps", "score", "trials", "elites"},
    ),
    "agent_reminder": (set(), {"noun", "language"}),
}


def step_index(first: int, step: int) -> int:
    """The sample index of step ``step`` of the loop whose first call has index ``first``:
    the first call keeps it (as every operator's does), later steps take the agent's stream,
    with a gate resample's steps apart from the first answer's."""
    if step == 0:
        return first
    child, resample = first & (2**32 - 1), first >> 32
    return sample_index(child, attempt=resample * MAX_STEPS + step, stream=STREAM)


@dataclasses.dataclass
class _Loop:
    """One child's conversation so far."""

    messages: list[dict]
    steps: int = 0
    trials: int = 0
    reminded: bool = False
    used: int = 0  # the conversation's tokens after the latest answer
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    model: str | None = None
    answer: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class AgentOperator(TextOperator):
    """``await op([parent], inspirations, context)`` -> 1 child, made in a tool loop (module doc)."""

    name: str
    num_parents: int
    num_inspirations: int = dataclasses.field()
    client: ChatClient = dataclasses.field(repr=False)
    templates: dict[str, Template] = dataclasses.field(repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    genome: GenomeKind = PROGRAM
    max_steps: int = 4
    max_trials: int = 1
    max_conversation_tokens: int = 1500
    memory_tokens: int = 300  # cap of the failed-siblings answer (the run-memory block's cap)

    async def __call__(
        self, parents: list[Parent], inspirations: list[Parent], context: PromptContext
    ) -> list[Child]:
        if len(parents) != 1:
            raise ValueError(f"{self.name}: needs 1 parent, got {len(parents)}")
        parent, elites = parents[0], inspirations[: self.num_inspirations]
        model = context.model
        if model is None and context.rng is not None:
            model = self.client.pick_model(context.rng)
        loop = _Loop(self._opening(parent, len(elites), context))
        error = None
        while error is None:
            if loop.steps and not (context.reserve_call and context.reserve_call()):
                error = "no model call left in the run's budget"
                break
            c = await self.client.complete(
                loop.messages,
                model=model,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                sample_index=step_index(context.sample_index, loop.steps),
            )
            loop.steps, loop.model, loop.answer = loop.steps + 1, c.model, c.text
            loop.tokens_in, loop.tokens_out, loop.cost = (
                loop.tokens_in + c.tokens_in,
                loop.tokens_out + c.tokens_out,
                loop.cost + c.cost,
            )
            loop.messages.append({"role": "assistant", "content": c.text})
            loop.used = max(c.tokens_in + c.tokens_out, _estimate(loop.messages))
            result = await self._act(c.text, parent, elites, context, loop)
            if isinstance(result, Child):
                return [result]
            if result is None and loop.steps >= self.max_steps:
                result = f"no submit in max_steps={self.max_steps}"
            error = result
        return [self._child(loop, None, error)]

    async def _act(
        self, answer: str, parent: Parent, elites: list[Parent], context: PromptContext, loop: _Loop
    ) -> Child | str | None:
        """The tool an answer names, run: the child (``submit``), or None once its result is the
        next message, or why the loop ends."""
        match = _TOOL.search(answer)
        tool, arg = (match.group(1).lower(), match.group(2)) if match else (None, "")
        body = answer[match.end() :] if match else answer
        if tool == "submit":
            try:
                return self._child(loop, whole_child(self.genome, parent.text, body, [parent]), None)
            except MalformedAnswer as err:
                result = (
                    f"The submitted {self.genome.noun} is unusable: {err.reason}. Fix it and submit again."
                )
        elif tool == "trial":
            result = await self._trial(body, parent, context, loop)
        elif tool in ("read_parent", "failed_siblings", "read_elite"):
            result = self._read(tool, arg, parent, elites, context)
        elif loop.reminded:
            return "the answer named no tool again after a reminder"
        else:
            loop.reminded = True
            t = self.templates["agent_reminder"]
            result = t.substitute(noun=self.genome.noun, language=self.genome.language).strip()
        return self._observe(loop, result)

    def _observe(self, loop: _Loop, result: str) -> str | None:
        """``result`` appended as the next user message, clipped to the tokens the cap leaves;
        the reason the loop ends when too few are left."""
        room = self.max_conversation_tokens - loop.used
        if room < _MIN_ROOM:
            return f"the conversation reached max_conversation_tokens={self.max_conversation_tokens}"
        loop.messages.append(
            {"role": "user", "content": _clip(result, (room - _CUT_LINE) * _CHARS_PER_TOKEN)}
        )
        return None

    async def _trial(self, body: str, parent: Parent, context: PromptContext, loop: _Loop) -> str:
        if context.workbench is None:
            return "Trials are not available in this run: submit your answer."
        if loop.trials >= self.max_trials:
            return f"No trials left (max_trials={self.max_trials}): submit your answer."
        try:
            draft = whole_child(self.genome, parent.text, body, [parent])
        except MalformedAnswer as err:
            return f"The draft is unusable: {err.reason}."
        trial = await context.workbench.trial(draft)
        if trial is None:
            return "No evaluation is left in the run's budget: submit your answer."
        loop.trials += 1
        score = "none (invalid)" if not trial.valid else f"{trial.fitness:.6g}"
        feedback = f"\n{trial.feedback}" if trial.feedback else ""
        return f"Trial on the first test: score {score}{_metrics(trial.metrics)}{feedback}"

    def _read(self, tool: str, arg: str, parent: Parent, elites: list[Parent], context: PromptContext) -> str:
        if tool == "read_parent":
            return self._show(f"Current {self.genome.noun}", parent, feedback=True)
        if tool == "read_elite":
            number = re.match(r"\d+", arg)
            n = int(number[0]) if number else 0
            if not 1 <= n <= len(elites):
                return f"No elite {arg or '(no number)'}: there are {len(elites)}."
            return self._show(f"Elite {n}", elites[n - 1], feedback=False)
        memory = context.memory
        failed = [a for a in memory.children(parent.id, _SIBLINGS) if a.fate != "kept"] if memory else []
        if not failed:
            return "No failed earlier changes to this parent are known."
        lines = [attempt_line(a) for a in failed]
        while len(lines) > 1 and len("\n".join(lines)) > self.memory_tokens * CHARS_PER_TOKEN:
            lines.pop()  # the oldest first
        return "\n".join(lines)

    def _show(self, label: str, p: Parent, feedback: bool) -> str:
        return show_genome(self.templates["program"], label, p, p.text, self.genome.language, feedback)

    def _opening(self, parent: Parent, elites: int, context: PromptContext) -> list[dict]:
        t, lang, noun = self.templates, self.genome.language, self.genome.noun
        instruction = " ".join((context.instruction or "").split())
        opening = t["agent"].substitute(
            task=context.task.strip(),
            language=lang,
            noun=noun,
            rules=_RULES if self.genome.code and layout(parent.text).marked else "",
            instruction=f"Instruction: {instruction}\n" if instruction else "",
            steps=self.max_steps,
            score="none" if parent.fitness is None else f"{parent.fitness:.6g}",
            trials=self.max_trials,
            elites=elites,
        )
        return [
            {"role": "system", "content": t["system"].substitute(language=lang, noun=noun).strip()},
            {"role": "user", "content": opening.strip()},
        ]

    def _child(self, loop: _Loop, text: str | None, error: str | None) -> Child:
        spent = f" (after {loop.steps} steps, {loop.trials} trials, {loop.used} tokens)"
        return Child(
            text=text,
            error=None if error is None else f"{self.name}: {error}{spent}",
            operator=self.name,
            model=loop.model,
            prompt=json.dumps(loop.messages, ensure_ascii=False),
            response=loop.answer,
            tokens_in=loop.tokens_in,
            tokens_out=loop.tokens_out,
            cost=loop.cost,
        )


def _estimate(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages) // _CHARS_PER_TOKEN + 1


def check_agent_operator(
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    templates: dict[str, str] | None = None,
    num_inspirations: int | None = None,
    genome: GenomeKind = PROGRAM,
    max_steps: int | None = None,
    max_trials: int | None = None,
    max_conversation_tokens: int | None = None,
    memory_tokens: int = 300,
) -> dict[str, Any]:
    """The agent operator's settings, checked: the :class:`AgentOperator` fields except ``client``
    (None: the defaults, 2 inspirations, 4 steps, 1 trial, 1500 tokens: a 2,048-token context).

    Raises:
        ConfigError: a bad template (``operators.llm.load_templates``), ``max_steps`` outside
            1..64, ``max_trials`` or ``memory_tokens`` < 0, ``num_inspirations`` < 0, or
            ``max_conversation_tokens`` too small for the opening message and one tool result.
    """
    defaults = AgentOperator.__dataclass_fields__
    steps = defaults["max_steps"].default if max_steps is None else max_steps
    trials = defaults["max_trials"].default if max_trials is None else max_trials
    cap = max_conversation_tokens
    if cap is None:
        cap = defaults["max_conversation_tokens"].default
    shows = 2 if num_inspirations is None else num_inspirations
    if not 1 <= steps <= MAX_STEPS:
        raise ConfigError("max_steps", f"must be in 1..{MAX_STEPS}, got {steps}")
    if trials < 0:
        raise ConfigError("max_trials", f"must be >= 0, got {trials}")
    if memory_tokens < 0:
        raise ConfigError("memory_tokens", f"must be >= 0, got {memory_tokens}")
    if shows < 0:
        raise ConfigError("num_inspirations", f"must be >= 0, got {shows}")
    if cap < 4 * _MIN_ROOM:
        raise ConfigError("max_conversation_tokens", f"must be >= {4 * _MIN_ROOM}, got {cap}")
    own = {k: v for k, v in genome.templates.items() if k in _TEMPLATES}
    return dict(
        name=NAME,
        num_parents=1,
        num_inspirations=shows,
        templates=load_templates({**own, **(templates or {})}, _TEMPLATES),
        temperature=temperature,
        max_tokens=max_tokens,
        genome=genome,
        max_steps=steps,
        max_trials=trials,
        max_conversation_tokens=cap,
        memory_tokens=memory_tokens,
    )


__all__ = ["AgentOperator", "check_agent_operator", "step_index"]
