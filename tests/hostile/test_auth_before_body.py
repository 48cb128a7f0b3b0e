"""Authentication comes before any body is read, forwarding included (issue 31, finding 5).

Against the session's real node, made part of a deployment that serves a second model: a stand-in
node of `tiny-other` (a small HTTP server in this process) is announced in the node's model
registry, as a real second node would announce itself, so the node forwards that model's
requests. (A second vLLM server would cost a minute of the suite for nothing this checks: the
forwarding of real answers is tests/deployment/test_behind_nginx.py's.)

An anonymous request, or one with an unknown key, that declares megabytes and sends 64 KB is
answered 401 at once, not after waiting for a body that never comes; a good key's request is still
forwarded; a key without the route's scope, and a body past the route's limit, never reach the
other node.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness import ServerProcess, wait_until
from vllm_acs.served_model import ServedModel
from vllm_acs.settings import Settings
from vllm_acs.storage.api_key_secret import new_secret

pytestmark = pytest.mark.e2e

OTHER_ID = "tiny-other"
OTHER = ServedModel(OTHER_ID, "vllm-acs/tiny-other", 2048, 20, "cpu", 0)
# Sent of each body before the client waits for the answer.
SENT = 64 * 1024
ANSWER_WITHIN_S = 1.5
# (path, declared Content-Length): each under its route's body limit (harvests take 50 MB).
DECLARED = [
    ("/v1/harvest", 40_000_000),
    ("/v1/completions", 4_000_000),
    ("/v1/completion-jobs", 4_000_000),
    ("/v1/looms/loom_x/nodes/node_x/branch", 4_000_000),
]


class OtherNode:
    """The stand-in node of `tiny-other`: records what is forwarded to it, answers 200."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                received.append({"path": self.path, "headers": dict(self.headers), "body": body})
                answer = b'{"answered_by": "tiny-other"}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _registry(server: ServerProcess, change: str, node_id: str, address: str = "") -> None:
    from vllm_acs.storage.db import create_engine
    from vllm_acs.storage.registry import RegistryRepository

    settings = Settings(home=Path(server.env["VLLM_ACS_HOME"]))
    engine = create_engine(settings.resolved_database_url)
    try:
        registry = RegistryRepository(engine)
        if change == "announce":
            # A heartbeat a day ahead: live for the module without a beating thread.
            ahead = datetime.now(timezone.utc) + timedelta(days=1)
            await registry.announce(node_id, address, OTHER, ahead)
        else:
            await registry.leave(node_id)
    finally:
        await engine.dispose()


def _model_ids(server: ServerProcess, key: str) -> set[str]:
    answer = httpx.get(
        f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    return {model["id"] for model in answer.json()["data"]}


@pytest.fixture(scope="module")
def other_node(acs_server: ServerProcess, api_key: str) -> Iterator[OtherNode]:
    node = OtherNode()
    node_id = "hostile-" + secrets.token_hex(4)
    asyncio.run(_registry(acs_server, "announce", node_id, node.address))
    try:
        wait_until(lambda: OTHER_ID in _model_ids(acs_server, api_key), "tiny-other listed")
        yield node
    finally:
        asyncio.run(_registry(acs_server, "leave", node_id))
        wait_until(lambda: OTHER_ID not in _model_ids(acs_server, api_key), "tiny-other gone")
        node.close()


def _declare_and_stall(
    base_url: str, path: str, declared: int, authorization: str | None
) -> tuple[int, dict[str, Any], float]:
    """POSTs a head declaring `declared` bytes and SENT bytes of a body naming tiny-other, then
    waits: (status, JSON answer, seconds until the answer's head)."""
    url = urlsplit(base_url)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {url.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {declared}",
    ]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    start = b'{"model": "' + OTHER_ID.encode() + b'", "prompt": "'
    body = start + b"a" * (SENT - len(start))
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(head + body)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                assert chunk, "the node closed the connection without an answer"
                data += chunk
            took = time.monotonic() - started
            answer_head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in answer_head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(rest) < length:
                rest += sock.recv(65536)
        except TimeoutError:
            raise AssertionError(
                f"{path}: no answer in 5 s (the node waits for the body)"
            ) from None
    status = int(answer_head.split(b" ", 2)[1])
    return status, json.loads(rest[:length]), took


@pytest.mark.parametrize(("path", "declared"), DECLARED)
def test_a_request_without_a_good_key_is_refused_before_its_body_arrives(
    acs_server, other_node, path, declared
):
    for authorization, code in (
        (None, "missing_authorization"),
        (f"Bearer {new_secret()}", "invalid_api_key"),
    ):
        status, answer, took = _declare_and_stall(
            acs_server.base_url, path, declared, authorization
        )
        assert (status, answer["error"]["code"]) == (401, code), answer
        print(f"{path} ({declared / 1e6:.0f} MB declared, {code}): 401 in {took * 1000:.0f} ms")
        assert took < ANSWER_WITHIN_S, took
    assert other_node.received == []


def test_a_good_keys_request_for_the_other_model_is_still_forwarded(
    acs_server, other_node, api_key
):
    body = {"model": OTHER_ID, "prompt": "The sky is", "max_tokens": 2}
    answer = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {api_key}", "X-Request-Id": "hostile-forward-1"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"answered_by": "tiny-other"}
    (forwarded,) = other_node.received
    other_node.received.clear()
    assert forwarded["path"] == "/v1/completions"
    assert json.loads(forwarded["body"]) == body
    headers = {k.lower(): v for k, v in forwarded["headers"].items()}
    # The serving node checks the key again; the request is never forwarded twice.
    assert headers["authorization"] == f"Bearer {api_key}"
    assert headers["x-acs-forwarded-by"]
    assert headers["x-request-id"] == "hostile-forward-1"


def test_a_key_without_the_routes_scope_and_a_body_past_the_limit_stay_here(
    acs_server, other_node, api_key
):
    jobs_only = acs_server.create_key("hostile-scopes", "--scopes", "jobs")
    body = {"model": OTHER_ID, "prompt": "The sky is", "max_tokens": 2}
    denied = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {jobs_only}"},
        timeout=30,
    )
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "scope_denied"

    # A chunked body (no Content-Length) is counted as it comes: past 8 MiB it is a 413,
    # whichever node serves the model it names.
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + OTHER_ID.encode() + b'", "prompt": "'
        for _ in range(10):
            yield b"a" * 1024 * 1024
        yield b'"}'

    too_large = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        content=chunks(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["error"]["code"] == "request_too_large"
    assert other_node.received == []
