"""``qd-run``: the hydra entry point (single runs, ``-m`` sweeps, ``resume=RUN_DIR``, ``--json``), and
building a run.

A config is validated once into a ``qd.plan.Plan`` (``main`` plans the first job
up front and that job reuses the plan; a resume plans once); ``build_engine``
turns a plan into the run's objects without checking anything again.

A run ends with a few aligned lines (evaluations, coverage, QD score, the model's calls and
cost, why it stopped, where its files are) and its best elite; ``qd-run --json ...`` prints the
summary as one JSON line on stdout instead (one per job of a sweep), for scripts. The progress
goes to stderr either way, and every commit's summary is in the run's ``events.jsonl``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from qd import compile_cache, rundir
from qd.config import Config, schema
from qd.contract import ConfigError
from qd.errors import CheckpointError
from qd.paths import conf_dir
from qd.plan import Plan, as_saved, compose, plan
from qd.report import closing_lines
from qd.rundir import layout, write_results, written_best
from qd.search.build import build_arms, build_strategy
from qd.task import task_params


def build_operators(p: Plan, client: Any = None) -> list[tuple[Any, float]]:
    """(operator, weight) per ``operators.mix`` entry, from the plan's checked entries.

    ``client`` is the LLM client of a text task's operators (None for numeric tasks).
    """
    ops = []
    for o in p.operators:
        if p.task.kind == "vector":
            from operators import make_numeric_operator

            lower, upper = getattr(p.task, "genome_bounds", (-np.inf, np.inf))
            ops.append((make_numeric_operator(o.name, lower, upper, **o.params), o.weight))
        else:
            from operators import build_text_operator

            params = {**o.params, "memory_tokens": p.memory.max_tokens}
            ops.append((build_text_operator(client, params), o.weight))
    return ops


def build_llm(p: Plan, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """The run's LLM client; for provider local, starts the embedded server (stopped by ``stack``)."""
    return start_llm(p.llm, run_dir, stack)


def start_llm(llm: Any, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """The client of a checked ``qd.llm.plan.LLMPlan`` (``qd.optimize`` plans one without a
    config); for provider local, starts the embedded server (stopped by ``stack``)."""
    from qd.llm import LLMClient

    settings = llm.settings
    if llm.provider == "local":
        from qd.llm.server import EmbeddedServer

        local, first = llm.local, settings.models[0]
        server = EmbeddedServer(
            local.model_path,
            log_path=run_dir / layout.LLM_SERVER_LOG,
            alias=first.name,
            n_ctx=local.n_ctx,
            n_threads=local.n_threads,
            startup_timeout_s=local.startup_timeout_s,
        )
        stack.callback(server.stop)
        server.start()
        settings = dataclasses.replace(
            settings, base_url=server.base_url, models=(dataclasses.replace(first, name=server.model),)
        )
    if llm.cache and settings.cache_dir is None:
        settings = dataclasses.replace(settings, cache_dir=str(run_dir / layout.LLM_CACHE))
    return LLMClient(settings)


def _build_evaluator(p: Plan, client: Any, run_dir: Path) -> Any:
    """The plan's evaluator; a task whose evaluation calls the model gets ``client``, within
    ``p.eval_budget``."""
    from qd.evaluator import HostRunner, InProcessEvaluator, PoolEvaluator, StagedEvaluator  # host runs only

    r = p.cfg.runner
    if p.evaluator == "pool":
        return PoolEvaluator(p.cfg.experiment.task, task_params(p.cfg.experiment), r.workers)
    if p.evaluator == "inprocess":
        return InProcessEvaluator(p.task)
    if p.evaluator == "host":
        runner = HostRunner(p.task.host_entry, r.workers)
    elif r.name == "ray":
        from qd.sandbox.cluster import RaySandbox

        runner = RaySandbox(
            p.task.sandbox_entry,
            limits=p.sandbox,
            address=r.address,
            cpus=r.workers,
            record=run_dir / layout.RAY,
        )
    else:
        from qd.sandbox import Sandbox

        runner = Sandbox(p.task.sandbox_entry, workers=r.workers, limits=p.sandbox)
    models = p.eval_budget is not None
    return StagedEvaluator(p.task, runner, client if models else None, p.eval_budget)


def _in_flight(p: Plan, evaluator: Any, run_dir: Path) -> int:
    """``runner.in_flight``; unset (null, as ``runner=ray`` leaves it): on Ray, enough proposals
    to keep every CPU of the cluster busy (docs/scaling.md), else 2, settled into the run's
    config so that a resume (on a cluster of any size) replays the run as it ran."""
    r = p.cfg.runner
    if r.in_flight is not None:
        return r.in_flight
    n = evaluator.runner.proposals_for(r.batch_size) if r.name == "ray" else 2
    rundir.founding.settle(run_dir, "runner.in_flight", n)
    return n


def build_engine(source: Plan | DictConfig, run_dir: Path, on_commit: Any = None) -> Any:
    """Everything a run needs, from its plan (a config is planned first, once);
    ``on_commit`` is the engine's per-commit callback. A plan on the device loop
    gets a ``qd.device.driver.DeviceEngine`` (the same ``run``/``close``/``on_close``).

    For text tasks this starts the LLM (the embedded server for ``llm=local``)
    and the sandbox; ``Engine.close`` stops them. Nothing is checked again here.
    """
    p = source if isinstance(source, Plan) else plan(source)
    cfg, r = p.cfg, p.cfg.runner
    compile_cache.enable()  # before anything compiles: the fused step's executable, once per machine
    spec = rundir.create(p, run_dir)  # config.yaml, archive.json, centroids.npy: what resume and readers need
    if p.loop == "device":
        from qd.device.driver import build

        engine = build(p, spec, build_operators(p), run_dir, on_commit)
        engine.on_close(lambda: write_results(run_dir))
        return engine
    from qd.assembly import Settings, assemble
    from qd.loop import Engine  # the host loop (and the model client) load only for host runs

    with contextlib.ExitStack() as stack:
        client = build_llm(p, run_dir, stack) if p.llm is not None else None
        evaluator = _build_evaluator(p, client, run_dir)
        stack.callback(getattr(evaluator, "close", lambda: None))
        arms = build_arms(p.strategy, [op for op, _ in build_operators(p, client)])
        settings = Settings(
            islands=cfg.islands.count,
            batch_size=r.batch_size,
            in_flight=_in_flight(p, evaluator, run_dir),
            checkpoint_every=r.checkpoint_every,
            seed=cfg.seed,
            initial_population=r.initial_population,
            qd_offset=cfg.archive.qd_offset,
            progress=r.progress,
            stop=p.stop,
        )
        parts = assemble(
            task=p.task,
            spec=spec,
            operators=arms,
            evaluator=evaluator,
            run_dir=run_dir,
            llm=client,
            describer=p.describer,
            strategy=build_strategy(p.strategy),
            budget=p.budget,
            settings=settings,
            memory=p.memory,
            on_commit=on_commit,
        )
        engine = Engine(parts)
        engine.on_close(stack.pop_all().close)
    engine.on_close(lambda: write_results(run_dir))  # every run ends with its elites.jsonl and best.<ext>
    return engine


def run_in(p: Plan, run_dir: Path, as_json: bool = False) -> dict[str, Any]:
    """Runs (or continues) the planned experiment in ``run_dir`` and prints how it ended: a few
    aligned lines and the best elite, or with ``as_json`` (``qd-run --json``) the summary as one
    JSON line, with the run's directory, loop and store."""
    engine = build_engine(p, run_dir)
    try:
        summary = engine.run()
    finally:
        engine.close()
    if as_json:
        print(json.dumps({"run_dir": str(run_dir), "loop": p.loop, "store": p.store, **summary}))
    else:
        with rundir.RunDir(run_dir) as run:
            valid = run.store.count(valid=True) if run.store.keeps_every_candidate() else None
        print("\n".join(closing_lines(summary, run_dir, p.budget, valid)))
        print_best(written_best(run_dir), run_dir)
    if summary.get("stop_reason"):
        print(f"qd-run: stopped: {summary['stop_reason']}", file=sys.stderr)
        raise SystemExit(1)
    return summary


def print_best(best: dict[str, Any] | None, run_dir: Path) -> None:
    """What the run found: the best elite (its text, or a vector's fitness and descriptor),
    where it sits, where it was saved, and the commands that look further."""
    if best is None:
        print("best: none (the archive is empty: no valid candidate was found)")
        return
    made = f"{best['operator']}" + (f" by {best['model']}" if best.get("model") else "")
    print(
        f"best: fitness={best['fitness']:.6g} island={best['island']} cell={best['cell']} id={best['id']} "
        f"({best['genome']}, {made})"
    )
    print("  descriptor=" + json.dumps([round(x, 4) for x in best["descriptor"]]))
    if "text" in best:
        print(f"----- {best['path']} -----\n{best['text'].rstrip()}\n-----")
    else:
        print(f"  saved to {best['path']}")
    print(
        f"look further: qd show {run_dir} | qd lineage {run_dir} {best['id']} | qd stats {run_dir} | "
        f"qd plot {run_dir} | qd explore {run_dir}"
    )


_validated: tuple[DictConfig, Plan] | None = None  # main()'s plan of the first job, until that job takes it


def _hydra_task(cfg: DictConfig, as_json: bool = False) -> None:
    global _validated
    checked, _validated = _validated, None
    # main() planned the first job's config already: that job reuses the plan (each config is validated once)
    _run_planned(checked[1] if checked is not None and checked[0] == cfg else plan(cfg), as_json)


def _run_planned(p: Plan, as_json: bool) -> None:
    """A hydra job's run of plan ``p``, in the job's output folder."""
    from hydra.core.hydra_config import HydraConfig

    # Hydra logs at INFO; JAX's backend probing (no TPU here) and a line per HTTP
    # request are noise to a user (the ledger and events.jsonl hold the numbers).
    for name in ("jax._src.xla_bridge", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    run_in(p, Path(HydraConfig.get().runtime.output_dir), as_json)


def _single_job(argv: list[str]) -> bool:
    """The command line is one run's overrides (``--config-dir`` aside): no sweep (``-m``,
    ``hydra.mode``), no help or config printing, no other hydra flag."""
    args = iter(argv)
    for a in args:
        flag, eq, _ = a.partition("=")
        if flag in ("--config-dir", "-cd"):
            if not eq:
                next(args, "")
        elif a.startswith("-") or flag == "hydra.mode":
            return False
    return True


def _without_hydra(job: DictConfig) -> DictConfig:
    """The run's config of a job composed with hydra's section (what hydra hands a task)."""
    cfg = copy.deepcopy(job)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _run_single(job: DictConfig, p: Plan, as_json: bool) -> None:
    """Runs a single job as ``hydra.main`` would (its output folder, ``.hydra/`` files, log file,
    error report), from the config composed and planned up front: hydra.main would compose it
    twice more (once to learn its mode, once to run), each as long as the run of a small
    numeric experiment."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode

    with open_dict(job.hydra):
        job.hydra.mode = RunMode.RUN

    def run() -> None:
        done = run_job(
            task_function=lambda _cfg: _run_planned(p, as_json),
            config=job,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
            hydra_context=HydraContext(config_loader=None, callbacks=Callbacks(job)),
        )
        _ = done.return_value  # raises the run's exception, as hydra.main does

    run_and_report(run)


def one_line(error: BaseException) -> str:
    """A config/compose error squeezed to one line: the field, the problem, the fix."""
    if isinstance(error, ConfigError):
        return str(error)
    chain = [error]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    for e in chain:
        if isinstance(e, OmegaConfBaseException) and getattr(e, "full_key", None):
            msg = str(getattr(e, "msg", None) or e).splitlines()[0]
            if re.match(r"Key '.*' not in '.*'", msg) or "not in struct" in msg:
                return f"{e.full_key}: unknown config key ({_known_keys(e.full_key)})"
            return f"{e.full_key}: {msg}"
    text = " ".join(str(error).split())
    missing = re.search(
        r"Could not find '([\w/]+)/([^']+)' Available options in '[^']+': (.*?) Config search", text
    )
    if missing:
        group, name, options = missing.groups()
        return f"{group}: no config {name!r} (available: {', '.join(options.split())})"
    text = re.sub(r"\s*(Config search path|Set the environment variable HYDRA_FULL_ERROR).*", "", text)
    return text


def _known_keys(full_key: str) -> str:
    """The valid keys beside a misspelled one, closest first."""
    import difflib

    node: Any = OmegaConf.structured(Config)
    *parents, leaf = re.sub(r"\[\d+\]", "", full_key).split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig):
        return "see `qd-run --cfg job` for every key"
    keys = [str(k) for k in node.keys()]
    close = difflib.get_close_matches(leaf, keys, n=1)
    hint = f"did you mean {'.'.join([*parents, close[0]])}? " if close else ""
    return f"{hint}valid keys here: {', '.join(keys)}"


def _first_of_sweeps(overrides: list[str]) -> list[str]:
    """Replaces each sweep (``a=1,2``) by its first value, to validate one job up front."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    out = []
    for o in parsed:
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()))
            out.append(f"{o.get_key_element()}={first}")
        else:
            out.append(o.input_line)
    return out


def _resume(run_dir: Path, overrides: list[str], config_dirs: list[str], as_json: bool = False) -> None:
    """Continues the run in ``run_dir`` with its saved config; ``overrides`` (the command that
    started it, say) may give it new budgets, and must agree with it on everything else."""
    saved = run_dir / layout.CONFIG
    if (run_dir / layout.OPTIMIZE).exists():  # its evaluator is a Python object in the caller's script
        raise ConfigError(
            "resume",
            f"{run_dir} was made by qd.optimize",
            f"continue it with qd.optimize(..., run_dir={str(run_dir)!r})",
        )
    if not saved.exists():
        raise ConfigError("resume", f"{run_dir} has no config.yaml", "pass a run directory made by qd-run")
    cfg = OmegaConf.merge(schema(), OmegaConf.load(saved))
    given = [o for o in overrides if not o.startswith("resume=")]
    for key, value in (_new_budgets(cfg, given, config_dirs) if given else {}).items():
        OmegaConf.update(cfg, key, value)
    cfg.resume = str(run_dir)
    run_in(plan(cfg), run_dir, as_json)


# What a resumed run may be given anew: its budgets and stop rules ("... with a larger budget").
# Any other setting that differs from the run's would make it another run.
_RENEWABLE = re.compile(r"runner\.(max_\w+|target_fitness|patience|guard_after)")


def _new_budgets(saved: DictConfig, overrides: list[str], config_dirs: list[str]) -> dict[str, Any]:
    """The budgets that ``overrides`` set anew, by dotted key; a ConfigError naming the first
    other setting they give a value the run did not have (the config they compose, compared
    with the run's under each key they name: a group's whole section, a key's value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from qd.task import load_task

    named = [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)]
    cfg = compose(overrides, config_dirs)
    if any(k == "experiment" or k.startswith("experiment.") for k in named):  # saved with absolute paths
        cfg = as_saved(cfg, load_task(cfg.experiment.task, task_params(cfg.experiment)))
    new, old = (_leaves(OmegaConf.to_container(c, resolve=True)) for c in (cfg, saved))
    budgets = {}
    for key in sorted(set(new) | set(old)):
        if key == "resume" or new.get(key) == old.get(key):
            continue
        if key in rundir.founding.SETTLED and new.get(key) is None:  # unset: as the run settled it
            continue
        if key in named and _RENEWABLE.fullmatch(key):
            budgets[key] = new[key]
        elif any(key == k or key.startswith(k + ".") for k in named):
            raise ConfigError(
                key,
                f"differs from the run's ({new.get(key)} ≠ {old.get(key)})",
                "drop it to resume, or start a new run",
            )
    return budgets


def _leaves(node: Any, key: str = "") -> dict[str, Any]:
    """A config's values by dotted key (a list, or an empty section, is one value)."""
    if not isinstance(node, dict) or not node:
        return {key: node}
    return {
        k: v
        for name, value in node.items()
        for k, v in _leaves(value, f"{key}.{name}" if key else str(name)).items()
    }


JSON_FLAG = "--json"  # end each run with its summary as one JSON line on stdout, not the readable lines
_VALUED_FLAGS = (
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--experimental-rerun",
)  # hydra's flags that take a value


def _overrides_and_config_dirs(argv: list[str]) -> tuple[list[str], list[str]]:
    """The command line's config overrides (hydra's own ``hydra.*`` and flags left out),
    and its ``--config-dir``/``-cd`` folders: a flag's value is never an override."""
    overrides, config_dirs = [], []
    args = iter(argv)
    for a in args:
        flag, eq, value = a.partition("=")
        if flag in _VALUED_FLAGS:
            value = value if eq else next(args, "")
            if flag in ("--config-dir", "-cd"):
                config_dirs.append(value)
        elif not a.startswith("-") and not a.startswith("hydra."):
            overrides.append(a)
    return overrides, config_dirs


def main(argv: list[str] | None = None) -> None:
    global _validated
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = JSON_FLAG in argv  # qd-run's own flag: hydra never sees it
    argv = [a for a in argv if a != JSON_FLAG]
    plain, config_dirs = _overrides_and_config_dirs(argv)
    single = _single_job(argv)
    info_only = any(
        a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i") or a.startswith("--cfg")
        for a in argv
    )
    try:
        resume = [a.split("=", 1)[1] for a in plain if a.startswith("resume=")]
        if resume and resume[0] not in ("", "null"):
            _resume(Path(resume[0]), plain, config_dirs, as_json)
            return
        if single:  # composed once, with hydra's section, and run by hydra's job runner below
            composed = compose(
                [*plain, *(a for a in argv if a.startswith("hydra."))], config_dirs, hydra_node=True
            )
            checked = plan(_without_hydra(composed))
        elif not info_only:  # sweeps: the first job's config, up front
            cfg = compose(_first_of_sweeps(plain), config_dirs)  # hydra.main gets --config-dir as given
            _validated = (cfg, plan(cfg))
    except (ConfigError, CheckpointError, OmegaConfBaseException, ValueError, KeyError) as e:
        print(f"qd-run: error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as e:  # hydra's compose errors
        if type(e).__module__.startswith("hydra"):
            print(f"qd-run: error: {one_line(e)}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    if single:
        _run_single(composed, checked, as_json)
        return
    import hydra

    sys.argv = [sys.argv[0], *argv]

    def job(cfg: DictConfig) -> None:
        _hydra_task(cfg, as_json)

    hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(job)()


def cli() -> None:
    """``qd-run`` and ``python -m qd.run``: ``main``, then the process ends without tearing the
    interpreter down.

    Tearing down a process that imported jax, hydra and torch frees every module and XLA's
    objects one by one: 0.4-0.5 s after the last line of a sphere run on a quiet 2-core machine
    (a tenth of the run). What a normal exit does that matters still happens, in its order:
    the program's threads end (a run's own are joined before ``main`` returns; one left running
    means an ordinary exit, which waits for it), ``atexit`` handlers run (logging's flush,
    multiprocessing's children), stdout and stderr are flushed, then ``os._exit`` with the code.
    """
    import atexit
    import os
    import threading

    code: int | str | None = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(code)
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    cli()
