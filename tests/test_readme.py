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
    evaluations, commits = re.match(r"(\d+) evaluations, (\d+) commits, qd_score ([\d.e+-]+)", out[0]).groups()[:2]
    written = (Path(namespace["run_dir"]) / "events.jsonl").read_text().count('"event": "commit"')
    assert int(evaluations) == 2048 and int(commits) == written >= 1  # one event per commit, each seen
    assert out[1].startswith("best elite: island 0, cell ")
    assert re.match(r"island 0 holds \d+ elites; best fitness -0\.\d+", out[2])
