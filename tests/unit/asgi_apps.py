"""Small ASGI apps standing in for vLLM's routes in middleware unit tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


def json_app(status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None):
    async def app(scope, receive, send):
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return app


def sse_app(events: list[bytes], fail_after: int | None = None):
    """Streams `events` as SSE chunks; raises after `fail_after` chunks when set."""

    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for i, event in enumerate(events):
            if fail_after is not None and i == fail_after:
                raise RuntimeError("secret internal detail")
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def request(
    app: Callable[..., Awaitable[None]],
    method: str = "POST",
    path: str = "/v1/completions",
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(call())
