"""``qd.tables``: what every experiment table shares (its command line and the overrides of its runs)."""

from pathlib import Path

from qd import tables


def test_the_command_line_has_the_shared_defaults_and_makes_the_output_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = tables.arguments("red_team", [], held_out=12)
    assert (a.seeds, a.max_llm_calls, a.held_out, a.base_url) == ([0, 1, 2], None, 12, None)
    assert a.out == Path("outputs") / "red_team" / "table" and a.out.is_dir()
    b = tables.arguments("x", ["--seeds", "4", "--out", str(tmp_path / "t"), "eval_llm.calls=2"])
    assert (b.seeds, b.out, b.overrides) == ([4], tmp_path / "t", ["eval_llm.calls=2"])
    own_budget = tables.arguments("red_team", ["--out", str(tmp_path)], held_out=None, max_llm_calls=80)
    assert own_budget.max_llm_calls == 80 and not hasattr(own_budget, "held_out")  # no held-out problems


def test_every_run_of_a_table_shares_the_server_the_cache_and_the_budget(tmp_path):
    a = tables.arguments("agent_design", ["--out", str(tmp_path), "--max-llm-calls", "30", "seed=9"])
    shared = tables.shared_overrides("agent_design", a, "http://h:1/v1", "m")
    assert shared[0] == "experiment=agent_design"
    assert {"llm.base_url=http://h:1/v1", "llm.models=[{name: 'm'}]", "llm.api_key_env=null"} <= set(shared)
    assert f"llm.cache_dir={tmp_path / 'llm_cache'}" in shared
    assert shared[-2:] == ["seed=9", "runner.max_llm_calls=30"]  # the budget binds over the overrides
    no_budget = tables.shared_overrides(
        "agent_design", tables.arguments("x", ["--out", str(tmp_path)]), "u", "m"
    )
    assert not any(s.startswith("runner.max_llm_calls") for s in no_budget)
