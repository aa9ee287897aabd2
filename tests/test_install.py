"""The built wheel in a fresh virtual environment, with no extras and openai at its declared floor.

One environment for the whole session (``lean_env``): the wheel built from the
checkout's files (what a clean clone holds), installed from the package index
without extras, every package whose private API qd touches (``FLOOR_PINNED``)
pinned to the lower bound the wheel declares. In it: ``qd-run experiment=sphere``
and a function_fit run against the scripted server work (so the core really is
enough, and nothing imports an extra's package on the way); each missing extra
is one line naming the extra and its pip command; and one call goes through
``LLMClient`` with openai at its floor, so the floor is one the code works with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import varied_program
from packaging.version import Version
from scripted_llm import Rule, ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
# Installed at the lower bound the wheel declares, not the newest: qd reaches into their internals
# (qd/llm/http.py, qd/llm/loopback.py), which is where a false floor breaks first.
FLOOR_PINNED = ("openai", "httpx", "httpx2")
# What each extra's absence looks like: the command (RUN: a finished run directory), the extra.
SERVER = ["llm.provider=server", "llm.base_url=http://127.0.0.1:9/v1", "llm.models=[{name: m}]"]
MISSING = {
    "embeddings": ["qd-run", "experiment=function_fit", *SERVER, "descriptor=embedding"],
    "local": ["qd-run"],
    "ray": ["qd-run", "experiment=function_fit", *SERVER, "runner=ray"],
    "plot": ["qd", "plot", "RUN"],
    "explore": ["qd", "explore", "RUN"],
    "export": ["qd", "export", "RUN", "--kind", "elites", "--format", "parquet"],
}


@dataclasses.dataclass(frozen=True)
class Env:
    """A virtual environment with ``wheel`` installed, and a folder outside the checkout to run in."""

    bin: Path
    cwd: Path
    wheel: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``args[0]`` from the environment's bin folder; the checkout is nowhere on the path."""
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            cwd=self.cwd,
            env=outside(self.bin),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def outside(bin: Path | None = None) -> dict[str, str]:
    """This process's environment without the checkout on the path (the suite runs with
    ``PYTHONPATH`` at the checkout, whose ``qd_engine.egg-info`` pip would take for an
    installed qd), ``bin`` first on ``PATH``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if bin is not None:
        env["PATH"] = f"{bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def checkout_files() -> list[str]:
    """The files a clone of this checkout holds (tracked, and new ones git does not ignore)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def floor_pins(wheel: Path) -> list[str]:
    """``name==floor`` for each ``FLOOR_PINNED`` core dependency that the wheel declares with ``>=``."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    pins = []
    for line in lines:
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*\(?([^;]*?)\)?\s*(;.*)?$", line)
        if m and m[3] is None and m[1].lower() in FLOOR_PINNED:
            floor = re.search(r">=\s*([\w.]+)", m[2])
            assert floor, f"{line}: a package qd reaches into needs a declared floor"
            pins.append(f"{m[1]}=={floor[1]}")
    return pins


@pytest.fixture(scope="session")
def lean_env(tmp_path_factory) -> Env:
    """The wheel of this checkout, no extras, floors pinned, in a fresh (isolated) virtual environment."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    for name in checkout_files():  # a clean copy: no build/ left over from an earlier build
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, env=outside())
    (wheel,) = wheels.glob("qd_engine-*.whl")
    pins = floor_pins(wheel)
    assert any(p.startswith("openai==") for p in pins), pins
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=outside())
    installed = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--prefer-binary",
            "--no-compile",
            str(wheel),
            *pins,
        ],
        capture_output=True,
        text=True,
        env=outside(),
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    cwd = base / "work"
    cwd.mkdir()
    return Env(venv / "bin", cwd, wheel)


@pytest.fixture(scope="session")
def sphere_run(lean_env) -> tuple[subprocess.CompletedProcess, Path]:
    out = lean_env.cwd / "sphere"
    done = lean_env.run("qd-run", "experiment=sphere", "runner.max_evaluations=2048", f"hydra.run.dir={out}")
    return done, out


@pytest.mark.slow
def test_the_core_alone_runs_the_sphere(sphere_run):
    done, out = sphere_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    commits = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["evaluations"] for e in commits if e["event"] == "commit"][-1] == 2048
    assert json.loads((out / "best.json").read_text())["fitness"] > 0


@pytest.mark.slow
def test_the_core_alone_runs_function_fit_against_a_server_to_its_call_budget(lean_env):
    """The LLM path and the sandbox (``python -I`` workers) work from the fresh environment."""
    out = lean_env.cwd / "function_fit"
    with ScriptedLLM([Rule("", reply=varied_program)]) as server:
        done = lean_env.run(
            "qd-run",
            "experiment=function_fit",
            "llm.provider=server",
            f"llm.base_url={server.base_url}",
            "llm.models=[{name: scripted}]",
            "llm.api_key_env=null",
            "runner.max_llm_calls=8",
            "runner.progress=false",
            "runner.workers=2",
            "operators.mix=[{name: rewrite}]",
            f"hydra.run.dir={out}",
        )
        requests = server.stats()["requests"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert requests == 8
    from qd.rundir import RunDir

    with RunDir(out) as run:
        valid = [c for c in run.store.iter() if c.valid and c.text]
    assert len(valid) >= 4  # 1 in 7 scripted answers has no code; the rest evaluate in the sandbox


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(MISSING))
def test_a_missing_extra_is_one_line_naming_it(lean_env, sphere_run, extra):
    command = [sphere_run[1].as_posix() if a == "RUN" else a for a in MISSING[extra]]
    done = lean_env.run(*command)
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert f" needs the {extra} extra: " in line and line.endswith(f'pip install "qd-engine[{extra}]"'), line


FLOOR_CALL = """
import asyncio, json, sys
import openai
from qd.llm import LLMClient, LLMSettings, ModelSpec

client = LLMClient(LLMSettings(base_url=sys.argv[1], models=(ModelSpec("m", price_in=2.0, price_out=10.0),)))

async def main():
    try:
        return await client.complete([{"role": "user", "content": "y" * 400}])
    finally:
        await client.aclose()

c = asyncio.run(main())
ledger = client.ledger.as_dict()
print(json.dumps({
    "openai": openai.__version__, "text": c.text, "tokens": [c.tokens_in, c.tokens_out], "cost": c.cost,
    "calls": ledger["calls"], "failed": ledger["failed_calls"], "retries": ledger["retries"],
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",  # a server on this machine: qd's lean loopback path (qd/llm/loopback.py)
        "127.0.0.2",  # also this machine, but not a name qd treats as loopback: openai's own HTTP client
    ],
)
def test_one_call_through_the_client_works_with_openai_at_its_floor(lean_env, host):
    (pin,) = [p for p in floor_pins(lean_env.wheel) if p.startswith("openai==")]
    with ScriptedLLM([Rule("", reply="x" * 40)], host=host) as server:
        done = lean_env.run("python", "-c", FLOOR_CALL, server.base_url, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert Version(reply["openai"]) == Version(pin.split("==")[1])
    assert (reply["text"], reply["tokens"]) == ("x" * 40, [100, 10])  # the scripted usage: chars / 4
    assert reply["cost"] == pytest.approx((100 * 2.0 + 10 * 10.0) / 1e6)  # the ledger prices the call
    assert (reply["calls"], reply["failed"], reply["retries"]) == (1, 0, 0)


def test_ci_runs_exactly_the_readme_test_command():
    """The README's second command is what CI runs, and it installs every extra and the test tools."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^```bash\n(.*?)\n```", readme, re.S | re.M)[:2]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1] and '".[all,test]"' in ci
    assert '".[local]"' in commands[0] and "torch" not in commands[0]  # the main job needs no embeddings
