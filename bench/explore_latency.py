#!/usr/bin/env python
"""The web explorer's latency on a large run, beside what a pyribs user waits for the same heatmap.

Builds a synthetic run directory the size the explorer must stay responsive at: a
grid of ``--side`` x ``--side`` cells per island (1,000 x 1,000 = 1M cells) on
``--islands`` islands, and ``--candidates`` stored programs (100k) with lineages,
operators, models, errors and a checkpoint of the archive they fill, written by
qd's own store and checkpoint code. Then it serves the run with ``qd explore``'s
server in this process and asks every API endpoint the page uses ``--repeats``
times over one keep-alive HTTP connection on loopback (after one warm-up request
each), timing each answer from request to last byte: an upper bound on the time
at the server. Reported per endpoint: median and p95 in ms (the target: p95 < 200
ms for every one), and the untimed first request apart (the first asks wait for
the server's one-off work on a new run version: the archive replay, rasters, fates).

Beside it (the peer): pyribs, the field's reference archive, holding the same 1M-cell
elites in a ``GridArchive``; a pyribs user sees them with ``ribs.visualize
.grid_archive_heatmap``, timed here drawing one island's heatmap to a PNG in memory
(median of ``--peer-repeats``). The ratio compares that to the explorer's heatmap
endpoint (p95), the closest counterpart.

Usage::

    PYTHONPATH=. python bench/explore_latency.py                 # 1M cells/island, 100k candidates
    PYTHONPATH=. python bench/explore_latency.py --side 300 --candidates 20000 --repeats 20   # quick
    PYTHONPATH=. python bench/explore_latency.py --json out.json
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

OPERATORS = ("rewrite", "diff", "crossover", "inspiration")
MODELS = ("model-a", "model-b")


def program(rng: np.random.Generator, k: int) -> str:
    """A plausible small program, different for each candidate."""
    a, b, c = rng.normal(size=3).round(3)
    lines = [f"def f(x):  # candidate {k}", f"    y = {a} * x * x + {b} * x + {c}"]
    lines += [f"    y = y + {rng.normal():.3f} * x ** {j}" for j in range(int(rng.integers(0, 12)))]
    return "\n".join(lines + ["    return y", ""])


def build_run(path: Path, side: int, islands: int, candidates: int, seed: int = 0) -> None:
    """A finished run directory of ``candidates`` programs on ``islands`` grids of side x side cells."""
    import jax
    from omegaconf import OmegaConf

    from qd import archive
    from qd.contract import Candidate
    from qd.events import EventLog
    from qd.rundir import Geometry, checkpoint
    from qd.search import islands as island_ops
    from qd.store import Store

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(
        OmegaConf.create(
            {
                "experiment": {
                    "name": "function_fit",
                    "task": "function_fit",
                    "params": {"target": "quadratic"},
                },
                "seed": seed,
                "islands": {"count": islands},
                "archive": {"kind": "grid"},
            }
        ),
        path / "config.yaml",
    )
    geometry = Geometry(
        kind="grid",
        islands=islands,
        cells=side * side,
        dim=2,
        bins=(side, side),
        lower=(0.0, 0.0),
        upper=(1.0, 1.0),
        axes=("length", "loops"),
        genome="program",
    )
    geometry.save(path)
    spec = archive.GridSpec((side, side), (0.0, 0.0), (1.0, 1.0))
    events = EventLog(path / "events.jsonl")
    with Store(path / "store.sqlite") as store:
        for start in range(0, candidates, 5000):
            n = min(5000, candidates - start)
            ids = np.arange(start, start + n)
            valid = rng.random(n) > 0.15
            parents = [[int(rng.integers(0, i))] if i > 50 else [] for i in ids]
            batch = [
                Candidate(
                    kind="text",
                    genome="program",
                    text=program(rng, int(k)),
                    parent_ids=parents[j],
                    island=int(k % islands),
                    operator="init" if not parents[j] else OPERATORS[k % 4],
                    model=None if not parents[j] else MODELS[k % 2],
                    prompt=f"Improve program #{k}",
                    response=f"Here is a better one:\n{k}",
                    tokens_in=400,
                    tokens_out=120,
                    cost=1e-4,
                    fitness=float(-rng.exponential()) if valid[j] else float("nan"),
                    descriptor=rng.random(2).astype(np.float32),
                    valid=bool(valid[j]),
                    metrics={"mse": float(rng.random())},
                    error=None if valid[j] else "syntax error at line 2",
                )
                for j, k in enumerate(ids)
            ]
            store.add(batch)
            events.write(
                "commit",
                {
                    "step": start // 5000,
                    "batches": start // 5000 + 1,
                    "evaluations": start + n,
                    "batch": n,
                    "added": int(valid.sum()),
                },
            )
        offers = store.placements(-1, 2)
        state = archive.init(spec, islands)
        state, _, _ = island_ops.replay(spec, state, island_ops.init(islands, side * side), offers)
        checkpoint.save(
            path / "checkpoints",
            state,
            jax.random.key(seed),
            {"batches": candidates // 5000, "last_id": store.last_id()},
        )
    events.close()


def endpoints(url: str) -> tuple[list[str], float]:
    """Every API call the page makes (and the page itself), for run 0 of the server at ``url``:
    the best elite's cell, candidate and lineage, searches with and without filters, deep paging;
    and the seconds the first answer took (the server's one-off work on the new run)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", "/api/run/0/summary")
    best = json.loads(conn.getresponse().read())["best"]
    first = time.perf_counter() - started
    conn.close()
    return [
        "/",
        "/static/app.js",
        "/highlight.css",
        "/api/runs",
        "/api/version",
        "/api/run/0/summary",
        "/api/run/0/curves",
        "/api/run/0/ledger",
        "/api/run/0/stats?by=operator,model",
        "/api/run/0/stats?by=instruction",
        "/api/run/0/heatmap?island=0",
        "/api/run/0/heatmap?island=1",
        f"/api/run/0/cell?island={best['island']}&cell={best['cell']}",
        f"/api/run/0/candidate/{best['id']}",
        "/api/run/0/candidate/54321",
        f"/api/run/0/lineage/{best['id']}",
        "/api/run/0/lineage/99999",
        "/api/run/0/search",
        "/api/run/0/search?q=99999&valid=true",
        "/api/run/0/search?q=x%20*%2012&sort=fitness&offset=50",
        "/api/run/0/search?error=true&island=1&sort=newest",
        "/api/run/0/search?operator=diff&sort=id&offset=40000",
    ], first


def time_endpoints(url: str, paths: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """Median and p95 ms of each path, over one keep-alive connection, after a warm-up request."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    out = {}
    for p in paths:
        times = []
        for k in range(repeats + 1):
            started = time.perf_counter()
            conn.request("GET", p)
            response = conn.getresponse()
            body = response.read()
            spent = (time.perf_counter() - started) * 1e3
            if response.status != 200:
                raise SystemExit(f"explore_latency: GET {p} answered {response.status}: {body[:200]!r}")
            if k:
                times.append(spent)
            else:
                first = spent
        out[p] = {
            "median_ms": float(np.median(times)),
            "p95_ms": float(np.percentile(times, 95)),
            "first_ms": first,
            "bytes": len(body),
        }
    conn.close()
    return out


def pyribs_heatmap_ms(path: Path, repeats: int) -> float | None:
    """Median ms for pyribs to draw island 0's elites (as a ``GridArchive``) to a PNG in memory."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from ribs.archives import GridArchive
        from ribs.visualize import grid_archive_heatmap
    except ImportError as e:
        print(f"pyribs's heatmap not measured: {e} (pip install '.[bench]')", file=sys.stderr)
        return None
    from qd.rundir import RunDir

    with RunDir(path) as run:
        g, snap = run.geometry, run.snapshot()
    filled = np.flatnonzero(snap.genome_id[0] >= 0)
    ribs_archive = GridArchive(solution_dim=1, dims=list(g.bins), ranges=list(zip(g.lower, g.upper)))
    ribs_archive.add(np.zeros((len(filled), 1)), snap.fitness[0, filled], snap.descriptor[0, filled])
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fig, ax = plt.subplots()
        grid_archive_heatmap(ribs_archive, ax=ax)
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
        times.append((time.perf_counter() - started) * 1e3)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", type=int, default=1000, help="grid side per island (default 1000: 1M cells)")
    ap.add_argument("--islands", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=50, help="timed requests per endpoint")
    ap.add_argument("--peer-repeats", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, help="build the run here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    from qd.explore import serve

    with tempfile.TemporaryDirectory() as tmp:
        path = args.run_dir or Path(tmp) / "run"
        if not (path / "store.sqlite").exists():
            started = time.perf_counter()
            build_run(path, args.side, args.islands, args.candidates)
            print(
                f"built {path}: {args.islands} x {args.side**2:,} cells, {args.candidates:,} candidates "
                f"in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
        started = time.perf_counter()
        server = serve([path], port=0)
        ready = time.perf_counter() - started
        try:
            paths, first = endpoints(server.url)
            ready += first
            timings = time_endpoints(server.url, paths, args.repeats)
        finally:
            server.stop()
        peer = pyribs_heatmap_ms(path, args.peer_repeats)
    worst = max(t["p95_ms"] for t in timings.values())
    print(
        f"explorer on {args.islands} x {args.side**2:,} cells, {args.candidates:,} candidates "
        f"(first answer {ready:.1f} s after start; {args.repeats} requests per endpoint after a warm-up)"
    )
    print(f"{'endpoint':<60} {'median ms':>10} {'p95 ms':>8} {'first ms':>9} {'bytes':>10}")
    for p, t in timings.items():
        print(f"{p:<60} {t['median_ms']:>10.1f} {t['p95_ms']:>8.1f} {t['first_ms']:>9.1f} {t['bytes']:>10,}")
    print(f"worst p95: {worst:.1f} ms (target < 200 ms): {'met' if worst < 200 else 'MISSED'}")
    heat = [t["p95_ms"] for p, t in timings.items() if "heatmap" in p]
    if peer is not None and heat:
        print(
            f"pyribs grid_archive_heatmap of one island to PNG: {peer:.0f} ms (median); "
            f"qd's heatmap endpoint p95 {max(heat):.1f} ms: {peer / max(heat):.1f}x faster"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "timings": timings,
                    "worst_p95_ms": worst,
                    "pyribs_heatmap_ms": peer,
                    "ready_s": ready,
                    "side": args.side,
                    "islands": args.islands,
                    "candidates": args.candidates,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
