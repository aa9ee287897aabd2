"""Who is to blame for an entry's exception: the candidate, or the harness (its entry, its evaluator)."""

from __future__ import annotations

import ast
import importlib.util
import json

import pytest

from qd.sandbox.protocol import HARNESS, harness_failure, raised_by_candidate


def blame(entry, text: str, cwd: str) -> bool:
    """As the sandbox's child calls an entry: its frame first, then the entry's."""
    try:
        entry(text)
    except Exception as e:
        return raised_by_candidate(e, cwd)
    raise AssertionError("the entry did not raise")


def compiled(text: str) -> None:
    """function_fit's way: the candidate compiled under a name that is no file, then called."""
    namespace: dict = {}
    exec(compile(ast.parse(text), "candidate.py", "exec"), namespace)
    if "f" not in namespace:
        raise NameError("the program defines no function f(x)")
    namespace["f"](1.0)


def imports_in_its_body(text: str) -> None:
    import no_such_module_of_the_harness  # noqa: F401


def harness_bug(text: str) -> None:
    json.loads("{")  # raised in the standard library, with no candidate frame on the stack


@pytest.mark.parametrize(
    "entry, text, candidates",
    [
        (compiled, "def f(x)\n    return x", True),  # a syntax error in its text
        (compiled, "def f(x):\n    return 1 / 0", True),  # raised in its own code
        (compiled, "def f(x):\n    return json.loads('{')", True),  # a NameError in its code
        (compiled, "import json\ndef f(x):\n    return json.loads('{')", True),  # its frame is on the stack
        (compiled, "def g(x):\n    return x", True),  # the entry's verdict, raised in its own frame
        (imports_in_its_body, "", False),
        (harness_bug, "", False),
    ],
)
def test_a_failure_is_the_candidates_only_when_its_code_or_the_entrys_verdict_raised_it(
    tmp_path, entry, text, candidates
):
    assert blame(entry, text, str(tmp_path)) is candidates


def test_a_program_the_entry_wrote_under_the_working_directory_is_the_candidates(tmp_path):
    """OpenEvolve's way: the evaluator (a harness file elsewhere) imports the program from the
    run's working directory; a failure at the evaluator's own import is the harness's."""
    work, harness = tmp_path / "work", tmp_path / "harness"
    work.mkdir(), harness.mkdir()
    evaluator = harness / "evaluator.py"
    evaluator.write_text(
        "import importlib.util\n"
        "def evaluate(path):\n"
        "    spec = importlib.util.spec_from_file_location('program', path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
    )

    def entry(text: str) -> None:
        program = work / "program.py"
        program.write_text(text)
        spec = importlib.util.spec_from_file_location("stop_blame_evaluator", evaluator)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.evaluate(str(program))

    assert blame(entry, "raise RuntimeError('mine')", str(work)) is True
    evaluator.write_text("import no_such_module_of_the_evaluator\n")
    assert blame(entry, "x = 1", str(work)) is False


def test_a_harness_failure_is_told_by_its_prefix():
    assert harness_failure(f"{HARNESS}run: ModuleNotFoundError: x") and HARNESS == "harness: "
    assert not harness_failure("run: SyntaxError: invalid syntax") and not harness_failure(None)
