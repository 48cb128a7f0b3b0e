"""A researcher's own keys and usage on the real node: GET /v1/usage equals the ledger after
completions, a job, a Loom branch and a harvest, and shows the Hold of a request in flight; the
/v1/keys cycle (create, replay, list, pause, resume, revoke) with the made key working, then
refused; scope escalation, another account's key, a key without `keys`; the audit trail.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import httpx
import pytest

from tests.e2e.account_client import (
    budgets,
    client_for,
    settled_usage,
    usage_matching_ledger,
)
from tests.e2e.jobs_client import submit_job, wait_harvest_ended, wait_jobs_ended
from tests.harness import ServerProcess, wait_until
from tests.slot_holder import held_tokens, holding_stream

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
BODY = {"model": MODEL, "prompt": "The sky is", "max_tokens": 3}  # 4 prompt tokens
ADMIN_SCOPES = "completions,looms,keys"


def next_month_start(now: datetime) -> int:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return int(datetime(year, month, 1, tzinfo=timezone.utc).timestamp())


def test_usage_equals_the_ledger_after_completions_a_job_a_branch_and_a_harvest(acs_server):
    acs_server.cli("accounts", "create", "usage-report", "--approved", "--monthly-tokens", "900000")
    limits = ["--monthly-tokens", "500000", "--daily-tokens", "400000"]
    limits += ["--monthly-input-tokens", "300000", "--monthly-output-tokens", "200000"]
    record = acs_server.create_key_record("usage-report", *limits, "--monthly-activations", "5")
    client = client_for(acs_server, record["key"])

    for body in (BODY, {**BODY, "max_tokens": 5, "n": 2}, {**BODY, "stream": True}):
        assert client.post("/v1/completions", json=body).status_code == 200
    captured = client.post("/v1/completions", json={**BODY, "output_residual_stream": [0]})
    assert captured.status_code == 200, captured.text
    job = submit_job(client, acs_server.base_url, {**BODY, "max_tokens": 4}, "usage-job")
    wait_jobs_ended(client, [acs_server.base_url], [job], 120, [acs_server])
    loom = client.post("/v1/looms", json={"prompt": "Once upon a time"}).json()
    branch = client.post(
        f"/v1/looms/{loom['id']}/nodes/{loom['nodes'][0]['id']}/branch",
        json={"n": 2, "max_tokens": 3, "seed": 1},
    )
    assert branch.status_code == 201, branch.text
    harvest = client.post(
        "/v1/harvest", json={"model": MODEL, "prompts": ["a b c", "d e"], "layers": [0]}
    )
    assert harvest.status_code == 202, harvest.text
    assert wait_harvest_ended(client, harvest.json()["job_id"], [acs_server])["status"] == "done"

    usage, ledger = usage_matching_ledger(acs_server, client, record["prefix"])
    total = ledger["prompt_tokens"] + ledger["completion_tokens"]
    by_name = budgets(usage)
    assert list(by_name) == [
        "key_monthly",
        "key_daily",
        "key_monthly_input",
        "key_monthly_output",
        "account_monthly",
    ]
    expected = {
        "key_monthly": (500000, total),
        "key_daily": (400000, total),
        "key_monthly_input": (300000, ledger["prompt_tokens"]),
        "key_monthly_output": (200000, ledger["completion_tokens"]),
        "account_monthly": (900000, total),  # the account's only key
    }
    now = datetime.now(timezone.utc)
    for name, (limit, spent) in expected.items():
        budget = by_name[name]
        assert (budget["limit"], budget["spent"], budget["held"]) == (limit, spent, 0), budget
        assert budget["remaining"] == limit - spent
    assert by_name["key_monthly"]["resets_at"] == next_month_start(now)
    day_start = datetime(now.year, now.month, now.day, tzinfo=timezone.utc).timestamp()
    assert by_name["key_daily"]["resets_at"] == int(day_start) + 86400
    # Every kind of work counted: 4 completions (3 + 10 + 3 + 3 output tokens), the job's 4,
    # the branch's 2 x 3, the harvest's prompts.
    assert ledger["completion_tokens"] >= 3 + 10 + 3 + 3 + 4 + 6
    assert ledger["requests"] >= 7
    activations = usage["activation_requests"]
    assert (activations["limit"], activations["spent"], activations["remaining"]) == (5, 1, 4)

    # The per-day and per-model figures are the same rows, summed other ways.
    today = now.strftime("%Y-%m-%d")
    assert {d["date"] for d in usage["days"]} == {today}
    assert sum(d["prompt_tokens"] for d in usage["days"]) == ledger["prompt_tokens"]
    assert sum(d["completion_tokens"] for d in usage["days"]) == ledger["completion_tokens"]
    assert sum(d["activation_requests"] for d in usage["days"]) == 1
    (model,) = usage["models"]
    assert (model["model"], model["total_tokens"], model["requests"]) == (
        MODEL,
        total,
        ledger["requests"],
    )
    traffic = usage["traffic"]
    assert (traffic["max_running"], traffic["max_waiting"], traffic["starts_per_minute"]) == (
        16,
        64,
        600,
    )
    assert (traffic["running"], traffic["waiting"]) == (0, 0)
    assert traffic["starts_last_minute"] >= 5  # four completions and the job, within the minute
    assert usage["period"] == now.strftime("%Y-%m") and usage["key_id"] == record["id"]


def test_usage_shows_the_hold_of_a_request_in_flight(acs_server):
    key = acs_server.create_key("hold-lab", "--monthly-tokens", "100000")
    client = client_for(acs_server, key)
    auth = {"Authorization": f"Bearer {key}"}
    # Admitted and generating: its Hold is 4 prompt tokens + 4 choices x 2,000.
    with holding_stream(acs_server.base_url, auth, BODY):
        usage = client.get("/v1/usage").json()
        monthly = budgets(usage)["key_monthly"]
        assert monthly["held"] == held_tokens(4), monthly
        assert monthly["remaining"] == 100000 - monthly["spent"] - held_tokens(4)
        assert usage["traffic"]["running"] == 1
    usage = settled_usage(client)
    monthly = budgets(usage)["key_monthly"]
    assert monthly["held"] == 0 and 4 <= monthly["spent"] <= held_tokens(4)
    assert usage["traffic"]["running"] == 0


def _completion(server: ServerProcess, key: str) -> httpx.Response:
    return client_for(server, key).post("/v1/completions", json={**BODY, "max_tokens": 1})


def test_keys_cycle_scopes_other_accounts_and_the_audit_trail(acs_server, auth, api_key):
    acs_server.cli("accounts", "create", "keys-lab", "--approved", "--monthly-tokens", "50000")
    admin = acs_server.create_key_record("keys-lab", "--scopes", ADMIN_SCOPES, "--name", "admin")
    assert admin["scopes"] == ADMIN_SCOPES.split(",")
    client = client_for(acs_server, admin["key"])

    # A key without `keys` (every default key) is refused.
    denied = httpx.get(f"{acs_server.base_url}/v1/keys", headers=auth)
    assert (denied.status_code, denied.json()["error"]["code"]) == (403, "scope_denied")

    # Create, with an Idempotency-Key: a resent create returns the same key and secret.
    idem = {"Idempotency-Key": f"create-{uuid.uuid4()}"}
    body = {"name": "made", "scopes": ["completions"], "monthly_tokens": 1000}
    created = client.post("/v1/keys", json=body, headers=idem)
    assert created.status_code == 201, created.text
    made = created.json()
    assert made["key"].startswith(made["prefix"]) and made["prefix"].startswith("acs-bm-")
    assert (made["state"], made["scopes"], made["budgets"]["monthly_tokens"]) == (
        "active",
        ["completions"],
        1000,
    )
    assert created.headers["location"] == f"/v1/keys/{made['id']}"
    replay = client.post("/v1/keys", json=body, headers=idem)
    assert (replay.status_code, replay.headers["idempotent-replayed"]) == (201, "true")
    assert (replay.json()["id"], replay.json()["key"]) == (made["id"], made["key"])
    stored = acs_server.cli("keys", "list", "--account", "keys-lab")
    assert len(stored) == 2  # the replay made no second key

    # A key grants only what it holds; budgets stay under the account's total.
    escalate = client.post("/v1/keys", json={"scopes": ["completions", "jobs"]})
    assert (escalate.status_code, escalate.json()["error"]["code"]) == (403, "scope_denied")
    assert escalate.json()["error"]["param"] == "scopes"
    too_big = client.post("/v1/keys", json={"daily_tokens": 50001})
    assert (too_big.status_code, too_big.json()["error"]["param"]) == (400, "daily_tokens")
    unknown = client.post("/v1/keys", json={"max_running": 99})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "max_running")

    listed = client.get("/v1/keys").json()["data"]
    assert [k["name"] for k in listed] == ["admin", "made"]
    assert all("key" not in k and "secret_hash" not in k for k in listed)

    # The made key works, then is paused, resumed, renamed, revoked: refused at once each time.
    assert _completion(acs_server, made["key"]).status_code == 200
    paused = client.patch(f"/v1/keys/{made['id']}", json={"state": "paused"})
    assert (paused.status_code, paused.json()["state"]) == (200, "paused")
    refused = _completion(acs_server, made["key"])
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "key_disabled")
    resumed = client.patch(
        f"/v1/keys/{made['id']}", json={"state": "active", "name": "renamed", "daily_tokens": 500}
    )
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["state"], resumed.json()["name"]) == ("active", "renamed")
    assert resumed.json()["budgets"]["daily_tokens"] == 500
    assert _completion(acs_server, made["key"]).status_code == 200

    # The spend is the ledger's, written off the response path: both completions within 30 s.
    def made_key() -> dict:
        return {k["id"]: k for k in client.get("/v1/keys").json()["data"]}[made["id"]]

    after = wait_until(
        lambda: (key := made_key())["month_spend"] == 2 * (4 + 1) and key, "both completions spent"
    )
    assert after["last_used_at"] is not None

    # Another account's key (the session's) is a 404, never a 403 or a change.
    (other,) = [k for k in acs_server.cli("keys", "list") if api_key.startswith(k["prefix"])]
    for answer in (
        client.patch(f"/v1/keys/{other['id']}", json={"state": "paused"}),
        client.delete(f"/v1/keys/{other['id']}"),
    ):
        assert (answer.status_code, answer.json()["error"]["code"]) == (404, "key_not_found")
    assert httpx.get(f"{acs_server.base_url}/v1/models", headers=auth).status_code == 200

    revoked = client.delete(f"/v1/keys/{made['id']}")
    assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")
    refused = _completion(acs_server, made["key"])
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "key_revoked")
    again = client.patch(f"/v1/keys/{made['id']}", json={"state": "active"})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "key_not_changeable")
    renamed = client.patch(f"/v1/keys/{made['id']}", json={"name": "after revoke"})
    assert (renamed.status_code, renamed.json()["error"]["code"]) == (409, "key_not_changeable")
    # Revoking again changes nothing: the same answer, and no second entry in the audit trail.
    twice = client.delete(f"/v1/keys/{made['id']}")
    assert (twice.status_code, twice.json()["state"], twice.json()["name"]) == (
        200,
        "revoked",
        "renamed",
    )

    log = acs_server.cli("keys", "log", "--account", "keys-lab")
    steps = [(e["actor"], e["action"], e["key_id"]) for e in log]
    assert steps == [
        # One audit trail (issue 34): the account's own creation comes first.
        ("operator", "account_create", "-"),
        ("operator", "create", admin["id"]),
        (admin["id"], "create", made["id"]),
        # The refused creates (scope escalation, a budget above the account's total).
        (admin["id"], "refuse", admin["id"]),
        (admin["id"], "refuse", admin["id"]),
        (admin["id"], "pause", made["id"]),
        (admin["id"], "set", made["id"]),
        (admin["id"], "resume", made["id"]),
        (admin["id"], "revoke", made["id"]),
    ]
    assert log[2]["changes"] == {"monthly_tokens": 1000, "name": "made", "scopes": ["completions"]}
    assert [log[3]["changes"]["field"], log[4]["changes"]["field"]] == ["scopes", "daily_tokens"]
    assert log[6]["changes"] == {"daily_tokens": 500, "name": "renamed"}
    assert all("acs-bm-" not in str(e["changes"]) for e in log)  # never a secret
