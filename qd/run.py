"""``qd-run``: the hydra entry point (single runs, ``-m`` sweeps, ``resume=RUN_DIR``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qd import archive
from qd.config import Config, check_ranges, register
from qd.contract import ConfigError
from qd.errors import CheckpointError
from qd.evaluator import InProcessEvaluator, PoolEvaluator, SandboxEvaluator
from qd.loop import Budget, Engine
from qd.paths import conf_dir
from qd.search.build import build_arms, build_cycle, build_strategy, check_strategy, operator_labels
from qd.task import load_task

register()


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Descriptor space of a run: D, and per axis the grid bins and bounds."""

    dim: int
    bins: list[int]
    lower: list[float]
    upper: list[float]
    own_cells: bool = False  # the describer fits its own CVT centroids (raw embeddings)
    source: str = "archive"  # which config fields these came from, for errors


ARCHIVE_KINDS = ("grid", "cvt", "novelty")


def build_describer(cfg: DictConfig, task: Any) -> Any:
    """The run's describer from ``descriptor.parts`` (None: the task's own descriptors)."""
    from descriptors import Combined, make_descriptor

    parts = OmegaConf.to_container(cfg.descriptor.parts, resolve=True)
    if not parts:
        return None
    if task.kind == "vector":
        raise ConfigError("descriptor.parts", "describe text candidates; numeric tasks report their own",
                          "use descriptor=task")
    cvt_cells = cfg.archive.cells if cfg.archive.kind == "cvt" else 0
    built = []
    for i, part in enumerate(parts):
        try:
            built.append(make_descriptor(part["kind"], part, cfg.seed, cvt_cells))
        except ValueError as e:
            field, problem = str(e).split(": ", 1)
            raise ConfigError(f"descriptor.parts[{i}].{field}", problem) from None
    return Combined(built)


def _geometry(cfg: DictConfig, task: Any, describer: Any) -> Geometry:
    a = cfg.archive
    cycle = build_cycle(cfg)
    if cycle is not None:  # the first phase's axes; the engine re-grids at each rotation
        g = cycle.spec(0)
        return Geometry(g.descriptor_dim, list(g.bins), list(g.lower), list(g.upper), source="cycle")
    if describer is None:
        return Geometry(task.descriptor_dim, list(a.bins), list(a.lower), list(a.upper))
    from descriptors import axis_bins

    bins = []
    for i, (part, built) in enumerate(zip(cfg.descriptor.parts, describer.parts)):
        try:
            bins += axis_bins(part.kind, OmegaConf.to_container(part, resolve=True), built.dim)
        except ValueError as e:
            raise ConfigError(f"descriptor.parts[{i}].bins", str(e).split(": ", 1)[1]) from None
    own = any(p.kind == "embedding" and p.projection == "none" for p in cfg.descriptor.parts)
    return Geometry(describer.dim, bins, list(describer.lower), list(describer.upper),
                    own_cells=own and a.kind == "cvt", source="descriptor.parts")


def _check_archive(cfg: DictConfig, g: Geometry) -> None:
    a = cfg.archive
    if a.kind not in ARCHIVE_KINDS:
        raise ConfigError("archive.kind", f"unknown kind {a.kind!r}", f"use one of {list(ARCHIVE_KINDS)}")
    if a.kind == "grid" and g.dim > 8:
        raise ConfigError("archive.kind", f"a grid over {g.dim} descriptor axes has too many cells",
                          "use archive=cvt or archive=novelty for raw embeddings")
    for name in ("lower", "upper") + (("bins",) if a.kind == "grid" else ()):
        if len(getattr(g, name)) != g.dim:  # a describer's axes always match
            raise ConfigError(
                f"archive.{name}", f"has {len(getattr(g, name))} entries but the task has "
                f"{g.dim} descriptors", f"give {g.dim} values",
            )
    if a.kind == "grid":
        try:
            archive.GridSpec(tuple(g.bins), tuple(g.lower), tuple(g.upper))
        except ValueError as e:
            raise ConfigError(f"{g.source}.bins", str(e).split(": ", 1)[-1]) from None


def build_spec(cfg: DictConfig, run_dir: Path, g: Geometry):
    """The tessellation; CVT centroids are saved in the run so a resume reuses them.

    A describer that fits its own centroids (raw embeddings) starts from
    placeholder centroids: nothing is placed before its first fit.
    """
    a = cfg.archive
    if a.kind == "grid":
        return archive.GridSpec(tuple(g.bins), tuple(g.lower), tuple(g.upper))
    if a.kind == "novelty":
        return archive.NoveltySpec(a.capacity, g.dim, a.k, a.novelty_threshold, a.local_competition)
    from qd.archive.cvt import CVTSpec, cvt_centroids

    if g.own_cells:
        return CVTSpec(np.zeros((a.cells, g.dim), np.float32))
    path = run_dir / "centroids.npy"
    if path.exists():
        centroids = np.load(path)
    else:
        centroids = cvt_centroids(a.cells, list(g.lower), list(g.upper), a.cvt_samples, a.cvt_seed)
        np.save(path, centroids)
    return CVTSpec(centroids)


_NUMERIC_PARAMS = ("sigma", "iso_sigma", "line_sigma")
_LLM_PARAMS = ("temperature", "max_tokens", "num_inspirations", "fallback_to_rewrite", "templates")
PROVIDERS = ("local", "openai", "vllm", "ollama", "server")


def _make_operator(o: DictConfig, task: Any, client: Any) -> Any:
    """A numeric operator for vector tasks, an LLM operator for text tasks."""
    if task.kind == "vector":
        from operators import make_numeric_operator

        lower, upper = getattr(task, "genome_bounds", (-np.inf, np.inf))
        return make_numeric_operator(o.name, lower, upper, **{k: o[k] for k in _NUMERIC_PARAMS})
    from operators.llm import make_llm_operator

    params = OmegaConf.to_container(o, resolve=True)
    return make_llm_operator(o.name, client, **{k: params[k] for k in _LLM_PARAMS})


def build_operators(cfg: DictConfig, task: Any, client: Any = None) -> list[tuple[Any, float]]:
    """(operator, weight) pairs; ``client`` is the LLM client (None: only validate)."""
    if not cfg.operators.mix:
        raise ConfigError("operators.mix", "is empty", "pick a group, e.g. operators=gaussian")
    ops = []
    for i, o in enumerate(cfg.operators.mix):
        try:
            ops.append((_make_operator(o, task, client), float(o.weight)))
        except ValueError as e:
            field, problem = str(e).split(": ", 1)
            raise ConfigError(f"operators.mix[{i}].{field}", problem) from None
    if sum(w for _, w in ops) <= 0:  # each weight >= 0: the schema's range
        raise ConfigError("operators.mix", "weights must have a positive sum", "give some operator a weight > 0")
    return ops


def check_config(cfg: DictConfig) -> tuple[Any, Any, Geometry]:
    """Validates every field that can be checked without running.

    Returns the task, its describer (None for the task's own descriptors) and
    the descriptor geometry.
    """
    OmegaConf.to_object(cfg)  # types and missing values
    check_ranges(cfg)  # every numeric field against its range in qd/config.py, before the cross-field checks
    params = OmegaConf.to_container(cfg.experiment.params, resolve=True)
    task = load_task(cfg.experiment.task, params)
    describer = build_describer(cfg, task)
    geometry = _geometry(cfg, task, describer)
    _check_archive(cfg, geometry)
    if cfg.islands.topology not in archive.TOPOLOGIES:
        raise ConfigError("islands.topology", f"unknown topology {cfg.islands.topology!r}",
                          f"use one of {list(archive.TOPOLOGIES)}")
    _evaluator_kind(cfg, task)
    if task.kind != "vector":
        _check_llm(cfg)
    build_operators(cfg, task)
    operator_labels(cfg)
    check_strategy(cfg, task, describer)
    return task, describer, geometry


def _evaluator_kind(cfg: DictConfig, task: Any) -> str:
    """inprocess / pool for numeric tasks; LLM-written text only ever runs in the sandbox."""
    e = cfg.runner.evaluator
    if e not in ("auto", "inprocess", "pool", "sandbox"):
        raise ConfigError("runner.evaluator", f"unknown evaluator {e!r}", "use auto, inprocess, pool or sandbox")
    if task.kind == "vector":
        if e == "sandbox":
            raise ConfigError("runner.evaluator", "numeric tasks are trusted and have no sandbox entry",
                              "use auto, inprocess or pool")
        return "inprocess" if e == "auto" else e
    if e not in ("auto", "sandbox"):
        raise ConfigError("runner.evaluator", f"{e!r} would run LLM-written code outside the sandbox",
                          "use auto or sandbox")
    return "sandbox"


def _check_llm(cfg: DictConfig) -> None:
    """Everything about the model that can fail before the run starts."""
    llm = cfg.llm
    if llm.provider not in PROVIDERS:
        raise ConfigError("llm.provider", f"unknown provider {llm.provider!r}", f"use one of {list(PROVIDERS)}")
    if not llm.models:
        raise ConfigError("llm.models", "is empty", "name at least one model, e.g. llm=local")
    if sum(m.weight for m in llm.models) <= 0:  # each weight >= 0: the schema's range
        raise ConfigError("llm.models", "weights must have a positive sum", "give some model a weight > 0")
    if llm.provider == "local":
        _check_local_server(llm)
    elif not llm.base_url:
        raise ConfigError("llm.base_url", f"is not set for provider {llm.provider}", "give the server's URL")
    if llm.api_key_env and not os.environ.get(llm.api_key_env):
        raise ConfigError(
            "llm.api_key_env", f"environment variable {llm.api_key_env} is not set",
            f"export {llm.api_key_env}=... or set llm.api_key_env=null for a server without keys",
        )


def _check_local_server(llm: DictConfig) -> None:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(
            "llm.provider", "local needs llama-cpp-python, which is not installed",
            'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install "llama-cpp-python[server]", or use llm=openai/vllm/ollama',
        )
    if llm.local.model_path is not None:
        if not Path(llm.local.model_path).is_file():
            raise ConfigError("llm.local.model_path", f"no file {llm.local.model_path}", "give a GGUF file")
        return
    from qd.llm.server import smollm2_path

    try:
        smollm2_path()
    except (FileNotFoundError, LookupError) as e:
        raise ConfigError("llm.local.model_path", str(e).splitlines()[0]) from None


def build_llm(cfg: DictConfig, run_dir: Path, stack: contextlib.ExitStack) -> Any:
    """The run's LLM client; for provider local, starts the embedded server (stopped by ``stack``)."""
    from qd.llm import LLMClient, LLMSettings, ModelSpec

    llm = cfg.llm
    base_url, models = llm.base_url, [ModelSpec(m.name, m.weight, m.price_in, m.price_out) for m in llm.models]
    if llm.provider == "local":
        from qd.llm.server import EmbeddedServer

        server = EmbeddedServer(
            llm.local.model_path, log_path=run_dir / "llm_server.log", alias=models[0].name,
            n_ctx=llm.local.n_ctx, n_threads=llm.local.n_threads,
            startup_timeout_s=llm.local.startup_timeout_s,
        )
        stack.callback(server.stop)
        server.start()
        base_url = server.base_url
        models = [dataclasses.replace(m, name=server.model) for m in models[:1]]
    cache_dir = None
    if llm.cache:
        cache_dir = str(Path(llm.cache_dir) if llm.cache_dir else run_dir / "llm_cache")
    return LLMClient(LLMSettings(
        base_url=base_url, models=tuple(models), api_key_env=llm.api_key_env,
        concurrency=llm.concurrency, timeout_s=llm.timeout_s, max_retries=llm.max_retries,
        backoff_s=llm.backoff_s, backoff_max_s=llm.backoff_max_s, give_up_after_s=llm.give_up_after_s,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens, seed=cfg.seed if llm.seed is None else llm.seed,
        cache_dir=cache_dir,
    ))


def _build_evaluator(cfg: DictConfig, task: Any) -> Any:
    kind, r = _evaluator_kind(cfg, task), cfg.runner
    if kind == "pool":
        params = OmegaConf.to_container(cfg.experiment.params, resolve=True)
        return PoolEvaluator(cfg.experiment.task, params, r.workers)
    if kind == "inprocess":
        return InProcessEvaluator(task)
    from qd.sandbox import Limits, Sandbox

    limits = Limits(**OmegaConf.to_container(cfg.sandbox, resolve=True))
    return SandboxEvaluator(task, Sandbox(task.sandbox_entry, workers=r.workers, limits=limits))


def build_engine(cfg: DictConfig, run_dir: Path) -> Engine:
    """Everything a run needs, from a config (checked first).

    For text tasks this starts the LLM (the embedded server for ``llm=local``)
    and the sandbox; ``Engine.close`` stops them.
    """
    task, describer, geometry = check_config(cfg)
    r = cfg.runner
    with contextlib.ExitStack() as stack:
        client = build_llm(cfg, run_dir, stack) if task.kind != "vector" else None
        evaluator = _build_evaluator(cfg, task)
        stack.callback(getattr(evaluator, "close", lambda: None))
        arms = build_arms(cfg, build_operators(cfg, task, client), operator_labels(cfg))
        engine = Engine(
            task=task, spec=build_spec(cfg, run_dir, geometry), operators=arms,
            evaluator=evaluator, run_dir=run_dir, islands=cfg.islands.count,
            batch_size=r.batch_size, in_flight=r.in_flight,
            budget=Budget(r.max_evaluations, r.max_seconds, r.max_llm_calls, r.max_tokens, r.max_cost),
            checkpoint_every=r.checkpoint_every, seed=cfg.seed,
            learning_rate=cfg.archive.learning_rate, threshold_min=cfg.archive.threshold_min,
            qd_offset=cfg.archive.qd_offset,
            progress=r.progress, llm=client, initial_population=r.initial_population,
            describer=describer, strategy=build_strategy(cfg, arms, task),
        )
        engine.on_close(stack.pop_all().close)
    return engine


def run_in(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Runs (or continues) the experiment in ``run_dir`` and prints its summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    engine = build_engine(cfg, run_dir)
    try:
        summary = engine.run()
    finally:
        engine.close()
    print(f"run_dir={run_dir}")
    print("summary=" + json.dumps(summary["global"]))
    if "union" in summary:  # islands merged cell by cell: what the run found
        print("union=" + json.dumps(summary["union"]))
    if "descriptor" in summary:
        d, cells = summary["descriptor"], int(summary["global"]["num_elites"])
        per_100 = 100.0 * cells / max(summary["evaluations"], 1)
        print(f"descriptor={d['name']} dim={d['dim']} fits={d['fits']} "
              f"cells={cells} evaluations={summary['evaluations']} cells_per_100_evals={per_100:.1f}")
    if "llm" in summary:
        print("llm=" + json.dumps({k: v for k, v in summary["llm"].items() if k != "per_model"}))
    if summary.get("stop_reason"):
        print(f"qd-run: stopped: {summary['stop_reason']}", file=sys.stderr)
        raise SystemExit(1)
    return summary


def _hydra_task(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    # Hydra logs at INFO; JAX's backend probing (no TPU here) and a line per HTTP
    # request are noise to a user (the ledger and events.jsonl hold the numbers).
    for name in ("jax._src.xla_bridge", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)

    run_in(cfg, Path(HydraConfig.get().runtime.output_dir))


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
    missing = re.search(r"Could not find '([\w/]+)/([^']+)' Available options in '[^']+': (.*?) Config search", text)
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


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(conf_dir()), version_base=None, job_name="qd"):
        return compose("config", overrides=overrides)


def _resume(run_dir: Path, overrides: list[str]) -> None:
    saved = run_dir / "config.yaml"
    if not saved.exists():
        raise ConfigError("resume", f"{run_dir} has no config.yaml", "pass a run directory made by qd-run")
    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(saved))
    cfg.merge_with_dotlist([o for o in overrides if not o.startswith("resume=")])
    cfg.resume = str(run_dir)
    check_config(cfg)
    run_in(cfg, run_dir)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    plain = [a for a in argv if not a.startswith("-") and not a.startswith("hydra.")]
    info_only = any(a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i") or a.startswith("--cfg") for a in argv)
    try:
        resume = [a.split("=", 1)[1] for a in plain if a.startswith("resume=")]
        if resume and resume[0] not in ("", "null"):
            _resume(Path(resume[0]), plain)
            return
        if not info_only:
            check_config(_compose(_first_of_sweeps(plain)))
    except (ConfigError, CheckpointError, OmegaConfBaseException, ValueError, KeyError) as e:
        print(f"qd-run: error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as e:  # hydra's compose errors
        if type(e).__module__.startswith("hydra"):
            print(f"qd-run: error: {one_line(e)}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    import hydra

    sys.argv = [sys.argv[0], *argv]
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(_hydra_task)()


if __name__ == "__main__":
    main()
