"""Every /v1 failure path answers the spec's envelope, with request_id == X-Request-Id."""

from __future__ import annotations

import gzip

import httpx
import pytest

pytestmark = pytest.mark.e2e

# (what fails, method, path, body, status, code): one per kind of failure the plugin or vLLM
# can produce, with the status and `error.code` the spec (and docs/decisions.md) gives it.
FAILURE_PATHS = [
    ("bad JSON", "POST", "/v1/completions", b"{", 400, "bad_json"),
    ("schema", "POST", "/v1/completions", b'{"prompt": "x", "nope": 1}', 400, "invalid_request"),
    ("a rule", "POST", "/v1/completions", b'{"prompt": ["a", "b"]}', 400, "invalid_request"),
    (
        "model",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "model": "gpt-4"}',
        400,
        "model_not_found",
    ),
    (
        "deadline",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "max_tokens": 20000}',
        400,
        "deadline_infeasible",
    ),
    (
        "context",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "max_tokens": 5000, "stream": true}',
        400,
        "context_length_exceeded",
    ),
    (
        "engine",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "max_tokens": 2, "n": 3, "temperature": 0}',
        400,
        "vllm_invalid_request",
    ),
    (
        "chat",
        "POST",
        "/v1/chat/completions",
        b'{"messages": []}',
        400,
        "chat_completions_unsupported",
    ),
    ("route", "GET", "/v1/files", None, 404, "not_found"),
    ("route under a known one", "GET", "/v1/models/a/b", None, 404, "not_found"),
    ("method", "PUT", "/v1/models", None, 405, "method_not_allowed"),
    ("id", "GET", "/v1/models/unknown-model", None, 404, "model_not_found"),
    (
        "size",
        "POST",
        "/v1/completions",
        b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}',
        413,
        "request_too_large",
    ),
]


@pytest.mark.parametrize("client_id", ["walk-1", None, "not valid!"])
@pytest.mark.parametrize(("what", "method", "path", "body", "status", "code"), FAILURE_PATHS)
def test_failure_answers_the_envelope(
    acs_server, auth, what, method, path, body, status, code, client_id
):
    headers = {"Content-Type": "application/json", **auth}
    if client_id is not None:
        headers["X-Request-Id"] = client_id
    response = httpx.request(
        method, acs_server.base_url + path, content=body, headers=headers, timeout=60
    )
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/json"
    body_json = response.json()
    assert set(body_json) == {"error", "request_id"}
    assert set(body_json["error"]) >= {"message", "type", "param", "code"}
    assert body_json["error"]["code"] == code
    assert "detail" not in response.text
    rid = response.headers["x-request-id"]
    assert body_json["request_id"] == rid
    if client_id == "walk-1":
        assert rid == "walk-1"
    else:
        assert rid != client_id and 1 <= len(rid) <= 64


def test_json_of_500_bytes_or_more_is_gzipped_when_asked(acs_server, auth):
    body = {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 40}
    url = f"{acs_server.base_url}/v1/completions"
    with httpx.Client(headers=auth) as client:
        big = client.post(url, json=body, headers={"Accept-Encoding": "gzip"})
        assert big.headers["content-encoding"] == "gzip"
        assert len(big.content) >= 500  # httpx decompressed it
        plain = client.post(url, json=body, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        small = client.get(
            f"{acs_server.base_url}/v1/models/x", headers={"Accept-Encoding": "gzip"}
        )
        assert "content-encoding" not in small.headers  # under 500 bytes


def test_raw_gzip_bytes_decode(acs_server, auth):
    body = b'{"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 40}'
    # httpx's default 5 s read timeout is less than 40 tokens take on a loaded two-core host.
    with httpx.Client(headers=auth, timeout=60) as client:
        request = client.build_request(
            "POST",
            f"{acs_server.base_url}/v1/completions",
            content=body,
            headers={"Accept-Encoding": "gzip", "Content-Type": "application/json"},
        )
        response = client.send(request, stream=True)
        raw = b"".join(response.iter_raw())
    assert raw[:2] == b"\x1f\x8b"
    assert b'"text_completion"' in gzip.decompress(raw)


def test_stream_is_never_gzipped(acs_server, auth):
    body = {"prompt": "The sky is", "max_tokens": 40, "stream": True}
    with httpx.stream(
        "POST",
        f"{acs_server.base_url}/v1/completions",
        json=body,
        headers={"Accept-Encoding": "gzip", **auth},
    ) as response:
        text = "".join(response.iter_text())
        assert "content-encoding" not in response.headers
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-acs-upstream-model"] == "vllm-acs/tiny-llama"
    assert text.rstrip().endswith("data: [DONE]")
