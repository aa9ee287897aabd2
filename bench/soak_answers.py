"""What bench/soak.py's scripted model answers: its replies run in the scripted server's process.

Every answer is derived from the request's ``seed`` (unique per LLM call), so a run gets varied,
mostly valid children and some unusable ones: for function_fit a random valid ``f(x)`` of 1 to 7
terms (polynomials, sin/cos, abs, an intermediate variable), now and then a perturbed copy of the
target (cells keep filling, elites keep being replaced), about 10% invalid (no code block, syntax
error, a raise, a non-number, rarely an endless loop the sandbox kills); for agent_design an agent
making 0 to 5 model calls per problem, of varied size, about 10% unusable, and the agents' own calls
answered by ``tests/capable_llm.py``. Faults are mixed in with ``Rule.rotation``
(``fault_rotation``). Only the standard library at module level: the server process imports this
module by name to unpickle the replies.
"""

from __future__ import annotations

import random

FAULT_KINDS = ("429", "500", "hang", "bad_json", "empty_choices")


def _const(rng: random.Random, lo: float = -3.0, hi: float = 3.0) -> str:
    return repr(round(rng.uniform(lo, hi), rng.choice((1, 2, 3))))


def _term(rng: random.Random, v: str) -> str:
    c = _const(rng)
    form = rng.randrange(7)
    if form == 0:
        return c
    if form == 1:
        return f"{c} * {v}"
    if form == 2:
        return f"{c} * {v} * {v}"
    if form == 3:
        return f"{c} * {v} ** {rng.randint(2, 4)}"
    if form == 4:
        return f"{c} * math.sin({_const(rng, 0.1, 3.0)} * {v})"
    if form == 5:
        return f"{c} * math.cos({_const(rng, 0.1, 3.0)} * {v})"
    return f"{c} * abs({v})"


def program(rng: random.Random) -> str:
    """One answer: mostly a valid, distinct f(x); about 10% invalid in various ways."""
    r = rng.random()
    if r < 0.03:
        return "I am not sure what the function is; maybe try a polynomial?"
    if r < 0.06:
        return f"```python\ndef f(x)\n    return {_const(rng)} * x\n```"
    if r < 0.08:
        return f"```python\ndef f(x):\n    return {_const(rng)} / (x - x)\n```"
    if r < 0.095:
        return "```python\ndef f(x):\n    return 'x squared'\n```"
    if r < 0.1:
        return "```python\ndef f(x):\n    while True:\n        x = x + 1.0\n```"
    if r < 0.3:  # near the target (x^2 + 0.5 x + 2): elites keep being replaced
        a, b, c = (1 + rng.gauss(0, 0.2), 0.5 + rng.gauss(0, 0.3), 2 + rng.gauss(0, 0.5))
        body = f"    return {a:.3f} * x * x + {b:.3f} * x + {c:.3f}"
    else:
        v, body = "x", ""
        if rng.random() < 0.3:
            v, body = "y", f"    y = x + {_const(rng)}\n"
        body += "    return " + " + ".join(_term(rng, v) for _ in range(rng.randint(1, 7)))
    intro = rng.choice(("", "Here is an improved version:\n", "Try this:\n"))
    return f"{intro}```python\ndef f(x):\n{body}\n```\n"


def function_reply(request: dict) -> str:
    """function_fit's answer to one chat request, from its ``seed`` (the client derives one per call)."""
    return program(random.Random(int(request.get("seed") or 0)))


def fault_rotation(every: int) -> tuple[str | None, ...]:
    """Every ``every``-th request a fault, taking FAULT_KINDS in turn; () for none."""
    if every <= 0:
        return ()
    out: list[str | None] = []
    for kind in FAULT_KINDS:
        out += [None] * (every - 1) + [kind]
    return tuple(out)


DESIGN_PROMPT = "You design LLM agents"  # agent_design's operators say so in their system message
METHODS = (
    "Solve this exactly, step by step.",
    "For a word problem, compute each step in order; for a puzzle, test every assignment of roles.",
    "Read the question twice, list the quantities, then compute.",
    "Think carefully and check the result before answering.",
)
FINAL_ANSWER = """def final_answer(text):
    found = re.findall(r"Answer\\s*[:=]\\s*(.+)", str(text), re.I)
    return found[-1].strip() if found else str(text).strip()
"""


def _helper(rng: random.Random, k: int) -> str:
    """A small function the agent defines and uses: AST nodes, so designs spread over the size bins."""
    terms = " + ".join(f"{_const(rng, 0.1, 2.0)} * len(parts[{i}])" for i in range(rng.randint(1, 6)))
    return f"def weigh_{k}(text):\n    parts = (str(text).split() + [''] * 8)[:8]\n    return {terms}\n"


def agent(rng: random.Random) -> str:
    """One agent design: mostly a valid ``forward(task, llm)`` making 0 to 5 model calls per problem, of
    varied size (both are the experiment's descriptors); about 10% unusable in various ways."""
    r = rng.random()
    if r < 0.03:
        return "An agent that reasons carefully would be best here."
    if r < 0.06:
        return "```python\ndef forward(task, llm)\n    return llm(task)\n```"
    if r < 0.08:
        return "```python\ndef forward(task, llm):\n    raise RuntimeError('not today')\n```"
    if r < 0.09:
        return "```python\ndef forward(task, llm):\n    while True:\n        pass\n```"
    if r < 0.1:
        return "```python\ndef solve(task):\n    return '42'\n```"
    calls, helpers = rng.randint(0, 5), rng.randint(0, 6)
    lines = ["import re", "", f"METHOD = {rng.choice(METHODS)!r}", f"LIMIT = {rng.randint(16, 96)}"]
    lines += ["HINT = \"End with 'Answer: <final answer>'.\"", ""]
    lines += [FINAL_ANSWER] + [_helper(rng, k) for k in range(helpers)]
    lines += ["def forward(task, llm):", "    answers = []"]
    if calls == 0:
        lines.append("    answers.append((re.findall(r'\\d+', task) or ['knight'])[-1])")
    for _ in range(calls):
        lines += [
            "    try:",
            '        said = llm(f"{METHOD}\\n{task}\\n{HINT}", max_tokens=LIMIT)',
            "        answers.append(final_answer(said))",
            "    except Exception:",
            "        pass",
        ]
    if helpers:
        weigh = " + ".join(f"weigh_{k}(a)" for k in range(helpers))
        lines.append(f"    answers.sort(key=lambda a: ({weigh}) * 0.0)")
    lines.append("    return max(set(answers), key=answers.count) if answers else ''")
    intro = rng.choice(("", "A new design:\n", "Here is an agent unlike the others:\n"))
    return intro + "```python\n" + "\n".join(lines) + "\n```\n"


def agent_reply(request: dict) -> str:
    """agent_design's answer to one chat request, from its ``seed``: an agent design for the
    operators, an agent's problem answered as ``tests/capable_llm.py`` answers it (right 80% of
    the time, so agents score and fill the archive)."""
    everything = "\n".join(str(m.get("content", "")) for m in request.get("messages") or [])
    if DESIGN_PROMPT in everything:
        return agent(random.Random(int(request.get("seed") or 0)))
    import capable_llm  # it loads the generated problems (and qd): only in this phase's server

    return capable_llm.reply(request)
