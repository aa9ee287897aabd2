"""A prompt optimized on the shipped 60-row dataset with the real embedded SmolLM2: no test row
reaches any stored text (candidates, their model calls, the response cache), and the run opens in
``qd show`` and exports with ``qd export --kind sft``."""

import json

import pytest
from helpers import run_config, stored

from qd import cli
from qd.data import dataset_task
from qd.plan import compose
from qd.store import Store


@pytest.mark.slow
def test_a_prompt_on_arith60_with_the_real_model(tmp_path, llama_server, capsys):
    run = tmp_path / "run"
    summary = run_config(
        compose(
            [
                "experiment=prompt_evolution",
                "experiment.dataset=arith60",
                "experiment.metric=numeric",
                "experiment.params.minibatch=2",
                "experiment.params.splits=[0.8,0.1,0.1]",  # 48 / 6 / 6 rows
                "llm.provider=server",
                f"llm.base_url={llama_server.base_url}",
                f"llm.models=[{{name: {llama_server.model}}}]",
                "llm.api_key_env=null",
                "descriptor=task",
                "meta=none",
                "archive.bins=[4,4]",
                "archive.upper=[40.0,400.0]",
                "runner.progress=false",
                "experiment.params.solver_max_tokens=32",  # the answers are numbers
                "eval_llm.max_tokens=32",
                "runner.initial_population=1",  # one founder (8 calls) and one child (9)
                "runner.batch_size=1",
                "runner.max_llm_calls=17",
            ]
        ),
        run,
    )
    assert 0 < summary["llm"]["calls"] <= 17
    rows = stored(run)
    assert len(rows) == 2 and all(c.valid for c in rows if c.operator == "init")
    assert all(
        "validation" in c.metrics and set(c.metrics["row_scores"]["train"])
        for c in rows
        if c.operator == "init"
    )
    texts = []
    with Store(run / "store.sqlite", readonly=True) as store:
        for c in rows:
            texts += [c.text or "", c.prompt or "", c.response or "", json.dumps(c.artifacts or {})]
            texts += [json.dumps(store.traces.of(c.id))]
    texts += [p.read_text() for p in (run / "llm_cache").glob("answers-*.log")]  # every answer
    test_rows = dataset_task(["x"], "arith60", "numeric", minibatch=2, splits=(0.8, 0.1, 0.1)).splits.test
    assert len(test_rows) == 6 and texts
    assert not [row.id for row in test_rows if any(row.input in t for t in texts)]

    cli.main(["show", str(run)])
    assert "elite" in capsys.readouterr().out.lower()
    out = tmp_path / "sft.jsonl"
    cli.main(["export", str(run), "--kind", "sft", "--out", str(out)])
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert exported and not [r for r in exported for row in test_rows if row.input in json.dumps(r)]
