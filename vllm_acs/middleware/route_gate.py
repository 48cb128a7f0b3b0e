"""RouteGateMiddleware: the node answers only on its surface; everything else is a 404.

API server process, outside all of vLLM's middleware and routes (`_entry.py` puts it there), so
no vLLM handler runs for a path the surface does not hold: a route a later vLLM adds is closed
without a code change. Public routes answer other methods with 405 (a CORS preflight passes on
to vLLM's CORS middleware) and HEAD as GET without the body; `/v1/chat/completions` is
`400 chat_completions_unsupported`; exposed vLLM routes pass as vLLM serves them. WebSocket
connections are refused: the surface has none.
"""

from __future__ import annotations

from ..contract.routes import Surface, allowed_methods
from ..errors import ChatCompletionsUnsupported, MethodNotAllowed, NotFound, echoed
from .asgi import ASGIApp, Message, Receive, Scope, Send, header, send_error

CHAT_PATH = "/v1/chat/completions"
# The close code for a WebSocket handshake to a path the surface does not hold: the server
# answers the handshake 403 and nothing behind the gate runs.
_POLICY_VIOLATION = 1008


class RouteGateMiddleware:
    def __init__(self, app: ASGIApp, surface: Surface | None = None) -> None:
        self.app = app
        self.surface = surface or Surface()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket" and not self.surface.is_exposed(scope["path"]):
            await send({"type": "websocket.close", "code": _POLICY_VIOLATION})
            return
        if kind != "http" or self.surface.is_exposed(scope["path"]):
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        route = self.surface.find(path)
        if route is None:
            await send_error(
                scope,
                send,
                NotFound(f"Unknown route: {echoed(method)} {echoed(path)}. See /openapi.json."),
            )
            return
        allowed = allowed_methods(route)
        if method not in allowed and not _is_cors_preflight(scope):
            error = MethodNotAllowed(
                f"{echoed(method)} is not allowed on {echoed(path)}; use {', '.join(allowed)}.",
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
        if method == "HEAD" and "GET" in route.methods:
            await self.app({**scope, "method": "GET"}, receive, _headers_only(send))
            return
        await self.app(scope, receive, send)


def _headers_only(send: Send) -> Send:
    """HEAD is GET without the body (vLLM's FastAPI routes answer HEAD with 405 otherwise)."""

    async def send_headers(message: Message) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b""}
        await send(message)

    return send_headers


def _is_cors_preflight(scope: Scope) -> bool:
    """A browser's `OPTIONS` before a cross-origin call to a public route: vLLM's CORS answers."""
    return (
        scope["method"] == "OPTIONS"
        and header(scope, b"origin") is not None
        and header(scope, b"access-control-request-method") is not None
    )
