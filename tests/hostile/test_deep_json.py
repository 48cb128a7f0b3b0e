"""Finding 1 of the hostile-input review: a body of 100,000 nested arrays or objects is a 400
`bad_json` in the spec's envelope on every route that takes JSON, never a 500, and the node keeps
answering. The parsers caught ValueError; a parse this deep raises RecursionError."""

from __future__ import annotations

import uuid

import httpx
import pytest

from vllm_acs.auth.principal import SCOPES
from vllm_acs.contract.bounded_json import MAX_DEPTH, loads_bounded, nesting_depth
from vllm_acs.errors import BadJson

pytestmark = pytest.mark.e2e

DEPTH = 100_000
DEEP_ARRAYS = b"[" * DEPTH + b"]" * DEPTH
DEEP_OBJECTS = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH
# Deep inside a body that is otherwise a valid request: the bound holds below the parse's own
# recursion limit too.
NESTED_PROMPT = b'{"model":"%s","prompt":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}"

JSON_ROUTES = (
    ("POST", "/v1/completions"),
    ("POST", "/v1/completion-jobs"),
    ("POST", "/v1/harvest"),
    ("POST", "/v1/looms"),
    ("POST", "/v1/keys"),
)


def test_the_bound_is_counted_without_recursion():
    assert nesting_depth(1, 10) == 0
    assert nesting_depth({"a": [1, {"b": []}]}, 10) == 4
    assert loads_bounded(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    for body in (DEEP_ARRAYS, DEEP_OBJECTS, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)):
        with pytest.raises(BadJson, match=f"deeper than {MAX_DEPTH} levels"):
            loads_bounded(body)


@pytest.fixture(scope="module")
def deep_key(acs_server) -> str:
    return acs_server.create_key("hostile-json", "--scopes", ",".join(sorted(SCOPES)))


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES)
@pytest.mark.parametrize("body", [DEEP_ARRAYS, DEEP_OBJECTS], ids=["arrays", "objects"])
def test_a_deep_body_is_a_400_in_the_envelope(acs_server, deep_key, method, path, body):
    headers = {
        "Authorization": f"Bearer {deep_key}",
        "Content-Type": "application/json",
        "Idempotency-Key": uuid.uuid4().hex,
    }
    response = httpx.request(
        method, f"{acs_server.base_url}{path}", content=body, headers=headers, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_json"
    assert f"deeper than {MAX_DEPTH} levels" in error["message"]
    assert httpx.get(f"{acs_server.base_url}/health", timeout=5).status_code == 200


def test_a_prompt_nested_past_the_bound_is_a_400(acs_server, deep_key, model_id):
    response = httpx.post(
        f"{acs_server.base_url}/v1/completions",
        content=NESTED_PROMPT % model_id.encode(),
        headers={"Authorization": f"Bearer {deep_key}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_json"
