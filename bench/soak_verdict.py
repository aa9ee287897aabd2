"""bench/soak.py's verdict on one phase's samples: did the process stay flat, and the table of them.

"Flat": resident memory grows at most FLAT_MB_PER_HOUR after the warm-up (least-squares slope);
descriptors, threads and lasting processes keep their baseline (the minimum over the last third of
the samples is not above the one over the first third: a leak raises the baseline, a connection or
fork caught mid-flight only a peak). Phases shorter than CONCLUSIVE_MIN are judged after the first
20% (at least after the first evaluation) and called not conclusive.
"""

from __future__ import annotations

import math

FLAT_MB_PER_HOUR = 20.0
WARMUP_S = 300.0  # "after minute 5"
CONCLUSIVE_MIN = 10.0


def _fit(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def mark_stopping(samples: list[dict], minutes: float) -> None:
    """Flags the samples taken after the run's time budget ran out (draining, closing: not steady state).

    The engine's clock starts after startup; each event's ``elapsed_s`` is at most the time
    since, so the earliest ``t - elapsed_s`` is the closest estimate of that start.
    """
    starts = [s["t"] - s["elapsed_s"] for s in samples if s.get("elapsed_s") is not None]
    end = (min(starts) if starts else 0.0) + minutes * 60
    for s in samples:
        s["stopping"] = s["t"] >= end


def verdict(samples: list[dict], minutes: float) -> tuple[dict, list[str]]:
    """The figures and the lines that say whether the run stayed flat (samples while it ran)."""
    good = [s for s in samples if not math.isnan(s["rss_mb"]) and s["fds"] >= 0 and not s.get("stopping")]
    duration = good[-1]["t"] if good else 0.0
    conclusive = duration >= CONCLUSIVE_MIN * 60 - 1
    first_eval = next((s["t"] for s in good if s["evals"]), 0.0)  # startup (imports, jit) before it
    cutoff = WARMUP_S if conclusive else max(0.2 * duration, first_eval)
    after = [s for s in good if s["t"] >= cutoff]
    slope = _fit([s["t"] / 3600 for s in after], [s["rss_mb"] for s in after])
    tree_slope = _fit([s["t"] / 3600 for s in after], [s["children_rss_mb"] for s in after])
    res: dict = {
        "duration_s": duration,
        "conclusive": conclusive,
        "cutoff_s": round(cutoff, 1),
        "samples_after": len(after),
        "rss_slope_mb_per_h": slope,
        "children_rss_slope_mb_per_h": tree_slope,
    }
    where = (
        "after minute 5"
        if conclusive
        else f"after the first 20% or the first evaluation ({cutoff:.0f} s); "
        f"run shorter than {CONCLUSIVE_MIN:.0f} min: not conclusive"
    )
    lines = []
    if slope is None:
        lines.append(f"- resident memory: too few samples {where}")
        res["rss_flat"] = None
    else:
        res["rss_flat"] = slope <= FLAT_MB_PER_HOUR
        lines.append(
            f"- resident memory (qd-run) grows {slope:+.1f} MB/hour {where} (least squares over {len(after)} "
            f"samples; {after[0]['rss_mb']:.1f} -> {after[-1]['rss_mb']:.1f} MB, "
            f"max {max(s['rss_mb'] for s in after):.1f}): "
            f"**{'flat' if res['rss_flat'] else 'grows'}** (limit {FLAT_MB_PER_HOUR:.0f} MB/hour)"
            + (f"; its descendants together {tree_slope:+.1f} MB/hour" if tree_slope is not None else "")
        )
    for key, name in (("fds", "open descriptors"), ("threads", "threads"), ("procs", "descendant processes")):
        if not after:
            continue
        lo, hi = min(s[key] for s in after), max(s[key] for s in after)
        warm = [s[key] for s in good if s["t"] < cutoff]
        third = max(1, len(after) // 3)
        # A leak raises the baseline (the minimum); a connection or fork caught mid-flight only the maximum.
        first_min, last_min = min(s[key] for s in after[:third]), min(s[key] for s in after[-third:])
        grows = last_min > first_min
        res[key] = {
            "min": lo,
            "max": hi,
            "warmup_max": max(warm) if warm else None,
            "unchanged": lo == hi,
            "baseline_first_third": first_min,
            "baseline_last_third": last_min,
            "grows": grows,
        }
        state = (
            "unchanged"
            if lo == hi
            else f"baseline grows ({first_min} -> {last_min})"
            if grows
            else f"steady: baseline {first_min} in the first third and {last_min} in the last, "
            "transient peaks only"
        )
        lines.append(
            f"- {name}: {lo}..{hi} after warm-up (warm-up max {res[key]['warmup_max']}): **{state}**"
        )
    if good:
        first, last = good[0], good[-1]
        lines.append(
            f"- store: {last['store_mb']:.1f} MB (SQLite + WAL, WAL {last['wal_mb']:.1f} MB), LLM cache "
            f"{last['cache_mb']:.1f} MB, events.jsonl {last['events_mb']:.1f} MB after "
            f"{last['evals'] or 0:,} evaluations"
        )
        rates = [s["evals_per_s"] for s in after if s.get("evals_per_s") is not None]
        if rates:
            q = max(1, len(rates) // 4)
            res["evals_per_s_first_quarter"] = sum(rates[:q]) / q
            res["evals_per_s_last_quarter"] = sum(rates[-q:]) / q
            lines.append(
                f"- evaluations/s after warm-up: mean {sum(rates) / len(rates):.2f} "
                f"(first quarter {res['evals_per_s_first_quarter']:.2f}, last quarter "
                f"{res['evals_per_s_last_quarter']:.2f}, min {min(rates):.2f}, max {max(rates):.2f})"
            )
        if last.get("server_rss_mb") is not None:
            lines.append(
                f"- scripted server (not qd): RSS {first['server_rss_mb']:.1f} -> "
                f"{last['server_rss_mb']:.1f} MB"
            )
    flat = bool(res.get("rss_flat")) and all(
        k in res and not res[k]["grows"] for k in ("fds", "threads", "procs")
    )
    res["flat"] = flat
    lines.insert(
        0, f"**Flat: {'yes' if flat else 'no'}**" + ("" if conclusive else " (short run: not conclusive)")
    )
    return res, lines


def table(samples: list[dict], max_rows: int | None = None) -> str:
    rows = samples
    if max_rows and len(samples) > max_rows:
        step = (len(samples) - 1) / (max_rows - 1)
        rows = [samples[round(i * step)] for i in range(max_rows)]
    out = [
        "| time | rss MB | workers MB | fds | threads | procs | store MB | cache MB | evals | evals/s "
        "| load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in rows:
        rate = s.get("evals_per_s")
        out.append(
            f"| {int(s['t'] // 60)}:{int(s['t'] % 60):02d}{' (stopping)' if s.get('stopping') else ''} "
            f"| {s['rss_mb']:.1f} | {s['children_rss_mb']:.1f} | "
            f"{s['fds']} | {s['threads']} | {s['procs']} | {s['store_mb']:.2f} | {s['cache_mb']:.2f} | "
            f"{s['evals'] if s['evals'] is not None else '-'} | {'-' if rate is None else f'{rate:.2f}'} | "
            f"{s.get('load1', '-')} |"
        )
    return "\n".join(out)
