"""AI-feedback descriptors (QDAIF): a judge model places each candidate on named axes.

For every (candidate, axis) the judge gets one strict question: answer with a
single digit 0..scale, 0 meaning the axis's ``low`` end and ``scale`` its
``high`` end. When the server returns logprobs at the answer token, the score is
the expected digit under the judge's distribution over the digit tokens it
listed (renormalized), which is smoother and less tied to the judge's favourite
digit than the argmax; otherwise it is the digit itself. Scores are divided by
``scale`` so every axis spans [0, 1].

Small judges (SmolLM2-135M) answer prose to a bare instruction; a few examples
per axis, sent as earlier chat turns answered with a digit, make them answer one
digit (see ``Axis.examples``). They still go on after it ("1.0", "10" for the top
of 0..9), so by default only the answer token is generated (``max_tokens=1``),
as QDAIF reads the judge's distribution at that token. Answers are cached in the store by everything
that determines them, so re-describing a stored candidate costs no call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import struct
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from descriptors.base import Described, Item
from qd.contract import Cache, ChatClient, Completion, Descriptor, LLMError, Ports

CACHE_KIND = "ai_feedback"
PROMPT = (
    "{question} Answer with a single digit from 0 to {max}, where 0 means {low} and {max} means {high}. "
    "Answer with the digit only.\nText: {text}"
)
_FIELDS = ("question", "low", "high", "max", "text")
RESCALES = ("minmax", "quantile")  # how a fitted axis maps scores onto [0, 1] (see AIFeedbackDescriptor)
_TRAILING = ".,;:!)"  # punctuation allowed right after the digit ("7." is still 7)


@dataclasses.dataclass(frozen=True)
class Axis:
    """One judged dimension, e.g. ``Axis("tone", "How happy is the tone of this text?", "sad", "happy")``.

    Attributes:
        name: the axis name in logs and error reasons.
        question: what the judge is asked about the text.
        low, high: what 0 and the top digit mean.
        bins: grid cells along this axis (``AIFeedbackDescriptor.bins``).
        examples: few-shot (text, position in [0, 1]) pairs shown as answered turns;
            the position becomes a digit on the descriptor's scale.
    """

    name: str
    question: str
    low: str
    high: str
    bins: int = 10
    examples: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for field in ("name", "question", "low", "high"):
            if not str(getattr(self, field)).strip():
                raise ValueError(f"ai_feedback axis.{field}: is empty; give the axis a {field}")
        if self.bins < 1:
            raise ValueError(f"ai_feedback axis {self.name!r}.bins: is {self.bins}; use at least 1")
        for text, pos in self.examples:
            if not 0.0 <= pos <= 1.0:
                raise ValueError(
                    f"ai_feedback axis {self.name!r}.examples: position {pos} of {text[:40]!r} "
                    "is outside [0, 1]; give 0 for the low end and 1 for the high end"
                )


def parse_score(text: str, top_logprobs: list[dict[str, float]] | None, scale: int) -> float | None:
    """The judge's answer as a digit in 0..scale (an expectation if logprobs allow), or None.

    Strict: the first whitespace-separated word, less trailing punctuation, must be
    one digit in range ("7", " 7.", "7 because" parse; "10", "0.5", "I cannot" do not).
    ``top_logprobs``: per generated token {token: logprob}; the answer token is the
    first whose most likely alternative is not whitespace (the sampled one at temperature 0).
    """
    words = text.split()
    word = words[0].rstrip(_TRAILING) if words else ""
    if not _is_digit(word, scale):
        return None
    answer = next((top for top in top_logprobs or () if top and max(top, key=top.get).strip()), None)
    if answer is not None:
        probs: dict[int, float] = {}
        for token, lp in answer.items():
            if _is_digit(token, scale):  # " 7" and "7" are the same answer
                probs[int(token)] = probs.get(int(token), 0.0) + math.exp(lp)
        mass = sum(probs.values())
        if mass > 0:
            return sum(d * p for d, p in probs.items()) / mass
    return float(word)


def quantile_edges(scores: np.ndarray, bins: int) -> np.ndarray:
    """f64[bins + 1] strictly increasing: the ``k / bins`` quantiles of ``scores``.

    Tied quantiles (many equal scores) are nudged apart by 1e-6 so the piecewise-linear
    map through them stays a function; equal scores still land together.
    """
    edges = np.quantile(np.asarray(scores, np.float64), np.linspace(0, 1, bins + 1))
    for k in range(1, len(edges)):
        edges[k] = max(edges[k], edges[k - 1] + 1e-6)
    return edges


def _is_digit(token: str, scale: int) -> bool:
    t = token.strip()
    return len(t) == 1 and t in "0123456789" and int(t) <= scale  # ASCII only: int("³") fails


def _clip(text: str, limit: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


class AIFeedbackDescriptor(Descriptor):
    """A judge LLM's answers on ``axes`` as an ``f32[B, len(axes)]`` descriptor in [0, 1].

    ``client=None`` uses the run's client given to ``attach``; ``model=None`` the
    client's first model. A candidate whose judge call fails, or whose answer is
    not one digit (refusals included), is invalid with a reason naming the axis.
    Judge calls go through the client, so they count in its ledger and budget.

    ``rescale_at`` (valid-candidate counts) makes it a fitted descriptor: at each
    count every axis's range is fitted to the scores seen and mapped onto [0, 1],
    as QDAIF placed its bins where the judge's scores actually fall; nothing is
    placed before the first fit. ``rescale`` says how: ``minmax`` (min/max widened
    by ``margin``, a linear map) or ``quantile`` (the scores' quantiles at
    ``k / axis.bins`` map to ``k / axis.bins``, linearly in between, so each of the
    grid's uniform bins holds an equal share of the fitted scores: the bins are
    dense where the judge's expected digits cluster, as QDAIF's non-uniform bins).
    """

    name = "ai_feedback"

    def __init__(
        self,
        axes: Sequence[Axis],
        client: ChatClient | None = None,
        model: str | None = None,
        *,
        scale: int = 9,
        temperature: float = 0.0,
        max_tokens: int = 1,
        prompt: str = PROMPT,
        use_logprobs: bool = True,
        top_logprobs: int = 10,
        rescale_at: Sequence[int] = (),
        margin: float = 0.05,
        rescale: str = "minmax",
    ):
        self.axes = tuple(axes)
        if not self.axes:
            raise ValueError("ai_feedback.axes: is empty; name at least one Axis")
        if len({a.name for a in self.axes}) != len(self.axes):
            raise ValueError(
                f"ai_feedback.axes: names repeat in {[a.name for a in self.axes]}; make them unique"
            )
        if not 1 <= scale <= 9:
            raise ValueError(f"ai_feedback.scale: is {scale}; use 1..9 (answers are one digit)")
        if max_tokens < 1:
            raise ValueError(
                f"ai_feedback.max_tokens: is {max_tokens}; use at least 1 (1: the answer token only)"
            )
        if not 1 <= top_logprobs <= 20:
            raise ValueError(f"ai_feedback.top_logprobs: is {top_logprobs}; use 1..20 (the OpenAI limit)")
        try:
            prompt.format(**{f: "" for f in _FIELDS})
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"ai_feedback.prompt: cannot be filled ({err!r}); use only the placeholders "
                f"{', '.join('{' + f + '}' for f in _FIELDS)}"
            ) from None
        if "{text}" not in prompt:
            raise ValueError(
                "ai_feedback.prompt: has no {text} placeholder; add one where the candidate goes"
            )
        self.client, self.model = client, model
        self.scale, self.temperature, self.max_tokens = scale, temperature, max_tokens
        self.prompt, self.use_logprobs, self.top_logprobs = prompt, use_logprobs, top_logprobs
        self.dim = len(self.axes)
        self.calls_per_item = self.dim  # judge calls describing one new text (the budget reserves them)
        self.lower = (0.0,) * self.dim
        self.upper = (1.0,) * self.dim
        self.bins = tuple(a.bins for a in self.axes)
        self._cache: Cache | None = None  # judge answers, by everything that determines them
        # Optional fitted range per axis: small judges use a narrow band of the scale.
        self.rescale_at = tuple(sorted({int(n) for n in rescale_at}))
        if any(n < 1 for n in self.rescale_at):
            raise ValueError(f"ai_feedback.rescale_at: {list(rescale_at)} has counts below 1")
        if rescale not in RESCALES:
            raise ValueError(f"ai_feedback.rescale: unknown {rescale!r}; use one of {list(RESCALES)}")
        self.margin, self.rescale, self._fits = margin, rescale, 0
        self._span: tuple[np.ndarray, np.ndarray] | None = None  # minmax: per-axis low, high
        self._edges: list[np.ndarray] | None = None  # quantile: per axis, axis.bins + 1 increasing scores

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def attach(self, ports: Ports | None, llm: ChatClient | None = None) -> None:
        """Cache answers in the run's cache; judge with the run's client ``llm`` unless one was given."""
        self._cache = None if ports is None else ports.cache
        if self.client is None:
            self.client = llm

    def messages(self, axis: Axis, text: str) -> list[dict]:
        """The chat sent for one (candidate, axis): the axis's examples as answered turns, then
        the question."""

        def ask(t: str) -> dict:
            fields = {
                "question": axis.question,
                "low": axis.low,
                "high": axis.high,
                "max": self.scale,
                "text": t,
            }
            return {"role": "user", "content": self.prompt.format(**fields)}

        turns: list[dict] = []
        for example, pos in axis.examples:
            turns += [ask(example), {"role": "assistant", "content": str(int(pos * self.scale + 0.5))}]
        return [*turns, ask(text)]

    def _key(self, model: str, messages: list[dict]) -> str:
        """Everything that determines a score: judge, prompt, sampling and scoring mode."""
        spec = {
            "model": model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "scale": self.scale,
            "logprobs": self.top_logprobs if self.use_logprobs else None,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    async def describe(self, items: Sequence[Item]) -> Described:
        """The judge's scores, rescaled to the fitted range when ``rescale_at`` is set
        (pending, NaN but valid, before the first fit)."""
        out = await self.judge_scores(items)
        if not self.rescale_at:
            return out
        values = np.full_like(out.values, np.nan)
        if self._span is not None:
            low, high = self._span
            values[out.valid] = np.clip((out.values[out.valid] - low) / (high - low), 0.0, 1.0)
        if self._edges is not None:
            for j, edges in enumerate(self._edges):
                values[out.valid, j] = np.interp(
                    out.values[out.valid, j], edges, np.linspace(0, 1, len(edges))
                )
        return Described(values, out.valid, out.error)

    def needs_fit(self, num_valid: int) -> bool:
        return self._fits < len(self.rescale_at) and num_valid >= self.rescale_at[self._fits]

    async def fit(self, items: Sequence[Item], rng: np.random.Generator) -> None:
        """Fits each axis's map to the scores of ``items`` (see ``rescale``)."""
        out = await self.judge_scores(items)
        scored = out.values[out.valid]
        if not len(scored):
            raise ValueError(
                "ai_feedback.fit: no item got a score; check the judge (see the candidates' errors)"
            )
        if self.rescale == "quantile":
            self._edges = [quantile_edges(scored[:, j], axis.bins) for j, axis in enumerate(self.axes)]
        else:
            low, high = scored.min(axis=0), scored.max(axis=0)
            pad = np.where(high - low > 1e-6, self.margin * (high - low), 0.05)
            self._span = ((low - pad).astype(np.float32), (high + pad).astype(np.float32))
        self._fits = sum(len(items) >= n for n in self.rescale_at) or self._fits + 1

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {"fits": np.array(self._fits, np.int64)}
        if self._span is not None:
            state["low"], state["high"] = self._span
        for j, edges in enumerate(self._edges or ()):
            state[f"edges{j}"] = edges
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._fits = int(state["fits"])
        self._span = (np.asarray(state["low"]), np.asarray(state["high"])) if "low" in state else None
        self._edges = [np.asarray(state[f"edges{j}"]) for j in range(self.dim)] if "edges0" in state else None

    async def judge_scores(self, items: Sequence[Item]) -> Described:
        """Judge every (candidate, axis) not cached, all at once (the client limits concurrency):
        f32[B, axes] scores in [0, 1] (digit / scale)."""
        if self.client is None:
            raise ValueError(
                "ai_feedback.client: no judge; pass client= or attach(ports, llm) with the run's client"
            )
        model = self.model or self.client.settings.models[0].name
        asks = [[self.messages(axis, item.text) for axis in self.axes] for item in items]
        keys = [[self._key(model, m) for m in row] for row in asks]
        flat = [k for row in keys for k in row]
        scores: dict[str, float] = {}
        if self._cache is not None and flat:
            scores = {k: struct.unpack("<d", v)[0] for k, v in self._cache.get(CACHE_KIND, flat).items()}
        todo: dict[str, tuple[Axis, list[dict]]] = {}
        for row, krow in zip(asks, keys):
            for axis, m, k in zip(self.axes, row, krow):
                if k not in scores:
                    todo.setdefault(k, (axis, m))
        answers = await asyncio.gather(*(self._judge(model, axis, m) for axis, m in todo.values()))
        reasons: dict[str, str] = {}
        fresh: dict[str, float] = {}
        for k, (score, reason) in zip(todo, answers):
            if score is None:
                reasons[k] = reason
            else:
                fresh[k] = score
        if self._cache is not None and fresh:
            self._cache.put(CACHE_KIND, {k: struct.pack("<d", s) for k, s in fresh.items()})
        scores.update(fresh)

        values = np.full((len(items), self.dim), np.nan, np.float32)
        valid = np.ones(len(items), bool)
        error: list[str | None] = [None] * len(items)
        for i, krow in enumerate(keys):
            bad = [reasons[k] for k in krow if k not in scores]
            if bad:
                valid[i], error[i] = False, "; ".join(bad)
            else:
                values[i] = [scores[k] / self.scale for k in krow]
        return Described(values, valid, error)

    async def _judge(self, model: str, axis: Axis, messages: list[dict]) -> tuple[float | None, str | None]:
        """One judge call: (digit score, None) or (None, one-line reason naming the axis)."""
        assert self.client is not None
        try:
            c: Completion = await self.client.complete(
                messages,
                model=model,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                role="judge",
                logprobs=self.use_logprobs,
                top_logprobs=self.top_logprobs if self.use_logprobs else None,
            )
        except LLMError as err:
            return None, f"ai_feedback.{axis.name}: judge call failed ({_clip(str(err), 200)})"
        score = parse_score(c.text, c.top_logprobs, self.scale)
        if score is None:
            return (
                None,
                f"ai_feedback.{axis.name}: judge answered {_clip(c.text)!r}, not one digit 0-{self.scale}",
            )
        return score, None


def agreement(scores: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> dict[str, float]:
    """How well judge scores track known labels, for tests and experiment reports.

    Args:
        scores: f[N] in [0, 1]; NaN (an invalid candidate) is left out and counted.
        labels: f[N] known values (ordinal levels or 0/1 classes).

    Returns:
        n (scored), missing (NaN scores), spearman (rank correlation; NaN if either
        side is constant), and for 0/1 labels accuracy (score >= 0.5 predicts 1) and
        auc (chance a 1 outscores a 0, ties half); NaN where it cannot be computed.
    """
    s, y = np.asarray(scores, float).ravel(), np.asarray(labels, float).ravel()
    if s.shape != y.shape:
        raise ValueError(f"agreement: scores has {s.size} entries, labels {y.size}; pass one label per score")
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    out = {
        "n": int(s.size),
        "missing": int((~keep).sum()),
        "spearman": math.nan,
        "accuracy": math.nan,
        "auc": math.nan,
    }
    if s.size > 1 and np.ptp(s) > 0 and np.ptp(y) > 0:
        out["spearman"] = float(np.corrcoef(rankdata(s), rankdata(y))[0, 1])
    if s.size and np.isin(y, (0.0, 1.0)).all():
        out["accuracy"] = float(np.mean((s >= 0.5) == (y == 1.0)))
        pos, neg = int((y == 1).sum()), int((y == 0).sum())
        if pos and neg:
            out["auc"] = float((rankdata(s)[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))
    return out
