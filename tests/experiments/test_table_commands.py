"""Every README table reproduces from the command printed above it (issue 30).

A table command is a fenced line of an experiment's README that runs one of its ``*table.py``
scripts; the one marked ``# the table below`` made the README's table. For each, with no model
run: the script exists, its own parser (``qd.tables.arguments``, stopped right after parsing)
accepts every flag, and its overrides compose and validate into a plan as a run of the table
would; the marked one's JSON (``<script>.json`` beside the README) exists, is cited, records the
command's seeds, budget and held-out size, and the script's own ``markdown`` rendering of it —
every row name and number — is in the README. A command quoted in the README's prose must be
one of the fenced ones, so the results never name settings the printed command lacks. The
README's fenced ``qd-run`` lines compose too.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
from pathlib import Path

import pytest

from qd import tables
from qd.plan import compose, plan

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
MARK = "the table below"
SCRIPT = re.compile(r"python (experiments/[\w/]+table\.py)")


class Parsed(Exception):
    """Raised by the spy in place of running the table: what the script's parser made of the argv."""

    def __init__(self, experiment: str, options):
        super().__init__(experiment)
        self.experiment, self.options = experiment, options


def fenced_lines(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line.strip())
    return lines


def table_commands(readme: Path) -> list[tuple[str, str]]:
    """(the command, its comment) for each fenced table line; the comment says whether it made the table."""
    return [
        (" ".join(shlex.split(line, comments=True)), line.partition("#")[2].strip())
        for line in fenced_lines(readme.read_text())
        if SCRIPT.match(line)
    ]


COMMANDS = [
    pytest.param(readme, command, comment, id=f"{readme.parent.name}: {command[len('python ') :]}")
    for readme in sorted(EXPERIMENTS.glob("*/README.md"))
    for command, comment in table_commands(readme)
]


def parse(command: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> Parsed:
    """Runs the command's script as ``__main__`` until its parser has read the argv (nothing else runs)."""
    argv = shlex.split(command)
    real = tables.arguments

    def spy(experiment, argv, *args, **kwargs):
        raise Parsed(experiment, real(experiment, argv, *args, **kwargs))

    monkeypatch.setattr(tables, "arguments", spy)
    monkeypatch.setattr("sys.argv", [argv[1], *argv[2:], "--out", str(out)])
    script = EXPERIMENTS.parent / argv[1]
    assert script.is_file(), f"{argv[1]} does not exist"
    with pytest.raises(Parsed) as parsed:
        runpy.run_path(str(script), run_name="__main__")
    return parsed.value


def renderer(script: Path):
    """The script's ``markdown(result)``, or ``qd.design_table``'s when the script only calls its ``main``."""
    namespace = runpy.run_path(str(script), run_name="table_module")
    return namespace.get("markdown") or namespace["design_table"].markdown


def test_every_table_script_has_a_command_that_made_its_table():
    marked = {
        SCRIPT.match(c)[1]
        for r in EXPERIMENTS.glob("*/README.md")
        for c, comment in table_commands(r)
        if comment.startswith(MARK)
    }
    scripts = {str(p.relative_to(EXPERIMENTS.parent)) for p in EXPERIMENTS.glob("*/*table.py")}
    assert scripts and scripts <= marked, f"no '{MARK}' command for {sorted(scripts - marked)}"


def check_table(readme: Path, script: Path, result: dict, args, budget: int) -> None:
    """The marked command's JSON records its settings, and every line the script renders of it is shown."""
    assert result["seeds"] == args.seeds
    assert result["max_llm_calls"] == budget
    assert result.get("held_out_items") == getattr(args, "held_out", None)
    shown = set(readme.read_text().splitlines())
    missing = [line for line in renderer(script)(result).splitlines() if line.strip() and line not in shown]
    assert not missing, f"{script.stem}.json renders lines the README's table lacks: {missing}"


@pytest.mark.parametrize("readme, command, comment", COMMANDS)
def test_a_table_command_parses_and_composes(readme, command, comment, tmp_path, monkeypatch):
    parsed = parse(command, tmp_path, monkeypatch)
    overrides = tables.shared_overrides(parsed.experiment, parsed.options, "http://127.0.0.1:1/v1", "model")
    budget = plan(compose(overrides)).cfg.runner.max_llm_calls
    if not comment.startswith(MARK):
        return
    script = EXPERIMENTS.parent / shlex.split(command)[1]
    cited = script.with_suffix(".json")
    assert f"`{cited.name}`" in readme.read_text(), (
        f"{readme.parent.name}'s README does not cite {cited.name}"
    )
    assert cited.is_file(), f"{cited} is not committed"
    check_table(readme, script, json.loads(cited.read_text()), parsed.options, budget)


RUNS = [
    pytest.param(line, id=f"{readme.parent.name}: {line}")
    for readme in sorted(EXPERIMENTS.glob("*/README.md"))
    for line in fenced_lines(readme.read_text())
    if line.startswith("qd-run ")
]


@pytest.mark.parametrize("command", RUNS)
def test_a_run_command_beside_a_table_composes(command):
    """The README's ``qd-run`` lines (its default runs are measured by them) name keys the config has."""
    assert compose(shlex.split(command, comments=True)[1:]).experiment.task


@pytest.mark.parametrize("readme", sorted(EXPERIMENTS.glob("*/README.md")), ids=lambda r: r.parent.name)
def test_a_command_quoted_in_the_results_is_the_printed_one(readme):
    printed = {command for command, _ in table_commands(readme)}
    quoted = re.findall(r"`(python experiments/[^`]*table\.py[^`]*)`", readme.read_text())
    stray = [" ".join(q.split()) for q in quoted if " ".join(q.split()) not in printed]
    assert not stray, f"quoted but not printed above the table: {stray}"


def test_the_checks_catch_a_command_and_a_table_that_differ(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(
        "```bash\npython experiments/prompt_evolution/table.py --seeds 0 1  # the table below\n```\n"
        "Measured with `python experiments/prompt_evolution/table.py --seeds 0 1\nmeta.evolve_every=6`.\n"
    )
    with pytest.raises(AssertionError, match="quoted but not printed"):
        test_a_command_quoted_in_the_results_is_the_printed_one(readme)
    ((command, comment),) = table_commands(readme)
    with pytest.raises(AssertionError, match="does not cite"):
        test_a_table_command_parses_and_composes(readme, command, comment, tmp_path, monkeypatch)
    with pytest.raises(SystemExit):  # argparse refuses a flag the script does not take
        parse("python experiments/prompt_evolution/table.py --budget 90", tmp_path, monkeypatch)
    with pytest.raises(Exception, match="Could not override"):  # hydra refuses a key the config lacks
        test_a_table_command_parses_and_composes(
            readme, command.replace("--seeds", "meta.evolve_everyx=6 --seeds"), "", tmp_path, monkeypatch
        )
    real = EXPERIMENTS / "prompt_evolution"
    result = json.loads((real / "table.json").read_text())
    marked = next(c for c, comment in table_commands(real / "README.md") if comment.startswith(MARK))
    args = parse(marked, tmp_path, monkeypatch).options
    check_table(real / "README.md", real / "table.py", result, args, result["max_llm_calls"])
    result["rows"][0]["held_out_accuracy"] += 0.5
    with pytest.raises(AssertionError, match="renders lines the README's table lacks"):
        check_table(real / "README.md", real / "table.py", result, args, result["max_llm_calls"])
