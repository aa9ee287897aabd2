"""Runs inside the sandbox: one agent design on a batch of questions.

This is the untrusted side. The agent's code defines ``forward(task, llm)``; it
gets each question (never its answer: answers stay in ``task.py`` on the host)
and ``llm``, the sandbox's channel to the host's model client, where every call
is counted against the evaluation's budget and recorded. Each question has its
own time limit, so one stuck question fails alone.

Only the program's imports, definitions and assignments run: small models
often follow the agent with top-level test code (``print(forward(...))``,
``input()``), which is not part of the design.
"""

import ast
import signal

_KEEP = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
)


class _ItemTimeout(Exception):
    pass


def _expire(signum, frame):
    raise _ItemTimeout()


def run(text: str, llm, questions: list[str], item_seconds: float = 60.0) -> list[dict]:
    tree = ast.parse(text)
    tree.body = [n for n in tree.body if isinstance(n, _KEEP)]
    namespace: dict = {"__name__": "agent"}
    exec(compile(tree, "agent.py", "exec"), namespace)
    forward = namespace.get("forward")
    if not callable(forward):
        raise NameError("the agent defines no function forward(task, llm)")
    signal.signal(signal.SIGALRM, _expire)
    results = []
    for item, question in enumerate(questions):
        llm.item = item  # the host's trace records which question each model call served
        signal.setitimer(signal.ITIMER_REAL, item_seconds)
        try:
            answer = forward(question, llm)
            results.append({"answer": None if answer is None else str(answer)[:400]})
        except _ItemTimeout:
            results.append({"answer": None, "error": f"no answer within {item_seconds:g} s"})
        except Exception as e:
            results.append({"answer": None, "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return results
