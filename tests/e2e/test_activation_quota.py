"""The per-key monthly activation quota on the real server: one capture fits a quota of 1, the
next is `429 activation_quota_exceeded` (not retryable), and plain completions never count."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e

BODY = {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 2}
CAPTURE = {**BODY, "output_residual_stream": [0]}


def _post(server, key: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_a_quota_of_one_admits_one_activation_request(acs_server):
    key = acs_server.create_key("activation-quota-lab", "--monthly-activations", "1")

    first = _post(acs_server, key, CAPTURE)
    assert first.status_code == 200, first.text
    assert "activations" in first.json()

    second = _post(acs_server, key, CAPTURE)
    assert second.status_code == 429, second.text
    body = second.json()
    assert body["error"]["code"] == "activation_quota_exceeded"
    assert body["error"]["type"] == "rate_limit_error"
    assert "start of next month" in body["error"]["message"]
    assert body["request_id"] == second.headers["x-request-id"]
    assert second.headers["x-should-retry"] == "false"
    assert "retry-after" not in second.headers
    assert "retry-after-ms" not in second.headers

    plain = _post(acs_server, key, BODY)
    assert plain.status_code == 200, plain.text
    assert "activations" not in plain.json()
