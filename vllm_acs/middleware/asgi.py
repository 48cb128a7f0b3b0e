"""Small ASGI helpers the middleware share: headers, JSON answers, body read and replay.

API server process. Works on raw ASGI messages, so it runs in front of any route, vLLM's included.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..errors import ERROR_CODE_STATE_KEY, REQUEST_ID_STATE_KEY, AcsError, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (name in lower case), decoded as latin-1."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def request_id(scope: Scope) -> str | None:
    return scope.get("state", {}).get(REQUEST_ID_STATE_KEY)


async def send_json(
    send: Send, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    raw_headers += [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


async def send_error(scope: Scope, send: Send, error: AcsError) -> None:
    """Answers `error` in the spec's envelope, with the request id of this request."""
    note_error_code(scope, error.code)
    await send_json(send, error.status, error_body(error, request_id(scope)), error.headers)


def note_error_code(scope: Scope, code: str) -> None:
    """Remembers the spec code this request is answered with, for the request metrics."""
    scope.setdefault("state", {})[ERROR_CODE_STATE_KEY] = code


def error_code(scope: Scope) -> str:
    return scope.get("state", {}).get(ERROR_CODE_STATE_KEY, "")


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields `body` once, then defers to the real one (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def with_header(scope: Scope, name: bytes, value: bytes) -> Scope:
    """A copy of `scope` where request header `name` has exactly `value`."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k != name]
    headers.append((name, value))
    return {**scope, "headers": headers}
