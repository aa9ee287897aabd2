"""JAX's persistent compilation cache for qd's runs: the fused device step (and the host loop's
jitted archive functions) compiled once per machine, not once per run.

XLA compiling the fused step is the largest single cost of a short numeric run (seconds, the
same program every time for the same task and shapes), so its executables are kept on disk:

* the folder follows the XDG base-directory convention: ``$XDG_CACHE_HOME/qd/jax``, by default
  ``~/.cache/qd/jax``; ``QD_COMPILE_CACHE=DIR`` puts it elsewhere (the test suite has its own)
  and ``QD_COMPILE_CACHE=0`` turns it off;
* a folder that JAX was given already (``JAX_COMPILATION_CACHE_DIR``, or an earlier run of this
  process) is kept: JAX opens its cache once per process;
* every program is kept, however quickly it compiled (JAX's default keeps only those over a
  second): a second run of the same experiment then compiles nothing at all.

JAX keys each entry by the program, its compile options, the backend and the jax/jaxlib
versions, so an entry never serves another program or version; a stale folder can be deleted
at any time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV = "QD_COMPILE_CACHE"
_OFF = {"0", "off", "false", "no"}


def folder(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the executables go for this environment (None: the cache is off)."""
    value = environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"  # XDG: relative paths are ignored
    return root / "qd" / "jax"


def enable() -> Path | None:
    """Points JAX's persistent cache at :func:`folder` unless JAX has one already; returns the
    folder in use (None: off). Call it before the run compiles anything."""
    import jax

    given = jax.config.jax_compilation_cache_dir
    if given:
        return Path(given)
    path = folder()
    if path is None:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
