"""``qd explore RUN_DIR [RUN_DIR2]``: a local web explorer of one run, or two side by side.

It serves a page (our own HTML, JS and CSS in ``static/``, nothing fetched from
elsewhere) and the JSON API behind it (``qd.explore.app``) until Ctrl-C. It only
reads the run directories, so it can watch a run in progress: the page polls the
runs' versions and refreshes what changed, showing the archive as ``resume=`` would
rebuild it. ``serve`` starts it in a background thread (tests, benchmarks);
``make_app`` gives the ASGI app for in-process calls.
"""

from __future__ import annotations

import os
import sys

from qd.explore.app import Server, make_app, serve

__all__ = ["main", "make_app", "serve", "Server"]


def main(argv: list[str] | None = None) -> None:
    from qd.explore.app import bind, url_of, uvicorn_server
    from qd.rundir import RunDirError
    from qd.views.render import parser

    ap = parser("qd explore", "Explore one run, or two side by side, in a browser.")
    ap.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="one or two run directories made by qd-run"
    )
    ap.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    ap.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    ap.add_argument("--no-browser", action="store_true", help="do not open a browser; only print the URL")
    args = ap.parse_args(argv)
    if len(args.run_dirs) > 2:
        ap.error(f"at most two run directories (got {len(args.run_dirs)}); compare more with qd compare")
    try:
        app = make_app(args.run_dirs)
    except RunDirError as e:
        print(f"qd explore: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(
            f"qd explore: cannot listen on {args.host}:{args.port} ({e.strerror or e}); "
            "pass another --port, or --port 0 for a free one",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    url = url_of(sock)
    print(f"explore: {url}", flush=True)
    if not args.no_browser and (
        sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        import webbrowser  # only with a screen: on a server a text browser would take over the terminal

        webbrowser.open(url)
    try:
        uvicorn_server(app).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
