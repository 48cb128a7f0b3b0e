"""Finding 3 of issue 31, tried from outside on the session's node: a key with the `keys` scope
never out-ranks its operator. A 30-token key cannot clear or raise its budget (and spends 30, not
130); a key it makes with `{}` inherits the 30 tokens, and one asking for more is refused; a key
the operator paused stays paused for keys; the live keys of an account are capped, for
`POST /v1/keys` and `vllm-acs keys create` alike; the audit trail shows each refusal.

Each test makes its own account and keys: the session's key is never touched.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from tests.e2e.account_client import client_for
from tests.harness import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
PROMPT = "The sky is"  # 4 prompt tokens; the tiny model always runs to max_tokens
ADMIN_SCOPES = "completions,keys"
# The live keys an account may have by default (`max_keys_per_account`).
DEFAULT_MAX_KEYS = 100


def _account(server: ServerProcess, stem: str) -> str:
    name = f"{stem}-{secrets.token_hex(3)}"
    server.cli("accounts", "create", name, "--approved")
    return name


def _spend_130(server: ServerProcess, key: str) -> httpx.Response:
    """A completion that costs 130 tokens when nothing caps it (4 prompt + 126 completion)."""
    return httpx.post(
        f"{server.base_url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 126, "temperature": 0},
        timeout=120,
    )


def _refused(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
    return answer.json()["error"]


def _spent_30(answer: httpx.Response) -> None:
    """Served within the 30-token budget: max_tokens lowered to 26, never 126."""
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (4, 26)
    assert "requested=126,applied=26" in answer.headers["x-acs-max-tokens-clamped"]


def _refusals(server: ServerProcess, account: str) -> list[dict[str, Any]]:
    return [e for e in server.cli("keys", "log", "--account", account) if e["action"] == "refuse"]


def test_a_30_token_key_cannot_clear_or_raise_its_budget_nor_make_a_richer_key(acs_server):
    account = _account(acs_server, "rank-budget")
    admin = acs_server.create_key_record(
        account, "--scopes", ADMIN_SCOPES, "--monthly-tokens", "30", "--max-running", "3"
    )
    client = client_for(acs_server, admin["key"])
    mine = f"/v1/keys/{admin['id']}"

    # Itself: clearing or raising its budget is refused, lowering is not a raise.
    cleared = _refused(client.patch(mine, json={"monthly_tokens": None}), 403, "scope_denied")
    assert cleared["param"] == "monthly_tokens" and "30" in cleared["message"]
    raised = _refused(client.patch(mine, json={"monthly_tokens": 130}), 403, "scope_denied")
    assert raised["param"] == "monthly_tokens" and "30" in raised["message"]
    # A refused PATCH changes nothing, the name sent with it included.
    both = client.patch(mine, json={"name": "richer", "monthly_tokens": None})
    _refused(both, 403, "scope_denied")
    [listed] = [k for k in client.get("/v1/keys").json()["data"] if k["id"] == admin["id"]]
    assert (listed["budgets"]["monthly_tokens"], listed["name"]) == (30, None)
    # So it spends 30, not 130, and then nothing.
    _spent_30(_spend_130(acs_server, admin["key"]))
    _refused(_spend_130(acs_server, admin["key"]), 429, "budget_exceeded")

    # A child made with {} inherits the 30 tokens (and the operator's traffic limits).
    made = client.post("/v1/keys", json={})
    assert made.status_code == 201, made.text
    child = made.json()
    assert child["budgets"]["monthly_tokens"] == 30
    (stored,) = [
        k for k in acs_server.cli("keys", "list", "--account", account) if k["id"] == child["id"]
    ]
    assert (stored["monthly_tokens"], stored["max_running"]) == (30, 3)
    _spent_30(_spend_130(acs_server, child["key"]))

    # A child asking for more, or for no cap, is refused naming the field and the parent's 30.
    for asked in ({"monthly_tokens": 130}, {"monthly_tokens": None}):
        error = _refused(client.post("/v1/keys", json=asked), 403, "scope_denied")
        assert error["param"] == "monthly_tokens" and "30" in error["message"]
    # Nor can the parent lift its child's budget afterwards.
    lift = client.patch(f"/v1/keys/{child['id']}", json={"monthly_tokens": None})
    _refused(lift, 403, "scope_denied")
    # Lower is allowed.
    lower = client.post("/v1/keys", json={"monthly_tokens": 10})
    assert (lower.status_code, lower.json()["budgets"]["monthly_tokens"]) == (201, 10)

    refusals = _refusals(acs_server, account)
    assert [(e["actor"], e["changes"]["attempt"], e["changes"]["asked"]) for e in refusals] == [
        (admin["id"], "set", {"monthly_tokens": None}),
        (admin["id"], "set", {"monthly_tokens": 130}),
        (admin["id"], "set", {"monthly_tokens": None, "name": "richer"}),
        (admin["id"], "create", {"monthly_tokens": 130, "name": None, "scopes": None}),
        (admin["id"], "create", {"monthly_tokens": None, "name": None, "scopes": None}),
        (admin["id"], "set", {"monthly_tokens": None}),
    ]
    assert all(e["changes"]["field"] == "monthly_tokens" for e in refusals)
    assert [e["key_id"] for e in refusals][-1] == child["id"]


def test_a_key_the_operator_paused_cannot_be_resumed_by_a_key(acs_server):
    account = _account(acs_server, "rank-pause")
    admin = acs_server.create_key_record(account, "--scopes", ADMIN_SCOPES)
    client = client_for(acs_server, admin["key"])
    target = client.post("/v1/keys", json={"name": "target"}).json()
    path = f"/v1/keys/{target['id']}"

    acs_server.cli("keys", "pause", target["id"])
    resumed = client.patch(path, json={"state": "active"})
    error = _refused(resumed, 403, "scope_denied")
    assert error["param"] == "state" and "operator" in error["message"]
    # It still answers its pause error, and is listed paused.
    _refused(_spend_130(acs_server, target["key"]), 401, "key_disabled")
    [listed] = [k for k in client.get("/v1/keys").json()["data"] if k["id"] == target["id"]]
    assert listed["state"] == "paused"

    # The operator resumes it; paused by a key, a key resumes it.
    acs_server.cli("keys", "resume", target["id"])
    assert client.patch(path, json={"state": "paused"}).json()["state"] == "paused"
    assert client.patch(path, json={"state": "active"}).json()["state"] == "active"
    assert _spend_130(acs_server, target["key"]).status_code == 200

    [refusal] = _refusals(acs_server, account)
    assert (refusal["actor"], refusal["key_id"], refusal["changes"]["field"]) == (
        admin["id"],
        target["id"],
        "state",
    )


def test_live_keys_per_account_are_capped(acs_server):
    account = _account(acs_server, "rank-cap")
    admin = acs_server.create_key_record(account, "--scopes", ADMIN_SCOPES)
    client = client_for(acs_server, admin["key"])
    made = [client.post("/v1/keys", json={}) for _ in range(DEFAULT_MAX_KEYS - 1)]
    assert {m.status_code for m in made} == {201}

    past = client.post("/v1/keys", json={"name": "one too many"})
    error = _refused(past, 429, "key_capacity")
    assert "max_keys_per_account" in error["message"] and str(DEFAULT_MAX_KEYS) in error["message"]
    assert past.headers["x-should-retry"] == "false"
    with pytest.raises(RuntimeError, match="max_keys_per_account"):
        acs_server.cli("keys", "create", "--account", account)
    assert len(client.get("/v1/keys").json()["data"]) == DEFAULT_MAX_KEYS

    # A revoked key frees its place.
    assert client.delete(f"/v1/keys/{made[0].json()['id']}").status_code == 200
    assert client.post("/v1/keys", json={}).status_code == 201

    refusals = _refusals(acs_server, account)
    assert [(e["actor"], e["changes"]["attempt"]) for e in refusals] == [
        (admin["id"], "create"),
        ("operator", "create"),
    ]
