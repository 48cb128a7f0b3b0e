"""BodyLimitMiddleware and RouteGateMiddleware on stand-in apps."""

from __future__ import annotations

import asyncio

from tests.unit.asgi_apps import json_app, request
from vllm_acs.middleware.asgi import read_body
from vllm_acs.middleware.body_limit import BodyLimitMiddleware
from vllm_acs.middleware.route_gate import RouteGateMiddleware


def _reading_app(sizes: list[int]):
    async def app(scope, receive, send):
        sizes.append(len(await read_body(receive)))
        await json_app(200, {"ok": True})(scope, receive, send)

    return app


def test_declared_length_over_the_limit_is_refused_unread():
    seen: list[int] = []
    response = request(BodyLimitMiddleware(_reading_app(seen), limit_bytes=10), content=b"x" * 11)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert response.headers["x-should-retry"] == "false"
    assert seen == []


def test_chunked_body_is_refused_once_it_passes_the_limit():
    seen: list[int] = []
    chunks_read = 0

    async def receive():
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b"x" * 4, "more_body": True}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(BodyLimitMiddleware(_reading_app(seen), limit_bytes=10)(scope, receive, send))
    assert sent[0]["status"] == 413
    assert chunks_read == 3  # 12 bytes: stopped at the first chunk past the limit
    assert seen == []


def test_body_at_the_limit_passes():
    seen: list[int] = []
    response = request(BodyLimitMiddleware(_reading_app(seen), limit_bytes=10), content=b"x" * 10)
    assert response.status_code == 200
    assert seen == [10]


def test_route_gate():
    gate = RouteGateMiddleware(json_app(200, {"ok": True}))
    assert request(gate, "POST", "/v1/completions").status_code == 200
    assert request(gate, "GET", "/v1/models/abc").status_code == 200
    assert request(gate, "HEAD", "/v1/models").status_code == 200
    assert request(gate, "GET", "/health").status_code == 200
    missing = request(gate, "GET", "/v1/embeddings")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    wrong = request(gate, "PUT", "/v1/completions")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
    chat = request(gate, "POST", "/v1/chat/completions")
    assert chat.json()["error"]["code"] == "chat_completions_unsupported"
