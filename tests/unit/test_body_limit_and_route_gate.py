"""BodyLimitMiddleware and RouteGateMiddleware on stand-in apps."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.asgi_apps import json_app, request
from vllm_acs.contract.routes import Surface
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
    assert request(gate, "GET", "/health").status_code == 200
    assert request(gate, "GET", "/openapi.json").status_code == 200
    missing = request(gate, "GET", "/v1/embeddings")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    wrong = request(gate, "PUT", "/v1/completions")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
    assert request(gate, "POST", "/health").headers["allow"] == "GET, HEAD"
    chat = request(gate, "POST", "/v1/chat/completions")
    assert chat.json()["error"]["code"] == "chat_completions_unsupported"


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/metrics/x", "/", "/v2/x"])
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE", "OPTIONS"])
def test_everything_outside_the_surface_is_a_404_before_the_app_runs(path, method):
    calls: list[str] = []

    async def app(scope, receive, send):
        calls.append(scope["path"])
        await json_app(200, {"ok": True})(scope, receive, send)

    response = request(RouteGateMiddleware(app), method, path)
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")
    assert calls == []


def test_exposed_routes_pass_and_metrics_can_be_closed():
    app = json_app(200, {"ok": True})
    default = RouteGateMiddleware(app, Surface())
    assert request(default, "GET", "/metrics").status_code == 200
    assert request(default, "POST", "/tokenize").status_code == 404
    opened = RouteGateMiddleware(app, Surface(["/tokenize"], metrics=False))
    assert request(opened, "POST", "/tokenize").status_code == 200
    assert request(opened, "POST", "/detokenize").status_code == 404
    assert request(opened, "GET", "/metrics").status_code == 404


def test_head_is_get_without_the_body():
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["method"])
        await json_app(200, {"ok": True})(scope, receive, send)

    response = request(RouteGateMiddleware(app), "HEAD", "/health")
    assert (response.status_code, response.content, seen) == (200, b"", ["GET"])


def test_a_cors_preflight_passes_to_the_app_on_public_routes_only():
    gate = RouteGateMiddleware(json_app(200, {"ok": True}))
    preflight = {"Origin": "https://x.example", "Access-Control-Request-Method": "POST"}
    assert request(gate, "OPTIONS", "/v1/completions", headers=preflight).status_code == 200
    assert request(gate, "OPTIONS", "/v1/completions").status_code == 405
    assert request(gate, "OPTIONS", "/invocations", headers=preflight).status_code == 404


def test_websockets_are_closed_before_the_app_runs():
    sent: list[dict] = []
    calls: list[str] = []

    async def app(scope, receive, send):
        calls.append(scope["path"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "websocket.connect"}

    scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    asyncio.run(RouteGateMiddleware(app)(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert calls == []


def test_route_labels_are_templates_never_client_paths():
    surface = Surface(["/tokenize"])
    assert surface.route_label("/v1/models/some-model") == "/v1/models/{model_id}"
    assert surface.route_label("/tokenize") == "/tokenize"
    assert surface.route_label("/metrics") == "/metrics"
    assert surface.route_label("/secret/acs-bm-12345678") == "other"
