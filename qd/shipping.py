"""A Python function made into the text of a module the sandbox can run: ``ship(fn) -> Shipped``.

A code genome's evaluator imports and runs the candidate, so it runs in the sandbox
beside it, and the sandbox runs standard-library Python under ``python -I``: it cannot
import the caller's script or unpickle its objects. What crosses is source text: the
function's own, plus what it reads from its module — an import becomes the import
line, a helper function or class of the same module its source (and, recursively, what
that reads), a literal constant ``name = <repr>``. The compiler, not a guess over the
syntax, says which names a function reads as globals (its ``LOAD_GLOBAL``/``LOAD_NAME``
instructions), so a local that shadows a global is never shipped.

A function defined in ``__main__`` (a script, an IPython or Jupyter cell, whose source
``linecache`` holds) ships like any other. Anything whose meaning is not in source text —
a lambda, a builtin, a method, a decorated function, a global or closure variable holding
a live object (an open file, an array, a model) — is refused with one line naming it.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import dataclasses
import dis
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

from qd.contract import ConfigError

FIELD = "evaluate"  # the argument a refusal names: ``qd.optimize``'s and the tasks' ``evaluate``
_LITERALS = (int, float, complex, str, bytes, bool, type(None))
_FIX = "define it with def at the top of a file or notebook cell, and build live objects inside it"


@dataclasses.dataclass(frozen=True)
class Shipped:
    """A function as a self-contained module: ``source`` defines ``name`` and everything it reads."""

    source: str
    name: str


def ship(fn: Callable[..., Any] | Shipped) -> Shipped:
    """``fn`` as a module text that runs without the caller's process (see the module doc);
    a ``ConfigError`` on ``evaluate`` naming what cannot be shipped."""
    if isinstance(fn, Shipped):
        return fn
    _check_shippable(fn)
    module = _Module(fn.__globals__, _closure_of(fn))
    module.add_definition(fn.__name__, fn)
    source = "\n".join(["from __future__ import annotations", *module.lines()]) + "\n"
    compile(source, f"<shipped {fn.__name__}>", "exec")  # what was put together must parse
    return Shipped(source, fn.__name__)


def _refuse(problem: str, fix: str = _FIX) -> ConfigError:
    return ConfigError(FIELD, problem, fix)


def _check_shippable(fn: Any) -> None:
    """A plain ``def`` function whose source can be read: nothing else has its meaning in text."""
    what = getattr(fn, "__qualname__", None) or type(fn).__name__
    if inspect.ismethod(fn):
        raise _refuse(f"{what} is a bound method: its object cannot be shipped into the sandbox")
    if inspect.isbuiltin(fn) or not inspect.isfunction(fn):
        raise _refuse(f"{what} ({type(fn).__name__}) is not a Python function with source to ship")
    if fn.__name__ == "<lambda>":
        raise _refuse("a lambda cannot be shipped into the sandbox (its source is not a definition)")
    if inspect.iscoroutinefunction(fn):
        raise _refuse(f"{what} is an async def: the evaluation calls it plainly", "define it with def")


def _closure_of(fn: types.FunctionType) -> dict[str, Any]:
    """The values of the variables ``fn`` closes over (shipped as the constants they hold)."""
    cells = fn.__closure__ or ()
    values = {}
    for name, cell in zip(fn.__code__.co_freevars, cells):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled: nothing to ship
            raise _refuse(f"{fn.__name__} closes over {name!r}, which has no value yet") from None
    return values


def _definition_source(name: str, obj: Any) -> str:
    """The ``def``/``class`` source of ``obj``, dedented (a nested function's too), undecorated."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as e:  # no file or cell; a nested def that does not dedent
        raise _refuse(
            f"the source of {name} cannot be read ({type(e).__name__}: {e})",
            "define it at the top of a .py file or a notebook cell",
        ) from None
    node = tree.body[0] if tree.body else None
    if (
        not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        or node.name != obj.__name__
    ):
        raise _refuse(f"the source of {name} is not a def or class statement", _FIX)
    if node.decorator_list:
        raise _refuse(
            f"{name} is decorated: a decorator's wrapper cannot be shipped", "ship the undecorated function"
        )
    return source


def _globals_read(source: str) -> list[str]:
    """The names ``source`` (one definition) reads as globals, in first-read order."""
    code = compile(source, "<ship>", "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    names: dict[str, None] = {}
    stack = [code]
    while stack:
        c = stack.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.setdefault(ins.argval, None)
        stack.extend(reversed([k for k in c.co_consts if isinstance(k, types.CodeType)]))
    return list(names)


def _is_literal(value: Any) -> bool:
    """A value whose ``repr`` reads back as itself: literals, in tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    if not isinstance(value, _LITERALS):
        return False
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):  # nan, inf
        return False


def _importable_as(value: Any) -> str | None:
    """``module`` or ``module:qualname`` under which another process imports ``value``, if any."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
        return name if name != "__main__" and sys.modules.get(name) is value else None
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or module == "__main__" or "." in qualname or "<" in qualname:
        return None
    return f"{module}:{qualname}" if getattr(sys.modules.get(module), qualname, None) is value else None


class _Module:
    """The shipped module being put together: imports, constants and definitions, each once,
    a definition after what it reads (a class's bases exist before it)."""

    def __init__(self, namespace: dict[str, Any], closure: dict[str, Any]):
        self.namespace, self.closure = namespace, closure
        self.module_name = namespace.get("__name__")
        self.imports: dict[str, str] = {}
        self.constants: dict[str, str] = {}
        self.definitions: dict[str, str] = {}  # in the order they must run
        self.pending: set[str] = set()  # definitions whose reads are being added (recursion ends here)

    def lines(self) -> list[str]:
        return [*self.imports.values(), *self.constants.values(), *self.definitions.values()]

    def add_definition(self, name: str, obj: Any) -> None:
        self.pending.add(name)
        source = _definition_source(name, obj)
        for read in _globals_read(source):
            if read != name:
                self.add_global(read, by=name)
        self.definitions[name] = source

    def add_global(self, name: str, by: str) -> None:
        """What ``by`` reads as ``name``: a closure's value first, then the module's, then a builtin."""
        if name.startswith("__") or any(
            name in known for known in (self.pending, self.definitions, self.imports, self.constants)
        ):
            return
        if name in self.closure:
            value = self.closure[name]
        elif name in self.namespace:
            value = self.namespace[name]
        else:  # a builtin, or a name the function never defines (it fails in the sandbox as it would here)
            return
        if value is getattr(builtins, name, object()):
            return
        if _is_literal(value):
            self.constants[name] = f"{name} = {value!r}"
        elif (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == self.module_name:
            if inspect.isfunction(value):
                _check_shippable(value)
                if value.__closure__:
                    raise _refuse(
                        f"{by} reads {name}, a function with a closure (define it at the top level)"
                    )
            self.add_definition(name, value)
        elif target := _importable_as(value):
            module, _, qualname = target.partition(":")
            if not qualname:
                self.imports[name] = f"import {module}" if module == name else f"import {module} as {name}"
            else:
                alias = "" if qualname == name else f" as {name}"
                self.imports[name] = f"from {module} import {qualname}{alias}"
        else:
            raise _refuse(
                f"{by} reads {name!r}, a {type(value).__name__} that cannot be shipped into the sandbox "
                "(only imports, functions and classes of its module, and literal constants can)",
                f"build {name} inside {by}, or make it a literal constant",
            )
