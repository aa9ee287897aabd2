"""The explorer's web app (FastAPI on uvicorn): the page, its static assets and the JSON API.

Routes (``{run}`` is the run's position on the command line, 0 or 1):

- ``GET /`` — the page (``static/index.html`` + ``app.js`` + ``style.css``);
  ``GET /highlight.css`` — Pygments' CSS for the highlighted code;
- ``GET /api/runs`` — the runs' summaries; ``GET /api/version`` — a tag per run that
  changes whenever the run writes (the page polls it to refresh a live run);
- ``GET /api/run/{run}/summary``, ``/curves``, ``/ledger``, ``/stats?by=operator,model``;
- ``GET /api/run/{run}/heatmap?island=I&x=0&y=1`` — binary: f32[H*W] fitness (NaN
  empty) then i32[H*W] the cell each pixel shows; the shape and the colour range in
  the ``X-QD-*`` headers;
- ``GET /api/run/{run}/cell?island=I&cell=C``, ``/candidate/{id}``, ``/lineage/{id}``;
  ``/front?island=I&cell=C`` — a Pareto run's front in that cell, its members' objectives;
- ``GET /api/run/{run}/search?q=&operator=&valid=&error=&island=&sort=fitness&limit=50&offset=0``.

Errors are one line of JSON, ``{"error": "..."}``: 404 for a run, island, cell or
candidate that is not there, 400 for a query value that cannot be used.

A background thread keeps each run's heavy readings (the replayed archive, the
island heatmaps, the curves, the statistics' tallies) computed for the run's
current version, so requests seldom wait on them, also while a run is going.
"""

from __future__ import annotations

import contextlib
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from qd import history
from qd.explore import data
from qd.rundir import RunDir

STATIC = Path(str(resources.files("qd.explore") / "static"))
WATCH_S = 1.0  # how often the background thread looks for a run's changes


class Explorer:
    """The runs being explored, each with a lock (one reading at a time: the memos are
    not thread-safe, and two threads would rebuild the same archive twice), its rasters
    and its search connection."""

    def __init__(self, run_dirs: list[str | Path]):
        self.runs = [RunDir(p) for p in run_dirs]
        self.locks = [threading.RLock() for _ in self.runs]
        self.rasters: list[dict] = [{} for _ in self.runs]
        self.searches = [data.Search(r.store.path) for r in self.runs]

    def close(self) -> None:
        for run, search in zip(self.runs, self.searches):
            search.close()
            run.close()

    def index(self, run: str) -> int:
        if not run.isdigit() or int(run) >= len(self.runs):
            raise data.NotFound(f"no run {run!r}: runs are 0..{len(self.runs) - 1}")
        return int(run)

    def read(self, run: str, fn: Any, *args: Any) -> Any:
        """``fn(RunDir, *args)`` under the run's lock, made JSON-safe."""
        k = self.index(run)
        with self.locks[k]:
            return data.jsonable(fn(self.runs[k], *args))

    def warm(self, k: int) -> None:
        """Computes what the page asks for first, for the run's current version."""
        run = self.runs[k]
        with self.locks[k]:
            x, y = data.axes(run, None, None)
            r = data.raster(run, self.rasters[k], x, y)
            for island in range(run.geometry.islands):
                data.heatmap(run, r, island)
            data.summary(run)
            data.fitness_range(run)
            history.curves(run)
            history.tallies(run)


def make_app(run_dirs: list[str | Path], watch_s: float | None = WATCH_S) -> FastAPI:
    """The ASGI app exploring ``run_dirs`` (raises ``RunDirError`` for a path that is not a
    run). ``watch_s``: how often its background thread, started with the app's lifespan,
    re-warms a changed run (None: never; requests compute what they need)."""
    explorer = Explorer(run_dirs)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(explorer, stop, watch_s), daemon=True, name="qd-explore-watch"
        )
        if watch_s is not None:
            watcher.start()
        try:
            yield
        finally:
            stop.set()
            if watcher.is_alive():
                watcher.join()
            explorer.close()

    app = FastAPI(title="qd explore", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.explorer = explorer
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(data.NotFound)
    async def not_found(request: Request, e: data.NotFound) -> JSONResponse:
        return JSONResponse({"error": str(e)}, status_code=404)

    @app.exception_handler(data.BadRequest)
    async def bad_request(request: Request, e: data.BadRequest) -> JSONResponse:
        return JSONResponse({"error": str(e)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def bad_value(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return JSONResponse({"error": f"{where}: {first.get('msg', 'bad value')}"}, status_code=400)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    css = data.highlight_css()

    @app.get("/highlight.css", include_in_schema=False)
    def highlight_css() -> Response:
        return Response(css, media_type="text/css")

    @app.get("/api/runs")
    def runs() -> list:
        return [{"run": k, **explorer.read(str(k), data.summary)} for k in range(len(explorer.runs))]

    @app.get("/api/version")
    def version() -> dict:
        return {"versions": [data.version_tag(r) for r in explorer.runs]}

    @app.get("/api/run/{run}/summary")
    def summary(run: str) -> dict:
        return explorer.read(run, data.summary)

    @app.get("/api/run/{run}/curves")
    def curves(run: str) -> dict:
        return explorer.read(run, history.curves)

    @app.get("/api/run/{run}/stats")
    def stats(run: str, by: str = "operator,model") -> list:
        return explorer.read(run, data.stats, by)

    @app.get("/api/run/{run}/ledger")
    def ledger(run: str) -> dict:
        return explorer.read(run, data.ledger)

    @app.get("/api/run/{run}/heatmap")
    def heatmap(run: str, island: int = 0, x: int | None = None, y: int | None = None) -> Response:
        k = explorer.index(run)
        r = explorer.runs[k]
        with explorer.locks[k]:
            raster = data.raster(r, explorer.rasters[k], *data.axes(r, x, y))
            values, cells = data.heatmap(r, raster, island)
            low, high = data.fitness_range(r)
        headers = {
            "X-QD-Width": str(raster.width),
            "X-QD-Height": str(raster.height),
            "X-QD-Min": "" if low is None else repr(low),
            "X-QD-Max": "" if high is None else repr(high),
            "Cache-Control": "no-store",
        }
        body = values.astype("<f4").tobytes() + cells.astype("<i4").tobytes()
        return Response(body, media_type="application/octet-stream", headers=headers)

    @app.get("/api/run/{run}/cell")
    def cell(run: str, island: int, cell: int) -> dict:
        return explorer.read(run, data.cell, island, cell)

    @app.get("/api/run/{run}/front")
    def front(run: str, island: int, cell: int) -> dict:
        return explorer.read(run, data.front, island, cell)

    @app.get("/api/run/{run}/candidate/{candidate_id}")
    def candidate(run: str, candidate_id: int) -> dict:
        return explorer.read(run, data.candidate, candidate_id)

    @app.get("/api/run/{run}/lineage/{candidate_id}")
    def lineage(run: str, candidate_id: int) -> list:
        return explorer.read(run, data.lineage, candidate_id)

    @app.get("/api/run/{run}/search")
    def search(
        run: str,
        q: str = "",
        operator: str | None = None,
        valid: bool | None = None,
        error: bool | None = None,
        island: int | None = None,
        sort: str = "fitness",
        limit: int = 50,
        offset: int = 0,
    ) -> dict:
        k = explorer.index(run)
        return data.jsonable(
            explorer.searches[k](q, operator or None, valid, error, island, sort, limit, offset)
        )

    return app


def _watch(explorer: Explorer, stop: threading.Event, every: float) -> None:
    """Re-warms each run whose version changed, until ``stop``; a reading that fails (a run
    directory being written in an unexpected way) is left to the request that asks for it."""
    seen: list[str | None] = [None] * len(explorer.runs)
    while not stop.is_set():
        for k, run in enumerate(explorer.runs):
            tag = data.version_tag(run)
            if tag != seen[k]:
                try:
                    explorer.warm(k)
                except Exception:  # noqa: BLE001 - the request that needs it reports the error
                    continue
                seen[k] = tag
        stop.wait(every)


class Server:
    """A running explorer: ``url``, and ``stop()`` (also on leaving a ``with`` block)."""

    def __init__(self, server: Any, thread: threading.Thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def bind(host: str, port: int) -> Any:
    """A listening socket on (host, port); port 0 picks a free one. OSError if taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: Any) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def uvicorn_server(app: FastAPI) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))


def serve(
    run_dirs: list[str | Path], host: str = "127.0.0.1", port: int = 0, watch_s: float | None = WATCH_S
) -> Server:
    """Starts the explorer on ``run_dirs`` in a background thread and returns once it answers
    (for tests and benchmarks; ``qd explore`` serves in the foreground)."""
    sock = bind(host, port)
    server = uvicorn_server(make_app(run_dirs, watch_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="qd-explore")
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("qd explore: the server stopped while starting")
        threading.Event().wait(0.02)
    return Server(server, thread, url_of(sock))
