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
