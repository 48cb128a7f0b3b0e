"""/openapi.json describes what the server really does: a bounded schemathesis run over every
operation (positive and negative examples) finds no 500 and no answer that breaks the schema."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from vllm_acs.contract.harvest_request import HARVEST_BODY_LIMIT_BYTES
from vllm_acs.contract.routes import PUBLIC_NODE_ROUTES, PUBLIC_V1_ROUTES
from vllm_acs.routes.applications.protocol import APPLICATION_BODY_LIMIT_BYTES
from vllm_acs.routes.openapi import build_openapi
from vllm_acs.settings import Settings

pytestmark = pytest.mark.e2e

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
LOOM = "/v1/looms/{loom_id}"
NODE = LOOM + "/nodes/{node_id}"
KEY = "/v1/keys/{key_id}"
ADMIN_APPLICATION = "/v1/admin/applications/{application_id}"
ADMIN_ACCOUNT = "/v1/admin/accounts/{account_id}"
ADMIN_KEY = "/v1/admin/keys/{key_id}"
OPERATIONS = [
    ("/v1/completions", "POST", POSITIVE, 40),
    ("/v1/completions", "POST", NEGATIVE, 40),
    ("/v1/chat/completions", "POST", POSITIVE, 10),
    ("/v1/models", "GET", POSITIVE, 3),
    ("/v1/models/{model_id}", "GET", POSITIVE, 10),
    ("/v1/models/{model_id}/status", "GET", POSITIVE, 10),
    ("/health", "GET", POSITIVE, 3),
    ("/v1/completion-jobs", "POST", POSITIVE, 15),
    ("/v1/completion-jobs", "POST", NEGATIVE, 15),
    ("/v1/completion-jobs/{job_id}", "GET", POSITIVE, 5),
    ("/v1/completion-jobs/{job_id}", "DELETE", POSITIVE, 5),
    ("/v1/completion-jobs/{job_id}/result", "GET", POSITIVE, 5),
    ("/v1/harvest", "POST", POSITIVE, 10),
    ("/v1/harvest", "POST", NEGATIVE, 10),
    ("/v1/harvest/{job_id}", "GET", POSITIVE, 5),
    ("/v1/harvest/{job_id}", "DELETE", POSITIVE, 5),
    ("/downloads/{job_id}/{file_name}", "GET", POSITIVE, 5),
    ("/v1/looms", "POST", POSITIVE, 10),
    ("/v1/looms", "POST", NEGATIVE, 10),
    ("/v1/looms", "GET", POSITIVE, 5),
    ("/v1/looms/import", "POST", POSITIVE, 10),
    ("/v1/looms/import", "POST", NEGATIVE, 10),
    (LOOM, "GET", POSITIVE, 5),
    (LOOM, "PATCH", POSITIVE, 8),
    (LOOM, "PATCH", NEGATIVE, 8),
    (LOOM, "DELETE", POSITIVE, 5),
    (LOOM + "/export", "GET", POSITIVE, 5),
    (NODE, "GET", POSITIVE, 5),
    (NODE, "PATCH", POSITIVE, 8),
    (NODE, "PATCH", NEGATIVE, 8),
    (NODE, "DELETE", POSITIVE, 5),
    (NODE + "/text", "GET", POSITIVE, 5),
    (NODE + "/branch", "POST", POSITIVE, 12),
    (NODE + "/branch", "POST", NEGATIVE, 10),
    (NODE + "/split", "POST", POSITIVE, 8),
    (NODE + "/split", "POST", NEGATIVE, 5),
    (NODE + "/children", "POST", POSITIVE, 5),
    (NODE + "/children", "POST", NEGATIVE, 5),
    (NODE + "/siblings", "POST", POSITIVE, 5),
    (NODE + "/replay", "POST", POSITIVE, 5),
    (NODE + "/score", "POST", POSITIVE, 8),
    (NODE + "/score", "POST", NEGATIVE, 5),
    ("/v1/keys", "POST", POSITIVE, 8),
    ("/v1/keys", "POST", NEGATIVE, 8),
    ("/v1/keys", "GET", POSITIVE, 3),
    (KEY, "PATCH", POSITIVE, 8),
    (KEY, "PATCH", NEGATIVE, 6),
    (KEY, "DELETE", POSITIVE, 5),
    ("/v1/usage", "GET", POSITIVE, 3),
    # Apply for access: the shared node keeps the form closed (the default), so a submit is a
    # 404; a claim is read whatever the form (an unknown code: 401).
    ("/v1/applications/form", "GET", POSITIVE, 2),
    ("/v1/applications", "POST", POSITIVE, 5),
    ("/v1/applications/claim", "POST", POSITIVE, 5),
    ("/v1/applications/claim", "POST", NEGATIVE, 5),
    # The console, with an admin key.
    ("/v1/admin/applications", "GET", POSITIVE, 5),
    ("/v1/admin/applications", "GET", NEGATIVE, 5),
    (ADMIN_APPLICATION + "/approve", "POST", POSITIVE, 5),
    (ADMIN_APPLICATION + "/approve", "POST", NEGATIVE, 5),
    (ADMIN_APPLICATION + "/reject", "POST", POSITIVE, 3),
    ("/v1/admin/accounts", "GET", POSITIVE, 2),
    (ADMIN_ACCOUNT, "GET", POSITIVE, 3),
    (ADMIN_ACCOUNT, "PATCH", POSITIVE, 5),
    (ADMIN_ACCOUNT, "PATCH", NEGATIVE, 5),
    ("/v1/admin/keys", "GET", POSITIVE, 5),
    (ADMIN_KEY, "PATCH", POSITIVE, 5),
    (ADMIN_KEY, "PATCH", NEGATIVE, 5),
    (ADMIN_KEY, "DELETE", POSITIVE, 3),
    ("/v1/admin/usage", "GET", POSITIVE, 8),
    ("/v1/admin/usage", "GET", NEGATIVE, 5),
    ("/v1/admin/nodes", "GET", POSITIVE, 2),
    ("/v1/admin/audit", "GET", POSITIVE, 8),
    ("/v1/admin/audit", "GET", NEGATIVE, 5),
]
# Reads that reach a real Loom: at least one answer of theirs is a 200.
LOOM_READS = {(LOOM, "GET"), (LOOM + "/export", "GET"), (NODE, "GET"), (NODE + "/text", "GET")}
# Reads of a model: two cases in three name the served model (a 200), the third a generated id.
MODEL_READS = {("/v1/models/{model_id}", "GET"), ("/v1/models/{model_id}/status", "GET")}
# A generated completion without max_tokens runs to the end of the context (2,047 tokens): on a
# slow host the 11 such positive cases took 4 to 5 minutes of generation that no check looks at.
# They ask for 16 tokens instead (as do larger values); a request stays valid with fewer tokens,
# the default is tested where it matters (test_operator_settings), and the bound itself by the
# negative run. The same holds for completion jobs and Loom branches (a branch case took 69 s on a
# slow CI host).
GENERATED_MAX_TOKENS = 16
GENERATING = {
    ("/v1/completions", "POST"),
    ("/v1/completion-jobs", "POST"),
    (NODE + "/branch", "POST"),
}


def _whole_numbers_as_integers(body: dict[str, Any]) -> dict[str, Any]:
    """A positive body's top-level whole floats (5037.0) as integers. JSON Schema counts 5037.0
    as an integer, so schemathesis generates it for integer fields; the node refuses it there on
    purpose (strict types, tests/e2e/contract_cases.py "top_k float"), and positive cases made of
    such values only reached the validation (every real-key PATCH of /v1/keys/{key_id} of one
    seed was a 400)."""
    return {
        name: int(value) if isinstance(value, float) and value.is_integer() else value
        for name, value in body.items()
    }


def _short(body: dict[str, Any], mode: GenerationMode) -> dict[str, Any]:
    """A generating body that asks for at most GENERATED_MAX_TOKENS. A negative case keeps a
    max_tokens it has (it may be the part the case broke) but gets one where it has none: a case
    broken only in its Authorization header (which the test key replaces) runs as a valid request,
    and 9 such ran to the context, ~15 s each. A missing max_tokens is never what a negative case
    broke (the field is optional)."""
    max_tokens = body.get("max_tokens")
    too_long = not isinstance(max_tokens, int) or max_tokens > GENERATED_MAX_TOKENS
    if too_long and (mode is POSITIVE or "max_tokens" not in body):
        return {**body, "max_tokens": GENERATED_MAX_TOKENS}
    return body


@pytest.fixture(scope="session")
def api_schema(acs_server):
    return schemathesis.openapi.from_url(f"{acs_server.base_url}/openapi.json")


def real_loom(base_url: str, auth: dict[str, str]) -> dict[str, str]:
    """A Loom of this key: its root and a model's child (a one-token branch), for the Loom
    operations' path parameters; each operation gets its own (a DELETE may remove it)."""
    with httpx.Client(base_url=base_url, headers=auth, timeout=120) as http:
        made = http.post("/v1/looms", json={"prompt": "The sky is", "title": "schemathesis"})
        assert made.status_code == 201, made.text
        loom_id, root = made.json()["id"], made.json()["nodes"][0]["id"]
        branch = http.post(
            f"/v1/looms/{loom_id}/nodes/{root}/branch",
            json={"n": 1, "max_tokens": 4, "seed": 7, "temperature": 1.0},
        )
        assert branch.status_code == 201, branch.text
        children = branch.json()["nodes"]
        if not children:  # an empty continuation is not added: a hand-written child instead
            added = http.post(f"/v1/looms/{loom_id}/nodes/{root}/children", json={"text": " x"})
            children = added.json()["data"]
    return {"loom_id": loom_id, "root": root, "child": children[0]["id"]}


@pytest.fixture(scope="session")
def keys_auth(acs_server) -> dict[str, str]:
    """A key that manages its own account's keys (the `keys` scope is never a default)."""
    scopes = "completions,jobs,harvest,looms,keys"
    key = acs_server.create_key("schemathesis-keys", "--scopes", scopes)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="session")
def admin_auth(acs_server) -> dict[str, str]:
    """An operator's console key (`vllm-acs keys create --scopes admin`)."""
    key = acs_server.create_key("schemathesis-admin", "--scopes", "admin")
    return {"Authorization": f"Bearer {key}"}


def real_key(base_url: str, auth: dict[str, str]) -> str:
    """A key of the caller's account, made for one operation (a DELETE revokes it)."""
    made = httpx.post(f"{base_url}/v1/keys", json={"name": "target"}, headers=auth, timeout=60)
    assert made.status_code == 201, made.text
    return made.json()["id"]


@pytest.mark.parametrize(("path", "method", "mode", "examples"), OPERATIONS)
def test_operation_conforms(
    api_schema, acs_server, auth, keys_auth, admin_auth, model_id, path, method, mode, examples: int
):
    # Bounded and reproducible: a fixed number of examples, derandomized, on loopback only.
    operation = api_schema[path][method]
    statuses: list[int] = []
    # Loom operations: two positive cases in three on a real Loom (its root, then its model
    # child), the third on the generated ids (a 404).
    real = real_loom(acs_server.base_url, auth) if "{loom_id}" in path else None
    if path.startswith("/v1/keys"):
        auth = keys_auth
    target = real_key(acs_server.base_url, keys_auth) if "{key_id}" in path else None
    if path.startswith("/v1/admin"):
        auth = admin_auth

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        turn = len(statuses) % 3
        if real is not None and mode is POSITIVE and turn:
            ids = {"loom_id": real["loom_id"]}
            if "node_id" in case.path_parameters:
                ids["node_id"] = real["root"] if turn == 1 else real["child"]
            case.path_parameters = {**case.path_parameters, **ids}
        if target is not None and turn:
            case.path_parameters = {**case.path_parameters, "key_id": target}
        if (path, method) in MODEL_READS and turn:
            case.path_parameters = {**case.path_parameters, "model_id": model_id}
        if mode is POSITIVE and isinstance(case.body, dict):
            case.body = _whole_numbers_as_integers(case.body)
        if (path, method) in GENERATING and isinstance(case.body, dict):
            case.body = _short(case.body, mode)
        # Negative examples must be refused: schemathesis knows which part it broke.
        checks = [*CHECKS, negative_data_rejection] if mode is NEGATIVE else CHECKS
        response = case.call_and_validate(checks=checks, headers=auth, timeout=120)
        statuses.append(response.status_code)

    run()
    print(path, method, mode.value, sorted(statuses))
    assert statuses, "schemathesis generated no request"
    assert not any(s >= 500 for s in statuses), statuses
    if (path, mode) == ("/v1/completions", POSITIVE):
        assert 200 in statuses  # the run reached the engine, not only the validation
    if (path, method, mode) == ("/v1/completion-jobs", "POST", POSITIVE):
        assert 202 in statuses  # some generated submits were accepted
    if (path, method, mode) == ("/v1/looms", "POST", POSITIVE):
        assert 201 in statuses
    if (path, method, mode) in (("/v1/keys", "POST", POSITIVE), ("/v1/keys", "GET", POSITIVE)):
        assert statuses and set(statuses) <= {200, 201, 400, 403}, statuses
        assert {200, 201} & set(statuses)
    if (path, method, mode) in ((KEY, "PATCH", POSITIVE), (KEY, "DELETE", POSITIVE)):
        assert 200 in statuses and 404 in statuses  # the real key, and generated ids
    if path == "/v1/usage":
        assert set(statuses) == {200}
    if (path, method) == ("/v1/applications", "POST"):
        assert set(statuses) <= {400, 404}, statuses  # the shared node's form is closed
    if path.startswith("/v1/admin") and method == "GET" and mode is POSITIVE:
        assert {200, 404} & set(statuses), statuses
    if (path, method) in LOOM_READS | MODEL_READS:
        assert 200 in statuses  # the real Loom or model was read, not only 404s


def test_document_covers_the_public_surface(acs_server):
    document = httpx.get(f"{acs_server.base_url}/openapi.json").json()
    assert set(document["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/models/{model_id}/status",
        "/v1/completion-jobs",
        "/v1/completion-jobs/{job_id}",
        "/v1/completion-jobs/{job_id}/result",
        "/v1/harvest",
        "/v1/harvest/{job_id}",
        "/downloads/{job_id}/{file_name}",
        "/health",
        "/v1/looms",
        "/v1/looms/import",
        LOOM,
        LOOM + "/export",
        NODE,
        NODE + "/text",
        NODE + "/branch",
        NODE + "/split",
        NODE + "/children",
        NODE + "/siblings",
        NODE + "/replay",
        NODE + "/score",
        "/v1/keys",
        KEY,
        "/v1/usage",
        "/v1/applications",
        "/v1/applications/form",
        "/v1/applications/claim",
        "/v1/admin/applications",
        ADMIN_APPLICATION + "/approve",
        ADMIN_APPLICATION + "/reject",
        "/v1/admin/accounts",
        ADMIN_ACCOUNT,
        "/v1/admin/keys",
        ADMIN_KEY,
        "/v1/admin/usage",
        "/v1/admin/nodes",
        "/v1/admin/audit",
    }
    # Every public route, with each of its methods, is an operation of the document.
    for route in (*PUBLIC_V1_ROUTES, *PUBLIC_NODE_ROUTES):
        if route.template in document["paths"]:
            assert set(document["paths"][route.template]) == {m.lower() for m in route.methods}
        else:
            assert route.template in (
                "/openapi.json",
                "/docs",
                "/docs/swagger-init.js",
                "/static/swagger-ui-bundle.js",
                "/static/swagger-ui.css",
            )
    submit = document["paths"]["/v1/completion-jobs"]["post"]
    (idempotency_key,) = submit["parameters"]
    assert idempotency_key["name"] == "Idempotency-Key" and idempotency_key["required"] is True
    assert idempotency_key["schema"]["maxLength"] == 255
    assert set(submit["responses"]["202"]["headers"]) >= {"Location", "Idempotent-Replayed"}
    request_schema = document["components"]["schemas"]["CompletionRequest"]
    props = request_schema["properties"]
    assert request_schema["additionalProperties"] is False
    assert props["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
    assert props["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 100}
    assert props["top_p"]["anyOf"][0]["exclusiveMinimum"] == 0
    assert props["stop"]["oneOf"][1]["maxItems"] == 4
    looms = {p: ops for p, ops in document["paths"].items() if p.startswith("/v1/looms")}
    for path, operations in looms.items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert statuses >= {"401", "403", "500"}, (path, method)
            if "{loom_id}" in path:
                assert "404" in statuses, (path, method)
            if "requestBody" in operation:
                assert statuses >= {"400", "413"}, (path, method)
            if path.endswith(("/branch", "/replay", "/score")):
                assert statuses >= {"400", "429", "502"}, (path, method)
                retry = operation["responses"]["429"]["headers"]
                assert {"Retry-After", "retry-after-ms", "x-should-retry"} <= set(retry)
            keys = [p for p in operation.get("parameters", []) if p["name"] == "Idempotency-Key"]
            if (path, method) in (("/v1/looms", "post"), ("/v1/looms/import", "post")) or (
                path == NODE + "/branch"
            ):
                assert [k["required"] for k in keys] == [False], (path, method)
            else:
                assert keys == [], (path, method)
    keys = {p: ops for p, ops in document["paths"].items() if p.startswith("/v1/keys")}
    for path, operations in keys.items():
        for method, operation in operations.items():
            assert set(operation["responses"]) >= {"401", "403", "500"}, (path, method)
            if path == KEY:
                assert "404" in operation["responses"], (path, method)
    create = keys["/v1/keys"]["post"]
    assert [p["name"] for p in create["parameters"]] == ["Idempotency-Key"]
    body = document["components"]["schemas"]["KeyCreateBody"]
    assert body["additionalProperties"] is False
    assert body["properties"]["monthly_tokens"]["anyOf"][0]["minimum"] == 0
    assert document["paths"]["/v1/usage"]["get"]["responses"]["200"]["content"]
    assert "413" in looms["/v1/looms/import"]["post"]["responses"]
    assert str(16 * 1024 * 1024) in looms["/v1/looms/import"]["post"]["description"]
    branch = looms[NODE + "/branch"]["post"]["responses"]
    assert set(branch["200"]["content"]) == {"text/event-stream"}
    assert branch["201"]["content"]["application/json"]["schema"]["$ref"].endswith("/LoomBranch")
    text = looms[NODE + "/text"]["get"]["responses"]["200"]
    assert set(text["content"]) == {"text/plain"}
    list_params = {p["name"]: p for p in looms["/v1/looms"]["get"]["parameters"]}
    assert list_params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 100}
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if path.startswith("/v1/") and int(status) >= 400:
                    schema_ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert schema_ref.endswith("/ErrorEnvelope"), (path, status)
                    assert "X-Request-Id" in response["headers"]


# Hostile bodies, sent raw (no JSON library writes them) to every operation that takes one, and
# validated by schemathesis against the operation's documented answers: a body nested 100,000
# deep, and one a byte over the operation's body limit (the node's defaults).
DEEP_BODY = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BODY_LIMITS = {
    "/v1/harvest": HARVEST_BODY_LIMIT_BYTES,
    "/v1/looms/import": 16 * 1024 * 1024,
    "/v1/applications": APPLICATION_BODY_LIMIT_BYTES,
}


def oversized_body(path: str) -> bytes:
    padding = BODY_LIMITS.get(path, Settings().body_limit_bytes) + 1 - len(b'{"prompt":""}')
    return b'{"prompt":"' + b"a" * padding + b'"}'


# Every operation whose document says it takes a body.
BODY_OPERATIONS = sorted(
    (path, method.upper())
    for path, operations in build_openapi(Settings(), "test")["paths"].items()
    for method, operation in operations.items()
    if "requestBody" in operation
)


@pytest.mark.parametrize("kind", ["deep", "oversized"])
@pytest.mark.parametrize(("path", "method"), BODY_OPERATIONS)
def test_hostile_bodies_are_refused_as_documented(
    api_schema, acs_server, auth, keys_auth, admin_auth, path, method, kind
):
    operation = api_schema[path][method]
    ids: dict[str, str] = {}
    if "{loom_id}" in path:
        real = real_loom(acs_server.base_url, auth)
        ids = {"loom_id": real["loom_id"], "node_id": real["child"]}  # replay needs a model node
    if path.startswith("/v1/keys"):
        auth = keys_auth
    if "{key_id}" in path:
        ids = {"key_id": real_key(acs_server.base_url, keys_auth)}
    if path.startswith("/v1/admin"):
        auth = admin_auth
        # Made-up ids: the body is refused before any lookup.
        ids.update({"account_id": "acct_0", "application_id": "app_0"})
    case = operation.Case(path_parameters=ids, body={}, media_type="application/json")
    response = httpx.request(
        method,
        f"{acs_server.base_url}{case.formatted_path}",
        content=DEEP_BODY if kind == "deep" else oversized_body(path),
        headers={**auth, "Content-Type": "application/json", "Idempotency-Key": kind},
        timeout=120,
    )
    case.validate_response(response, checks=CHECKS)
    expected = {"deep": (400, "bad_json"), "oversized": (413, "request_too_large")}[kind]
    if len(DEEP_BODY) > BODY_LIMITS.get(path, len(DEEP_BODY)):
        expected = (413, "request_too_large")  # the form's 16 KiB limit answers first
    assert (response.status_code, response.json()["error"]["code"]) == expected, response.text
