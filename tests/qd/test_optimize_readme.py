"""The README's "Your own problem" examples, each at most 10 lines of Python (blank lines, which
the formatter puts around a function, not counted), run against a scripted server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import sums_or, varied_program
from scripted_llm import Rule

README = Path(__file__).resolve().parents[2] / "README.md"
MODEL = 'llm="vllm"'  # the examples' model; the test's scripted server takes its place


def examples() -> list[str]:
    section = re.search(r"^## Your own problem\n(.*?)^## ", README.read_text(), re.S | re.M)
    assert section, "README.md has no 'Your own problem' section"
    return re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)


def proposal(request: dict) -> str:
    """An operator's answer: a new program, or a new prompt."""
    if "program" in request["messages"][0]["content"]:
        return varied_program(request)
    return "Prompt: Answer with the number only."


def test_the_readme_has_two_examples_of_at_most_ten_lines():
    blocks = examples()
    lines = [[line for line in b.splitlines() if line.strip()] for b in blocks]
    assert len(blocks) == 2 and [len(code) <= 10 for code in lines] == [True, True]
    assert all(MODEL in b and "qd.optimize(" in b for b in blocks)


@pytest.mark.parametrize("index", [0, 1], ids=["prompt_on_a_dataset", "program_with_evaluate"])
def test_a_readme_example_prints_its_best_candidate_and_heldout_score(
    index, scripted_llm, monkeypatch, tmp_path, capsys
):
    monkeypatch.chdir(tmp_path)  # the run directory goes to ./runs
    server = scripted_llm([Rule("", sums_or(proposal))])
    code = examples()[index].replace(MODEL, f"base_url={server.base_url!r}, model='scripted'")
    path = tmp_path / f"readme_{index}.py"
    path.write_text(code)  # a file, as a user's script: evaluate's source is read from it
    exec(compile(code, str(path), "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "store.sqlite").exists()
    if index == 0:
        best, heldout = printed.strip().splitlines()
        assert best in ("Answer the question.", "Answer with the number only.")
        score, (low, high) = eval(heldout)
        assert score == 1.0 and low <= score <= high  # the scripted solver answers every test row
    else:
        assert "def f(x):" in printed and printed.strip().endswith("None")  # no test split: no held-out score
