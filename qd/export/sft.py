"""``sft``: prompt/completion pairs for supervised fine-tuning, in TRL's conversational
prompt-completion form (``prompt`` and ``completion`` are lists of chat messages).

Two variants (option ``variant``):

- ``task``: teach a model to solve the task outright. ``prompt`` is the task's
  description (what the run's operators were told), ``completion`` a genome that
  scored well: the best ``per_cell`` (default 1) valid candidates made in each
  (island, cell), best first. Diversity comes from taking them per cell.
- ``operator``: teach a model to be a better mutation operator. ``prompt`` is the
  messages an operator sent, ``completion`` the model's answer, for each child that
  entered the archive (beat its cell's elite when stored, ``qd.history.fates``), in
  store order; ``per_cell`` (default: no cap) keeps the best ones per cell.

``min_fitness`` drops rows below a quality floor. A task that holds items out of the
search (``held_out()``, e.g. agent_design's held-out problems) must not leak them into
training data: a description that contains one is refused, and a row whose prompt or
completion contains one is left out. Text genomes only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from qd.export.rows import BATCH, PerCell, batched, fitness, messages
from qd.rundir import RunDir

COLUMNS = {
    "id": "int64",  # store id of the candidate the completion comes from
    "island": "int64",  # the island it was made on
    "cell": "int64",  # the cell its descriptor falls in
    "fitness": "float64",
    "operator": "string",
    "model": "string",
    "prompt": "messages",
    "completion": "messages",
}
OPTIONS: dict[str, Any] = {"variant": "task", "min_fitness": None, "per_cell": None}
VARIANTS = ("task", "operator")


def rows(run: RunDir, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    variant, per_cell = options["variant"], options["per_cell"]
    if variant not in VARIANTS:
        raise ValueError(f"sft: variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if per_cell is not None and (not isinstance(per_cell, int) or per_cell < 1):
        raise ValueError(f"sft: per_cell {per_cell!r}: pass a positive integer, or null for no cap")
    if run.geometry.genome is None:
        raise ValueError(
            "sft: this run evolves vectors, which have no text to train on; export kind elites instead"
        )
    task = task_of(run)
    held = held_out_strings(task)
    if any(h in task.description for h in held):
        raise ValueError(
            "sft: the task's description contains a held-out item; refusing to export it as a prompt"
        )
    floor = -np.inf if options["min_fitness"] is None else float(options["min_fitness"])
    cap = per_cell if per_cell is not None else (1 if variant == "task" else None)
    task_prompt = [{"role": "user", "content": task.description}]
    for chunk in batched(_picked(run, variant, floor, cap)):
        where = dict(chunk)
        for c in run.store.get(where):
            prompt = task_prompt if variant == "task" else messages(c.prompt)
            answer = c.text if variant == "task" else c.response
            if prompt is None or answer is None or leaks(held, prompt, answer):
                continue
            yield {
                "id": c.id,
                "island": c.island,
                "cell": where[c.id],
                "fitness": fitness(c.fitness, c.valid),
                "operator": c.operator,
                "model": c.model,
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": answer}],
            }


def _picked(run: RunDir, variant: str, floor: float, cap: int | None) -> Iterator[tuple[int, int]]:
    """(id, cell) of the candidates that make rows, in row order: best first, ties by id,
    at most ``cap`` per (island, cell) (``operator``: then in store order; with no cap,
    as the store streams by)."""
    from qd.history import pages

    g = run.geometry
    kept = None if cap is None else PerCell(g.islands * g.cells, cap)
    for page in pages(run, page=BATCH):
        usable = (
            page["valid"] & np.isfinite(page["fitness"]) & (page["cell"] >= 0) & (page["fitness"] >= floor)
        )
        if variant == "operator":
            usable &= page["entered"] & (page["parent"] >= 0)
        for k in np.flatnonzero(usable).tolist():
            if kept is None:
                yield int(page["id"][k]), int(page["cell"][k])
            else:
                kept.offer(
                    int(page["island"][k]) * g.cells + int(page["cell"][k]),
                    page["fitness"][k],
                    int(page["id"][k]),
                )
    if kept is not None:
        slot, _, ids = kept.kept()
        order = np.argsort(ids, kind="stable") if variant == "operator" else np.arange(len(ids))
        yield from zip(ids[order].tolist(), (slot[order] % g.cells).tolist())


def task_of(run: RunDir) -> Any:
    """The run's task, loaded as the run loaded it (for its description and held-out items); a
    ``qd.optimize`` run's, as it saved them (its evaluator is in no file)."""
    from qd.optimizer import saved_task
    from qd.task import load_task, task_params

    saved = saved_task(run.path)
    if saved is not None:
        return saved
    cfg = run.config()
    return load_task(cfg.experiment.task, task_params(cfg.experiment))


def held_out_strings(task: Any) -> list[str]:
    """The texts of the task's held-out items (a problem's ``question``), or [] when it holds none out."""
    held_out = getattr(task, "held_out", None)
    if not callable(held_out):
        return []
    return [s for s in (str(getattr(item, "question", item)) for item in held_out()) if s]


def leaks(held: list[str], prompt: list[dict[str, str]], answer: str) -> bool:
    """True when the prompt or the answer contains a held-out item's text."""
    texts = [m["content"] for m in prompt] + [answer]
    return any(h in t for h in held for t in texts)
