"""The README's Python example runs as written, and prints what it says it prints."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    block = re.search(r"^## Python\n.*?^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    assert block, "README.md has no ## Python section with a python block"
    namespace = {"__name__": "readme"}
    exec(compile(block.group(1), str(README), "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    evaluations, commits = re.match(
        r"(\d+) evaluations, (\d+) commits, qd_score ([\d.e+-]+)", out[0]
    ).groups()[:2]
    written = (Path(namespace["run_dir"]) / "events.jsonl").read_text().count('"event": "commit"')
    assert int(evaluations) == 2048 and int(commits) == written >= 1  # one event per commit, each seen
    assert out[1].startswith("best elite: island 0, cell ")
    assert re.match(r"island 0 holds \d+ elites; best fitness -0\.\d+", out[2])


ROOT = README.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")  # [text](target "title")


def bad_links(doc: Path, text: str) -> list[str]:
    """The relative links in ``text`` (the markdown file ``doc``) that name no file in the repository."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks hold no links
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same file
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(f"{doc.relative_to(ROOT)}: {target}")
    return bad


def test_every_relative_link_in_the_docs_names_a_file_in_the_repository():
    docs = [
        README,
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "experiments").rglob("README.md")),
    ]
    assert len(docs) > 5
    assert [bad for doc in docs for bad in bad_links(doc, doc.read_text())] == []


def test_the_link_check_refuses_links_that_leave_the_repository_or_name_nothing():
    doc = ROOT / "docs" / "page.md"
    text = (
        "[design](design.md#the-device-loop) [web](https://example.com) [up](../README.md)\n"
        '[outside](../../elsewhere/NOTES.md) [missing](nothing.md "title")\n```\n[code](not/a/link.md)\n```\n'
    )
    assert bad_links(doc, text) == ["docs/page.md: ../../elsewhere/NOTES.md", "docs/page.md: nothing.md"]


DESIGN = ROOT / "docs" / "design.md"
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:/|\.py))`")  # `qd/loop.py`, `qd/archive/`, `conf/`


def table_column(text: str, header: str) -> list[str]:
    """The cells of column ``header`` in every markdown table of ``text`` that has one."""
    cells, column = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = row.index(header) if header in row else -1
        elif column >= 0 and not set(line) <= set("|-: "):
            cells.append(row[column])
    return cells


def named_paths(text: str, header: str) -> list[str]:
    """The repository paths (backticked, ending in ``/`` or ``.py``) in column ``header``'s cells."""
    return [p for cell in table_column(text, header) for p in PATH.findall(cell)]


def test_every_path_the_readme_package_table_names_exists():
    paths = named_paths(README.read_text(), "package")
    assert len(paths) > 30
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_path_the_design_module_tables_name_exists():
    text = DESIGN.read_text()
    paths = named_paths(text, "module")
    assert len(paths) > 40
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_the_tables_name_every_package_and_top_level_module_of_qd():
    """A new part of ``qd/`` is placed in both tables, where a reader looks for it."""
    parts = {f"qd/{p.parent.name}/" for p in (ROOT / "qd").glob("*/__init__.py")}
    parts |= {f"qd/{p.name}" for p in (ROOT / "qd").glob("*.py") if p.name != "__init__.py"}
    assert len(parts) > 30
    for doc, header in ((README, "package"), (DESIGN, "module")):
        named = set(named_paths(doc.read_text(), header))
        assert sorted(parts - named) == [], doc.name


def test_the_table_check_reads_only_the_named_column_and_refuses_missing_paths():
    text = (
        "| package | what |\n|---|---|\n| `qd/loop.py`, `qd/archive/` | `qd/not_here.py` |\n"
        "| `qd/gone.py` (`init`) | x |\n\nprose `qd/elsewhere.py`\n\n| module | owns |\n|--|--|\n"
        "| `conf/` | y |\n"
    )
    assert named_paths(text, "package") == ["qd/loop.py", "qd/archive/", "qd/gone.py"]
    assert named_paths(text, "module") == ["conf/"]
    assert [p for p in named_paths(text, "package") if not (ROOT / p).exists()] == ["qd/gone.py"]


def test_readme_python_objects_example_runs_within_its_call_budget(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    block = re.search(
        r"^### From Python objects, without a config\n.*?^```python\n(.*?)^```",
        README.read_text(),
        re.S | re.M,
    )
    assert block, "README.md has no 'From Python objects' section with a python block"
    exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme_objects"})
    calls, elites = re.match(r"(\d+) model calls, (\d+) elites", capsys.readouterr().out).groups()
    assert int(calls) == 6 and int(elites) >= 2  # the budget bound the caller's client; children entered


GPU_SECTION = "## Device (GPU) run: bench/device.py --gpu"


def gpu_run_recorded(results: str) -> bool:
    """Whether ``results`` holds ``bench/device.py --gpu``'s section from a GPU: the section's first
    line is the line the run printed first, ``backend=gpu ...`` on a GPU (``--allow-cpu`` runs
    elsewhere record their own backend there)."""
    lines = results.splitlines()
    if GPU_SECTION not in lines:
        return False
    first = next((line for line in lines[lines.index(GPU_SECTION) + 1 :] if line.strip()), "")
    return "backend=gpu " in first


def test_the_readme_calls_the_gpu_path_untested_exactly_while_the_results_hold_no_gpu_run():
    """Until a GPU run's section is in ``bench/RESULTS.md``, the README must not let the GPU path
    pass as tested; once it is, the README must stop calling it untested."""
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    untested = "The GPU path is untested" in README.read_text()
    assert untested != gpu_run_recorded(results)


def test_only_a_gpu_backend_line_first_in_the_gpu_section_counts_as_a_gpu_run():
    def results(first: str, section: str = GPU_SECTION) -> str:
        return f"# Benchmark results\n\n## Other\n\nno backend=gpu figure yet\n\n{section}\n\n{first}\n"

    assert gpu_run_recorded(results("`backend=gpu devices=['NVIDIA H200'] jax=0.4.35 qdax=yes`"))
    assert not gpu_run_recorded(results("`backend=cpu devices=['cpu'] jax=0.10.2 qdax=no`"))
    assert not gpu_run_recorded(results("`backend=gpu devices=['NVIDIA H200']`", "## Another section"))
    assert not gpu_run_recorded("# Benchmark results\n\nno backend=gpu figure yet\n")
