"""Apply for access and the operator's console on a real node (docs/admin-console.md): a node
with the form open (module-scoped, small limits) for the applicant's path and the console's
actions, and the shared node (form closed, the default) for what needs no opening: every admin
route refuses a key without `admin`, no key mints an admin key, the closed form is a 404.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.admin_client import admin_key, admin_operations, apply, bearer, claim
from tests.harness import ServerProcess, running_server

pytestmark = pytest.mark.e2e

PER_ADDRESS = 2
PENDING_CAP = 8


@pytest.fixture(scope="module")
def console_node(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    env = {
        "VLLM_ACS_APPLICATIONS": "open",
        "VLLM_ACS_APPLICATIONS_PER_ADDRESS": str(PER_ADDRESS),
        "VLLM_ACS_APPLICATIONS_PENDING_CAP": str(PENDING_CAP),
    }
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("console"), env=env) as server:
        yield server


@pytest.fixture(scope="module")
def admin(console_node: ServerProcess) -> Iterator[httpx.Client]:
    key = admin_key(console_node)
    with httpx.Client(base_url=console_node.base_url, headers=bearer(key), timeout=60) as http:
        yield http


def _actions(admin: httpx.Client, **filters: str) -> list[tuple[str, str]]:
    answer = admin.get("/v1/admin/audit", params={"limit": "500", **filters})
    assert answer.status_code == 200, answer.text
    return [(e["actor"], e["action"]) for e in answer.json()["data"]]


def test_every_admin_route_refuses_a_key_without_admin(acs_server, api_key):
    researcher = acs_server.create_key("console-outsider", "--scopes", "completions,keys")
    operations = admin_operations()
    assert len(operations) == 12
    for method, path in operations:
        for headers, status, code in (
            (bearer(api_key), 403, "scope_denied"),
            (bearer(researcher), 403, "scope_denied"),
            ({}, 401, "missing_authorization"),
        ):
            answer = httpx.request(
                method, acs_server.base_url + path, headers=headers, json={}, timeout=60
            )
            assert answer.status_code == status, (method, path, answer.text)
            assert answer.json()["error"]["code"] == code, (method, path)


def test_no_key_can_mint_an_admin_key(acs_server):
    # Even a key holding `admin` and `keys` cannot grant `admin` through /v1/keys.
    for scopes in ("completions,keys", "admin,keys"):
        key = acs_server.create_key("console-minter", "--scopes", scopes)
        made = httpx.post(
            f"{acs_server.base_url}/v1/keys",
            json={"scopes": ["admin"]},
            headers=bearer(key),
            timeout=60,
        )
        assert made.status_code == 400, made.text
        assert made.json()["error"]["param"] == "scopes.0"
    listed = acs_server.cli("keys", "list", "--account", "console-minter")
    assert sorted(",".join(k["scopes"]) for k in listed) == ["admin,keys", "completions,keys"]
    # The console changes no scopes at all.
    with httpx.Client(base_url=acs_server.base_url, headers=bearer(admin_key(acs_server))) as http:
        patched = http.patch(f"/v1/admin/keys/{listed[0]['id']}", json={"scopes": ["admin"]})
    assert patched.status_code == 400, patched.text


def test_the_closed_form_is_a_404_and_claims_still_answer(acs_server):
    form = httpx.get(f"{acs_server.base_url}/v1/applications/form")
    assert (form.status_code, form.json()["error"]["code"]) == (404, "applications_closed")
    sent = apply(acs_server, "10.9.0.1")
    assert (sent.status_code, sent.json()["error"]["code"]) == (404, "applications_closed")
    unknown = claim(acs_server, "acs-claim-" + "A" * 43)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (401, "invalid_claim_code")


def test_apply_approve_claim_once_and_complete(console_node, admin, model_id):
    form = httpx.get(f"{console_node.base_url}/v1/applications/form")
    assert form.status_code == 200 and form.json()["open"] is True
    sent = apply(console_node, "10.1.0.1", name="Grace Hopper")
    assert sent.status_code == 201, sent.text
    application, code = sent.json(), sent.json()["claim_code"]
    assert code.startswith("acs-claim-") and application["status"] == "pending"
    early = claim(console_node, code)
    assert (early.status_code, early.json()["error"]["code"]) == (409, "application_pending")

    pending = admin.get("/v1/admin/applications").json()["data"]
    shown = next(a for a in pending if a["id"] == application["id"])
    assert (shown["name"], shown["status"]) == ("Grace Hopper", "pending")
    assert "claim_code" not in shown
    approved = admin.post(
        f"/v1/admin/applications/{application['id']}/approve", json={"monthly_tokens": 40000}
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"

    claimed = claim(console_node, code)
    assert claimed.status_code == 201, claimed.text
    secret = claimed.json()["key"]["key"]
    assert secret.startswith("acs-bm-")
    completion = httpx.post(
        f"{console_node.base_url}/v1/completions",
        json={"model": model_id, "prompt": "The sky is", "max_tokens": 2},
        headers=bearer(secret),
        timeout=120,
    )
    assert completion.status_code == 200, completion.text
    again = claim(console_node, code)
    assert (again.status_code, again.json()["error"]["code"]) == (410, "claim_code_used")
    usage = httpx.get(f"{console_node.base_url}/v1/usage", headers=bearer(secret)).json()
    account = next(b for b in usage["budgets"] if b["name"] == "account_monthly")
    assert account["limit"] == 40000

    audit = _actions(admin, account_id=application_id_account(admin, application["id"]))
    assert [a for _, a in reversed(audit)] == ["apply", "approve", "create", "claim"]


def application_id_account(admin: httpx.Client, application_id: str) -> str:
    listed = admin.get("/v1/admin/applications", params={"status": "all"}).json()["data"]
    return next(a["account_id"] for a in listed if a["id"] == application_id)


def test_a_rejected_application_is_told_so(console_node, admin):
    sent = apply(console_node, "10.1.0.2")
    assert sent.status_code == 201, sent.text
    rejected = admin.post(
        f"/v1/admin/applications/{sent.json()['id']}/reject", json={"note": "not now"}
    )
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    told = claim(console_node, sent.json()["claim_code"])
    assert (told.status_code, told.json()["error"]["code"]) == (403, "application_rejected")
    twice = admin.post(f"/v1/admin/applications/{sent.json()['id']}/approve", json={})
    assert (twice.status_code, twice.json()["error"]["code"]) == (409, "application_not_pending")


def test_the_form_refuses_bad_answers(console_node):
    for answers, param in (
        ({"email": "no-at-sign"}, "email"),
        ({"intended_use": "too short"}, "intended_use"),
        ({"name": "x" * 201}, "name"),
        ({"website": "https://example.com"}, "website"),
    ):
        sent = apply(console_node, "10.1.0.3", **answers)
        assert sent.status_code == 400, sent.text
        assert sent.json()["error"]["param"] == param, sent.text
    huge = apply(console_node, "10.1.0.3", intended_use="x" * 20_000)
    assert huge.status_code == 413


def test_the_form_is_rate_limited_per_address(console_node):
    for _ in range(PER_ADDRESS):
        assert apply(console_node, "10.2.0.1").status_code == 201
    refused = apply(console_node, "10.2.0.1")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 3500 <= int(refused.headers["retry-after"]) <= 3601
    assert apply(console_node, "10.2.0.2").status_code == 201  # another address


def test_admin_pause_budget_nodes_usage_and_audit(console_node, admin, model_id):
    record = console_node.create_key_record("researcher", "--scopes", "completions,keys")
    key_id, researcher = record["id"], bearer(record["key"])
    body = {"model": model_id, "prompt": "Hello", "max_tokens": 2}
    url = console_node.base_url
    assert httpx.post(f"{url}/v1/completions", json=body, headers=researcher).status_code == 200

    paused = admin.patch(f"/v1/admin/keys/{key_id}", json={"state": "paused"})
    assert paused.status_code == 200 and paused.json()["paused_by"] == "operator"
    refused = httpx.post(f"{url}/v1/completions", json=body, headers=researcher)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "key_disabled")
    assert admin.patch(f"/v1/admin/keys/{key_id}", json={"state": "active"}).status_code == 200

    account = admin.patch("/v1/admin/accounts/researcher", json={"monthly_tokens": 12345})
    assert account.status_code == 200 and account.json()["monthly_tokens"] == 12345
    usage = httpx.get(f"{url}/v1/usage", headers=researcher).json()
    assert next(b for b in usage["budgets"] if b["name"] == "account_monthly")["limit"] == 12345
    keyed = admin.patch(f"/v1/admin/keys/{key_id}", json={"monthly_tokens": 999})
    assert keyed.json()["limits"]["monthly_tokens"] == 999
    usage = httpx.get(f"{url}/v1/usage", headers=researcher).json()
    assert next(b for b in usage["budgets"] if b["name"] == "key_monthly")["limit"] == 999

    detail = admin.get("/v1/admin/accounts/researcher").json()
    assert detail["keys"]["active"] == 1 and detail["month_spend"] > 0
    assert [k["id"] for k in detail["api_keys"]] == [key_id]

    nodes = admin.get("/v1/admin/nodes").json()
    [node] = nodes["data"]
    assert node["warm"] is True and node["model_id"] == model_id
    assert node["plugin_version"] and node["vllm_version"]
    assert nodes["models"] == [{"id": model_id, "nodes": 1, "warm": True}]

    rows = admin.get("/v1/admin/usage", params={"key_id": key_id}).json()["rows"]
    assert sum(r["requests"] for r in rows) >= 1
    assert {r["account_name"] for r in rows} == {"researcher"}
    exported = admin.get("/v1/admin/usage", params={"key_id": key_id, "format": "csv"})
    assert exported.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(exported.text)))
    assert [int(r["requests"]) for r in table] == [r["requests"] for r in rows]

    admin_id = admin.get("/v1/admin/keys", params={"account_id": "operators"}).json()["data"][0]
    mine = _actions(admin, actor=admin_id["id"], account_id="researcher")
    assert list(reversed(mine)) == [
        (admin_id["id"], "pause"),
        (admin_id["id"], "resume"),
        (admin_id["id"], "account_set"),
        (admin_id["id"], "set"),
    ]
    assert _actions(admin, action="pause", key_id=key_id) == [(admin_id["id"], "pause")]
    bad = admin.get("/v1/admin/audit", params={"limit": "0"})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "limit")


def test_the_pending_cap_holds(console_node, admin):
    """Last in the module: it fills the node's waiting list."""
    waiting = len(admin.get("/v1/admin/applications").json()["data"])
    accepted = 0
    for n in range(PENDING_CAP + 1):
        sent = apply(console_node, f"10.3.0.{n}")
        if sent.status_code != 201:
            assert (sent.status_code, sent.json()["error"]["code"]) == (429, "applications_full")
            assert sent.headers["x-should-retry"] == "false"
            break
        accepted += 1
    assert waiting + accepted == PENDING_CAP


@pytest.mark.parametrize(
    ("path", "known"),
    [
        ("/v1/admin/applications", {"status": "all", "limit": "5"}),
        ("/v1/admin/keys", {"state": "active"}),
        ("/v1/admin/usage", {"format": "json", "model": "m"}),
        ("/v1/admin/audit", {"limit": "5", "action": "create"}),
    ],
)
def test_a_query_parameter_the_route_does_not_read_is_refused(admin, path, known):
    assert admin.get(path, params=known).status_code == 200
    # A misspelt filter would otherwise answer the unfiltered list.
    misspelt = admin.get(path, params={**known, "staus": "all"})
    assert misspelt.status_code == 400, misspelt.text
    error = misspelt.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "staus")
    assert "Unknown query parameter 'staus'" in error["message"]
    assert all(name in error["message"] for name in known)
    # An unknown name is cut as any echoed value is.
    long = admin.get(path, params={"x" * 5000: "1"})
    assert long.status_code == 400 and len(long.content) < 1000
