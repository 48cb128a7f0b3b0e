"""Prints, as JSON, every route of the app vLLM builds for some `serve` arguments.

Run by test_surface.py as `python -m tests.e2e.live_routes TASKS_JSON SERVE_ARGS...` with the
server's own environment: vLLM's `build_app` with the server's arguments and supported tasks
registers the routes the live server has (conditional ones included), our plugin's among them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any


def walk(routes: Iterable[Any], prefix: str = "") -> Iterator[dict[str, Any]]:
    """Each route's path and methods; mounts and included routers are opened up."""
    for route in routes:
        path = prefix + (getattr(route, "path", None) or "")
        children = getattr(route, "routes", None)
        methods = getattr(route, "methods", None)
        if methods is not None:
            yield {"path": path, "kind": "http", "methods": sorted(methods)}
        elif type(route).__name__.startswith("WebSocket"):
            yield {"path": path, "kind": "websocket", "methods": []}
        elif children:
            yield from walk(children, path)
        else:  # a mount of a plain ASGI app (e.g. /metrics): any method, any subpath
            yield {"path": path, "kind": "mount", "methods": []}


def main() -> None:
    from vllm_acs.launcher import parse_serve_args, plugin_environment

    tasks = tuple(json.loads(sys.argv[1]))
    plugin_environment(os.environ)
    args = parse_serve_args(sys.argv[2:])
    from vllm.entrypoints.launchers.app import build_app

    app = build_app(args, tasks, None)
    print("ROUTES " + json.dumps(list(walk(app.routes))))


if __name__ == "__main__":
    main()
