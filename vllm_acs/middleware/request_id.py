"""RequestIdMiddleware: gives every request an id and puts it on every answer as X-Request-Id.

API server process; the outermost of the plugin's middleware. The client's id is kept when it is
1-64 of [A-Za-z0-9_-]; otherwise a new one is made. vLLM sees the same id in the request header.
"""

from __future__ import annotations

import uuid

from ..errors import REQUEST_ID_PATTERN
from .asgi import REQUEST_ID_STATE_KEY, ASGIApp, Message, Receive, Scope, Send, header, with_header

_HEADER = b"x-request-id"


def choose_request_id(client_value: str | None) -> str:
    if client_value is not None and REQUEST_ID_PATTERN.fullmatch(client_value):
        return client_value
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = choose_request_id(header(scope, _HEADER))
        scope.setdefault("state", {})[REQUEST_ID_STATE_KEY] = rid
        encoded = rid.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER]
                headers.append((_HEADER, encoded))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(with_header(scope, _HEADER, encoded), receive, send_with_id)
