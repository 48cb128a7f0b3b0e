"""RouteGateMiddleware: only the public /v1 routes are reachable; others are 404, wrong methods 405.

API server process. `/v1/chat/completions` is answered `400 chat_completions_unsupported` here,
so vLLM's chat route is never reached. Paths outside /v1 (e.g. /health) pass untouched.
"""

from __future__ import annotations

from ..contract.routes import allowed_methods, find_route
from ..errors import ChatCompletionsUnsupported, MethodNotAllowed, NotFound
from .asgi import ASGIApp, Receive, Scope, Send, send_error

CHAT_PATH = "/v1/chat/completions"


class RouteGateMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        route = find_route(path)
        if route is None:
            await send_error(
                scope, send, NotFound(f"Unknown route: {method} {path}. See /openapi.json.")
            )
            return
        allowed = allowed_methods(route)
        if method not in allowed:
            error = MethodNotAllowed(
                f"{method} is not allowed on {path}; use {', '.join(allowed)}.",
                headers={"allow": ", ".join(allowed)},
            )
            await send_error(scope, send, error)
            return
        if path == CHAT_PATH:
            await send_error(
                scope,
                send,
                ChatCompletionsUnsupported(
                    "POST /v1/chat/completions is not supported: these are base models with no "
                    "chat template. Use POST /v1/completions with a raw prompt.",
                ),
            )
            return
        await self.app(scope, receive, send)
