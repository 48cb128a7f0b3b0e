"""Keys, budgets and traffic limits on the real server (embedded counters, SQLite).

Every 401/403/429 code with its headers, a budget clamp, usage rows that add up, and the
exactness of budgets and running slots under 200 concurrent requests.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.access_load import BODY, assert_budget_is_exact, assert_running_slots_are_exact
from tests.slot_holder import holding_stream, wait_for_the_slot

pytestmark = pytest.mark.e2e


def _post(server, key: str | None, body: dict = BODY, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=120)


def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == code
    assert body["request_id"] == response.headers["x-request-id"]
    return body["error"]


def test_missing_and_invalid_keys(acs_server):
    _error(_post(acs_server, None), 401, "missing_authorization")
    _error(_post(acs_server, "acs-bm-" + "x" * 43), 401, "invalid_api_key")
    _error(_post(acs_server, "not-a-key"), 401, "invalid_api_key")
    response = httpx.post(
        f"{acs_server.base_url}/v1/completions", json=BODY, headers={"Authorization": "Basic abc"}
    )
    _error(response, 401, "invalid_api_key")
    models = httpx.get(f"{acs_server.base_url}/v1/models")
    _error(models, 401, "missing_authorization")


def test_pause_resume_revoke_take_effect_on_the_next_request(acs_server):
    record = acs_server.create_key_record("lifecycle")
    key = record["key"]
    assert _post(acs_server, key).status_code == 200
    acs_server.cli("keys", "pause", record["prefix"])
    _error(_post(acs_server, key), 401, "key_disabled")
    acs_server.cli("keys", "resume", record["id"])
    assert _post(acs_server, key).status_code == 200
    acs_server.cli("keys", "revoke", record["prefix"])
    _error(_post(acs_server, key), 401, "key_revoked")


def test_account_states(acs_server):
    acs_server.cli("accounts", "create", "pending-lab")
    pending = acs_server.create_key("pending-lab")
    _error(_post(acs_server, pending), 401, "account_not_approved")
    acs_server.cli("accounts", "approve", "pending-lab")
    assert _post(acs_server, pending).status_code == 200

    key = acs_server.create_key("suspended-lab")
    acs_server.cli("accounts", "suspend", "suspended-lab")
    _error(_post(acs_server, key), 401, "account_suspended")


def test_spend_cap(acs_server):
    key = acs_server.create_key("capped-lab")
    acs_server.cli("accounts", "spend-cap", "capped-lab")
    response = _post(acs_server, key)
    _error(response, 429, "spend_cap")
    assert response.headers["retry-after"] == "3600"
    assert response.headers["retry-after-ms"] == "3600000"
    acs_server.cli("accounts", "lift-cap", "capped-lab")
    assert _post(acs_server, key).status_code == 200


def test_scope_denied(acs_server):
    key = acs_server.create_key("scoped-lab", "--scopes", "jobs")
    _error(_post(acs_server, key), 403, "scope_denied")
    models = httpx.get(
        f"{acs_server.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    assert models.status_code == 200


def test_budget_exceeded_names_the_budget_and_is_not_retryable(acs_server):
    key = acs_server.create_key("budget-lab", "--daily-tokens", "4")
    response = _post(acs_server, key)  # 4 prompt tokens leave no output token
    error = _error(response, 429, "budget_exceeded")
    assert "daily" in error["message"].lower()
    assert response.headers["x-should-retry"] == "false"
    assert "retry-after" not in response.headers


def test_budget_clamps_max_tokens_and_says_so(acs_server):
    key = acs_server.create_key("clamp-lab", "--monthly-tokens", "10")
    response = _post(acs_server, key, {**BODY, "max_tokens": 20})
    assert response.status_code == 200
    assert response.headers["x-acs-max-tokens-clamped"] == (
        "requested=20,applied=6,reason=budget,source=client"
    )
    assert response.json()["usage"]["completion_tokens"] == 6
    _error(_post(acs_server, key), 429, "budget_exceeded")


def test_queue_full_when_running_and_waiting_are_taken(acs_server):
    key = acs_server.create_key("queue-lab", "--max-running", "1", "--max-waiting", "0")
    headers = {"Authorization": f"Bearer {key}"}
    # Made before the stream starts: on a loaded machine building a client (its TLS context)
    # takes seconds.
    with (
        httpx.Client(base_url=acs_server.base_url, headers=headers, timeout=120) as second,
        holding_stream(acs_server.base_url, headers, BODY),  # the only slot, until the block ends
    ):
        response = second.post("/v1/completions", json=BODY)
        _error(response, 429, "queue_full")
        assert int(response.headers["retry-after"]) >= 1
        assert int(response.headers["retry-after-ms"]) >= 1
    # The client left mid-stream: its slot is given back.
    wait_for_the_slot(acs_server.base_url, headers, BODY["model"])


def test_rate_limited_after_the_starts_per_minute(acs_server):
    key = acs_server.create_key("rate-lab", "--starts-per-minute", "2")
    assert _post(acs_server, key).status_code == 200
    assert _post(acs_server, key).status_code == 200
    response = _post(acs_server, key)
    _error(response, 429, "rate_limited")
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert int(response.headers["retry-after-ms"]) > 0


def test_usage_rows_add_up_to_the_answers(acs_server):
    record = acs_server.create_key_record("usage-lab")
    key = record["key"]
    answers = [
        _post(acs_server, key),
        _post(acs_server, key, {**BODY, "prompt": ["a b", "c"], "n": 2, "temperature": 1}),
        _post(acs_server, key, {**BODY, "max_tokens": 7}, **{"X-Acs-Workload": "batch"}),
    ]
    prompt = sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    completion = sum(a.json()["usage"]["completion_tokens"] for a in answers)
    with httpx.stream(
        "POST",
        f"{acs_server.base_url}/v1/completions",
        json={**BODY, "stream": True, "max_tokens": 5},
        headers={"Authorization": f"Bearer {key}"},
    ) as stream:
        assert stream.status_code == 200
        "".join(stream.iter_text())
    prompt, completion = prompt + 4, completion + 5
    deadline = time.monotonic() + 30
    while True:  # the ledger writes off the response path
        rows = [
            r
            for r in acs_server.cli("usage")["per_key_model_month"]
            if r["key_prefix"] == record["prefix"]
        ]
        if (rows and rows[0]["requests"] == 4) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    (row,) = rows
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        4,
        prompt,
        completion,
    )
    assert row["model"] == "tiny-llama"


def test_200_concurrent_requests_spend_exactly_the_budget(acs_server):
    assert_budget_is_exact([acs_server], "exact-budget")


def test_200_concurrent_requests_get_exactly_the_running_slots(acs_server):
    assert_running_slots_are_exact([acs_server], "exact-slots")
