"""The persistent compilation cache: where it lives, and that a second run compiles nothing."""

from pathlib import Path

import pytest
from helpers import qd_run

from qd.compile_cache import folder

MISS = "PERSISTENT COMPILATION CACHE MISS"  # JAX's log line per program compiled anew
HIT = "Persistent compilation cache hit"


def test_the_folder_follows_xdg_and_the_switch(tmp_path):
    home = Path.home()
    assert folder({}) == home / ".cache" / "qd" / "jax"
    assert folder({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "qd" / "jax"
    assert folder({"XDG_CACHE_HOME": "relative/dir"}) == home / ".cache" / "qd" / "jax"  # XDG ignores it
    assert folder({"QD_COMPILE_CACHE": str(tmp_path / "x"), "XDG_CACHE_HOME": "/y"}) == tmp_path / "x"
    for off in ("0", "off", "OFF", "false"):
        assert folder({"QD_COMPILE_CACHE": off, "XDG_CACHE_HOME": str(tmp_path)}) is None


@pytest.mark.slow
def test_a_second_sphere_run_compiles_nothing_new(tmp_path, monkeypatch):
    cache = tmp_path / "jax"
    monkeypatch.setenv("QD_COMPILE_CACHE", str(cache))
    monkeypatch.setenv("JAX_EXPLAIN_CACHE_MISSES", "1")  # a persistent-cache miss is logged as a warning
    monkeypatch.setenv("JAX_LOG_COMPILES", "1")  # and so is a hit
    logs = []
    for name in ("first", "second"):
        proc = qd_run(
            "experiment=sphere",
            "experiment.params.dim=10",
            "runner.batch_size=32",
            "runner.max_evaluations=320",
            "runner.generations_per_call=4",
            "runner.progress=false",
            f"hydra.run.dir={tmp_path / name}",
            cwd=tmp_path,
        )
        logs.append(proc.stdout + proc.stderr)
    first, second = logs
    compiled = first.count(MISS)
    assert compiled >= 1 and "jit(run)" in first  # the fused step was compiled and written
    assert len(list(cache.iterdir())) == compiled
    assert second.count(MISS) == 0, [line for line in second.splitlines() if MISS in line]
    assert second.count(HIT) == compiled
