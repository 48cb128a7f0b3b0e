"""The /v1 contract, case by case, against the real server: status, error.code, param, headers."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.contract_cases import CASES, Case

pytestmark = pytest.mark.e2e


def _send(api: httpx.Client, case: Case) -> httpx.Response:
    headers = {"X-Request-Id": f"case-{abs(hash(case.name)) % 10**12}", **case.request_headers}
    if isinstance(case.body, bytes):
        content = case.body
    elif case.method in ("GET", "DELETE") and case.body is None:
        content = None
    else:
        content = json.dumps(case.body).encode()
    if content is not None:
        headers["Content-Type"] = "application/json"
    return api.request(case.method, case.path, content=content, headers=headers)


def test_there_are_at_least_80_cases():
    assert len(CASES) >= 80
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(api, case: Case):
    response = _send(api, case)
    assert response.status_code == case.status, response.text[:500]
    rid = response.headers["x-request-id"]
    for name, value in case.headers.items():
        assert response.headers.get(name) == value, name
    for name in case.absent_headers:
        assert name not in response.headers
    if case.status == 200:
        return
    body = response.json()
    assert set(body) == {"error", "request_id"}
    assert body["request_id"] == rid
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == case.code
    if case.param is not None:
        assert error["param"] == case.param
        if error["code"] == "invalid_request" and "Unknown field" in error["message"]:
            assert case.param in error["message"]
