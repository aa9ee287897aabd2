"""``qd SUBCOMMAND``: tools that work on a run directory (``qd-run`` starts runs).

Every command but ``judge`` only reads the run (``qd.rundir``), so each works on a
finished run and on one still going:

- ``qd show RUN_DIR`` — the elites (``--top K``, ``--cell``, ``--id N``, ``--island``);
- ``qd lineage RUN_DIR ID`` — the ancestor chain, with a diff at each step;
- ``qd stats RUN_DIR`` — per operator, model and meta instruction;
- ``qd compare RUN_A RUN_B ...`` — runs (or a multirun folder) side by side;
- ``qd plot RUN_DIR ...`` — heatmaps and curves as PNG and SVG;
- ``qd explore RUN_DIR ...`` — the web explorer;
- ``qd export RUN_DIR --kind K ...`` — the run as a dataset (elites, SFT pairs, traces, ...);
- ``qd committee RUN_DIR [--k K] [--rule vote|judge] ...`` — k diverse elites answering held-out
  problems together, against the best one alone and k copies of it (calls the model);
- ``qd judge RUN_DIR [--count N] [--seed S]`` asks a person at the terminal which of
  two stored candidates is more similar to a third and records the answers as
  "human" judgments; a learned (QDHF) descriptor trains on them at its next refit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import numpy as np

from qd import extras

USAGE = (
    "usage: qd {show,lineage,stats,compare,plot,explore,export,committee,judge} RUN_DIR ... "
    "(qd COMMAND --help for each)"
)


def judge(argv: list[str]) -> None:
    from descriptors.base import Item
    from descriptors.learned import TerminalJudge, sample_triplets
    from qd.rundir import layout
    from qd.store import Store

    ap = argparse.ArgumentParser(prog="qd judge", description="Record human similarity judgments for a run.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--count", type=int, default=20, help="triplets to ask (default 20)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (default: fresh)")
    args = ap.parse_args(argv)
    path = args.run_dir / layout.STORE
    if not path.is_file():
        sys.exit(f"qd judge: no store at {path}; pass a run directory made by qd-run")
    with Store(path) as store:
        if not store.keeps_every_candidate():
            sys.exit(
                f"qd judge: {args.run_dir} stores only its elites (runner.store=elites); judging samples "
                "every candidate: run it with runner.store=all"
            )
        items = {c.id: Item(c.text, c.fitness, c.metrics, c.id) for c in store.iter() if c.valid and c.text}
        if len(items) < 3:
            sys.exit(f"qd judge: {args.run_dir} has {len(items)} valid text candidates; need at least 3")
        ids = np.fromiter(items, np.int64)
        triplets = sample_triplets(ids, args.count, np.random.default_rng(args.seed), store.judgments.read())
        person = TerminalJudge()
        stored = 0
        for t in triplets.tolist():
            (answer,) = asyncio.run(person([tuple(items[i] for i in t)]))
            if person.quit:
                break
            if answer is not None:
                store.judgments.add([(*t, answer)], person.source)  # at once: quitting keeps every answer
                stored += 1
        print(
            f"\nqd judge: stored {stored} judgments ({person.skipped} skipped); "
            f"{len(store.judgments.read())} in {path}"
        )


# name -> "module:function" taking the arguments after the name (imported on use: each loads what it needs).
COMMANDS = {
    "show": "qd.views.show:main",
    "lineage": "qd.views.lineage:main",
    "stats": "qd.views.stats:main",
    "compare": "qd.views.compare:main",
    "plot": "qd.plot:main",
    "explore": "qd.explore:main",
    "export": "qd.export.command:main",
    "committee": "qd.committee:main",
    "judge": "qd.cli:judge",
}
# The commands that need the extra of their own name: checked before the command's module is imported.
EXTRAS = ("plot", "explore")


def main(argv: list[str] | None = None) -> None:
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    module, function = COMMANDS[argv[0]].split(":")
    try:
        if argv[0] in EXTRAS:
            extras.require(argv[0], f"qd {argv[0]}")
        getattr(importlib.import_module(module), function)(argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:  # `qd stats RUN | head`: the reader had enough, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush writes nowhere
        raise SystemExit(141) from None
    except extras.MissingExtra as e:  # the one line, not a traceback
        print(f"qd: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
