"""The node's surface on real servers: default deny, and what an operator exposes on purpose.

Every route of the live app (vLLM's `build_app` with the server's own arguments, environment and
supported tasks, see live_routes.py), vLLM 0.32/0.33 paths and made-up ones, every method, with
and without a key: outside `/v1` (as the spec defines it), `/health`, `/openapi.json` and its UI
and `/metrics`, the answer is the envelope's 404. A second node runs with vLLM's dev routes on,
`/tokenize` exposed and `/metrics` closed.
"""

from __future__ import annotations

import ast
import http.client
import itertools
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import CHECKPOINT, MODEL_ID, ServerProcess, running_server

pytestmark = pytest.mark.e2e

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# The spec's public surface (shared/spec/DECISIONS.md, "The node's surface") and its methods.
PUBLIC = {
    "/v1/completions": {"POST"},
    "/v1/chat/completions": {"POST"},
    "/v1/models": {"GET", "HEAD"},
    "/v1/models/x": {"GET", "HEAD"},
    "/v1/models/x/status": {"GET", "HEAD"},
    "/v1/completion-jobs": {"POST"},
    "/v1/completion-jobs/x": {"GET", "HEAD", "DELETE"},
    "/v1/completion-jobs/x/result": {"GET", "HEAD"},
    "/v1/harvest": {"POST"},
    "/v1/harvest/x": {"GET", "HEAD", "DELETE"},
    "/v1/looms": {"POST", "GET", "HEAD"},
    "/v1/looms/import": {"POST"},
    "/v1/looms/x": {"GET", "HEAD", "PATCH", "DELETE"},
    "/v1/looms/x/export": {"GET", "HEAD"},
    "/v1/looms/x/nodes/x": {"GET", "HEAD", "PATCH", "DELETE"},
    "/v1/looms/x/nodes/x/text": {"GET", "HEAD"},
    **{
        f"/v1/looms/x/nodes/x/{action}": {"POST"}
        for action in ("branch", "split", "children", "siblings", "replay", "score")
    },
    "/v1/keys": {"POST", "GET", "HEAD"},
    "/v1/keys/x": {"PATCH", "DELETE"},
    "/v1/usage": {"GET", "HEAD"},
    # Apply for access (answers without a key; a 404 applications_closed while the form is
    # closed) and the operator's admin API (issue 34): the project's own, beyond the spec.
    "/v1/applications": {"POST"},
    "/v1/applications/form": {"GET", "HEAD"},
    "/v1/applications/claim": {"POST"},
    "/v1/admin/applications": {"GET", "HEAD"},
    "/v1/admin/applications/x/approve": {"POST"},
    "/v1/admin/applications/x/reject": {"POST"},
    "/v1/admin/accounts": {"GET", "HEAD"},
    "/v1/admin/accounts/x": {"GET", "HEAD", "PATCH"},
    "/v1/admin/keys": {"GET", "HEAD"},
    "/v1/admin/keys/x": {"PATCH", "DELETE"},
    "/v1/admin/usage": {"GET", "HEAD"},
    "/v1/admin/nodes": {"GET", "HEAD"},
    "/v1/admin/audit": {"GET", "HEAD"},
    "/downloads/x/x": {"GET", "HEAD"},
    "/health": {"GET", "HEAD"},
    "/openapi.json": {"GET", "HEAD"},
    "/docs": {"GET", "HEAD"},
    "/docs/swagger-init.js": {"GET", "HEAD"},
    "/static/swagger-ui-bundle.js": {"GET", "HEAD"},
    "/static/swagger-ui.css": {"GET", "HEAD"},
    "/workbench": {"GET", "HEAD"},
    "/workbench/": {"GET", "HEAD"},  # redirected to /workbench
    "/workbench/x": {"GET", "HEAD"},
}
# Routes vLLM 0.32 and 0.33 register depending on flags, tasks and environment.
VLLM_PATHS = (
    "/invocations", "/ping", "/tokenize", "/detokenize", "/load", "/version", "/server_info",
    "/inference/v1/generate", "/inference/v1/abort_requests", "/pause", "/resume", "/is_paused",
    "/abort_requests", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/reset_prefix_cache",
    "/reset_mm_cache", "/reset_encoder_cache", "/sleep", "/wake_up", "/is_sleeping",
    "/collective_rpc", "/start_profile", "/stop_profile", "/update_weights",
    "/init_weight_transfer_engine", "/get_world_size", "/kv_event_sources",
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pooling", "/classify", "/score",
    "/rerank", "/v1/score", "/v1/rerank", "/v2/rerank", "/v1/embeddings", "/v2/embed",
    "/v1/responses", "/v1/responses/x", "/v1/messages", "/v1/messages/count_tokens",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/realtime",
    "/v1/chat/completions/render", "/v1/completions/render", "/v1/completions/derender",
    "/get_tokenizer_info", "/generative_scoring", "/v1/systemone",
)  # fmt: skip
STATIC_DOCS = ("/static/swagger-ui-bundle.js", "/static/swagger-ui.css", "/docs/swagger-init.js")
MADE_UP = (
    "/", "/made-up", "/v2/completions", "/invocations/", "/v1/completions/", "//v1/completions",
    "/v1", "/v1/", "/metrics/x", "/healthz", "/HEALTH", "/docs/x", "/v1/models/x/y", "/redoc",
    "/v1/models/x/status/x", "/workbench//", "/workbench/x/y", "/workbench/../invocations",
    "/static/x.js",
    "/static/../invocations", "/v1/completions%2Frender",
)  # fmt: skip


def live_paths(server: ServerProcess) -> list[str]:
    """The concrete paths of every route the live app has (path parameters filled in)."""
    found = re.search(r"Supported tasks: (.+)", server.log_path.read_text(errors="replace"))
    assert found, "the server log names its supported tasks"
    tasks = list(ast.literal_eval(found.group(1).strip()))
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.live_routes", json.dumps(tasks), *server.serve_args],
        env=server.environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("ROUTES "))
    routes = json.loads(line.removeprefix("ROUTES "))
    assert any(r["path"] == "/invocations" for r in routes)  # it sees vLLM's own routes
    return sorted({re.sub(r"\{[^}]+\}", "x", r["path"]) for r in routes})


def assert_closed(server: ServerProcess, paths: set[str], key: str) -> int:
    """Every method on every path: the envelope's 404, with and without a key.

    http.client sends each path exactly as written (httpx would resolve `..` and `//`)."""
    body = json.dumps({"model": MODEL_ID, "prompt": "hi", "max_tokens": 1})
    checked = 0
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        for path, method, keyed in itertools.product(sorted(paths), METHODS, (False, True)):
            headers = {"Content-Type": "application/json"}
            if keyed:
                headers["Authorization"] = f"Bearer {key}"
            content = None if method in ("GET", "HEAD", "OPTIONS") else body
            connection.request(method, path, body=content, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            where = f"{method} {path} {'with' if keyed else 'without'} a key"
            assert response.status == 404, f"{where}: {response.status} {raw[:200]!r}"
            request_id = response.getheader("x-request-id")
            assert request_id, where
            if method != "HEAD":
                error = json.loads(raw)
                assert error["error"]["code"] == "not_found", where
                assert error["request_id"] == request_id, where
            checked += 1
    finally:
        connection.close()
    return checked


@pytest.fixture(scope="module")
def exposing_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """vLLM's dev routes registered, `/tokenize` exposed, `/metrics` closed, CORS for one origin."""
    with running_server(
        tiny_model_dir,
        tmp_path_factory.mktemp("surface-home"),
        env={
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_ACS_EXPOSE_VLLM_ROUTES": "/tokenize",
            "VLLM_ACS_EXPOSE_METRICS": "false",
        },
        extra_args=["--allowed-origins", '["https://loom.example"]'],
    ) as server:
        yield server


def test_every_route_outside_the_surface_is_a_404(acs_server, api_key):
    paths = set(live_paths(acs_server)) | set(VLLM_PATHS) | set(MADE_UP)
    closed = paths - set(PUBLIC) - {"/metrics"}
    assert {"/invocations", "/tokenize", "/version", "/ping"} <= closed
    assert assert_closed(acs_server, closed, api_key) == len(closed) * len(METHODS) * 2


def test_public_routes_answer_other_methods_with_405(acs_server, api_key):
    for path, allowed in PUBLIC.items():
        for method in sorted(set(METHODS) - allowed):
            url = f"{acs_server.base_url}{path}"
            response = httpx.request(method, url, headers={"Authorization": f"Bearer {api_key}"})
            assert response.status_code == 405, f"{method} {path}"
            assert set(response.headers["allow"].split(", ")) == allowed
            if method != "HEAD":
                assert response.json()["error"]["code"] == "method_not_allowed"


def test_the_public_surface_outside_v1_needs_no_key(acs_server):
    for path in (
        "/health",
        "/openapi.json",
        "/docs",
        *STATIC_DOCS,
        "/workbench",
        "/workbench/app.js",
    ):
        response = httpx.get(f"{acs_server.base_url}{path}")
        assert response.status_code == 200, path
        assert response.headers["x-request-id"]
    assert httpx.head(f"{acs_server.base_url}/health").status_code == 200
    folder = httpx.get(f"{acs_server.base_url}/workbench/")
    assert (folder.status_code, folder.headers["location"]) == (308, "/workbench")


def test_invocations_never_produce_a_completion(acs_server, api_key):
    body = {"model": CHECKPOINT, "prompt": "hello", "max_tokens": 3, "temperature": 5000}
    for headers in ({}, {"Authorization": f"Bearer {api_key}"}):
        response = httpx.post(f"{acs_server.base_url}/invocations", json=body, headers=headers)
        assert response.status_code == 404
        assert "choices" not in response.json()
        assert response.json()["error"]["code"] == "not_found"


def test_metrics_are_exposed_by_default(acs_server):
    response = httpx.get(f"{acs_server.base_url}/metrics")
    assert response.status_code == 200
    assert "vllm:" in response.text


def test_a_cors_preflight_reaches_vllms_cors_middleware(exposing_server):
    response = httpx.options(
        f"{exposing_server.base_url}/v1/completions",
        headers={"Origin": "https://loom.example", "Access-Control-Request-Method": "POST"},
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://loom.example"


@pytest.mark.parametrize("path", ["/v1/realtime", "/made-up", "/v1/completions"])
def test_websocket_handshakes_are_refused(acs_server, path):
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", acs_server.port), timeout=30) as sock:
        sock.sendall(request.encode())
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    status = int(status_line.split()[1])
    assert status in (403, 404), status_line  # never 101 Switching Protocols


def test_an_exposed_route_is_served_and_only_that_one(exposing_server):
    key = exposing_server.create_key()
    tokenized = httpx.post(
        f"{exposing_server.base_url}/tokenize", json={"model": CHECKPOINT, "prompt": "hello"}
    )
    assert tokenized.status_code == 200
    assert tokenized.json()["tokens"]
    paths = set(live_paths(exposing_server)) | set(VLLM_PATHS)
    closed = paths - set(PUBLIC) - {"/tokenize"}
    # The dev routes exist on this node's app, and the gate closes them all.
    assert {"/sleep", "/collective_rpc", "/pause", "/metrics", "/detokenize"} <= closed
    assert assert_closed(exposing_server, closed, key) == len(closed) * len(METHODS) * 2
    assert httpx.get(f"{exposing_server.base_url}/health").status_code == 200
