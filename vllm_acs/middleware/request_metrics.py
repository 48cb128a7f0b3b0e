"""RequestMetricsMiddleware: counts every answer by route template, method, status and error code.

API server process, just inside RequestId and outside the route gate, so the gate's 404s are
counted too (as route `other`). The spec error code comes from `scope["state"]`, where every
envelope the plugin sends notes it (`asgi.note_error_code`); a stream that ended in an error
frame counts with status 200 and that code.
"""

from __future__ import annotations

from ..contract.routes import Surface
from ..metrics import REQUESTS, method_label
from .asgi import ASGIApp, Message, Receive, Scope, Send, error_code


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, surface: Surface) -> None:
        self.app = app
        self.surface = surface

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            # A request that ended before any answer (the client left) counts as 499.
            REQUESTS.labels(
                route=self.surface.route_label(scope["path"]),
                method=method_label(scope["method"]),
                status=str(status or 499),
                code=error_code(scope),
            ).inc()
