"""The sandbox worker: imports the entry once, then forks one sandboxed child per run.

`qd.sandbox` starts it as ``python -I worker.py`` and talks to it in frames over
stdin/stdout (``protocol.py``): a header (kind, run id, length) and a body the worker
never has to decode on the way in (a request's JSON is parsed by the child it is meant
for). It imports only the standard library before the entry, so a fork copies little.
Where the kernel allows, the worker is pid 1 of its own PID namespace (inside a user
namespace when not root), with its own network and mount namespaces set up once
(``isolation.py``): creating them per run would cost more than the fork. After each run
it kills every other process in its PID namespace and empties its private /tmp and
/dev/shm (``supervise.py``), so nothing a candidate starts or writes outlives its run.

Each run's child is forked *before* its request arrives, right after the previous
run's clean-up, and sets itself up (process group, descriptors, rlimits) while the
worker waits (``child.py``): a request then costs little more than the entry call and
the exit. The fork (the dearest part: every page either process then writes is copied)
is off the path between a request and its reply.

Model calls (a run sent as ``RUN_CALLS``) travel from the child's ``llm`` through the
worker to the host and back (``model_calls.py``); nothing here calls a model or knows
the budget.

How the parts load. This file is only the program; its siblings are the worker, and
they import one another relatively (``from .protocol import ...``), so the same files
are ``qd.sandbox.*`` on the host (the pool imports ``protocol``). Under ``python -I``
neither this folder nor site-packages is on ``sys.path``, and importing ``qd`` would
run ``qd/__init__`` (and whatever it imports) in every worker. So this file registers
its own folder as a package of its own, ``_qd_sandbox``, without running any
``__init__``, and imports ``serve`` from it: the folder is found by this file's path,
not by ``sys.path``, and a top-level name such as ``protocol`` never enters
``sys.modules`` to shadow an entry's module of that name. Only ``protocol`` is also
given its host name, so that an entry's ``from qd.sandbox import ModelCallError`` is
the class its ``llm`` raises.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys

PACKAGE = "_qd_sandbox"


def load_parts():
    """This folder as the package ``PACKAGE`` (its ``__init__`` not run); returns its ``serve``."""
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    serve = importlib.import_module(f"{PACKAGE}.serve")
    sys.modules.setdefault("qd.sandbox.protocol", sys.modules[f"{PACKAGE}.protocol"])
    return serve


if __name__ == "__main__":
    try:
        load_parts().main()
    except BrokenPipeError:  # the parent is gone (killed, maybe): leave quietly
        os._exit(0)
