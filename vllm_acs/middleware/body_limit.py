"""BodyLimitMiddleware: a /v1 body over the limit is refused (413 request_too_large), unread.

API server process. A declared Content-Length over the limit is refused before any byte is read;
a chunked body is counted as it arrives and refused as soon as it passes the limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import RequestTooLarge
from .asgi import ASGIApp, Message, Receive, Scope, Send, header, send_error


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        limit_bytes: int,
        prefix: str = "/v1/",
        route_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.default_limit = limit_bytes
        self.prefix = prefix
        # Exact paths with a limit of their own (POST /v1/harvest takes 50 MB).
        self.route_limits = dict(route_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        limit = self.route_limits.get(scope["path"], self.default_limit)
        too_large = RequestTooLarge(
            f"The request body is larger than {limit} bytes. Send fewer or shorter prompts."
        )
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_error(scope, send, too_large)
            return

        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await send_error(scope, send, too_large)
