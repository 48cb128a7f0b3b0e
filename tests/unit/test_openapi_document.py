"""/openapi.json as built (no server): every public route is an operation with its error answers,
and the Loom operations document their bounds, headers and limits."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_acs.contract.routes import PUBLIC_NODE_ROUTES, PUBLIC_V1_ROUTES
from vllm_acs.routes.openapi import build_openapi
from vllm_acs.settings import Settings

# The API's description and its browsable page (Swagger UI and its two files): not operations.
UNDOCUMENTED = {
    "/openapi.json",
    "/docs",
    "/docs/swagger-init.js",
    "/static/swagger-ui-bundle.js",
    "/static/swagger-ui.css",
}
LOOM = "/v1/looms/{loom_id}"
NODE = LOOM + "/nodes/{node_id}"
GENERATIONS = (NODE + "/branch", NODE + "/replay", NODE + "/score")


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(loom_import_max_bytes=1234567, loom_max_nodes=321, loom_max_text_chars=4321)


@pytest.fixture(scope="module")
def document(settings: Settings) -> dict[str, Any]:
    return build_openapi(settings, "test")


def operations(document: dict[str, Any], prefix: str = "/") -> list[tuple[str, str, dict]]:
    return [
        (path, method, operation)
        for path, methods in document["paths"].items()
        if path.startswith(prefix)
        for method, operation in methods.items()
    ]


def refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [ref for item in value.values() for ref in refs(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in refs(item)]
    return []


def test_every_public_route_and_method_is_an_operation(document: dict[str, Any]):
    for route in (*PUBLIC_V1_ROUTES, *PUBLIC_NODE_ROUTES):
        if route.template in UNDOCUMENTED:
            continue
        assert route.template in document["paths"], route.template
        documented = set(document["paths"][route.template])
        assert documented == {m.lower() for m in route.methods}, route.template
    public = {r.template for r in (*PUBLIC_V1_ROUTES, *PUBLIC_NODE_ROUTES)}
    assert set(document["paths"]) <= public


def test_operation_ids_are_unique_and_every_ref_resolves(document: dict[str, Any]):
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == len(set(ids))
    components = document["components"]
    for ref in refs(document):
        kind, name = ref.removeprefix("#/components/").split("/")
        assert name in components[kind], ref


def test_every_loom_operation_lists_its_error_answers(document: dict[str, Any]):
    for path, method, operation in operations(document, "/v1/looms"):
        responses = operation["responses"]
        where = (path, method)
        assert set(responses) >= {"401", "403", "500"}, where
        if "{loom_id}" in path:
            assert "404" in responses, where
        if "requestBody" in operation:
            assert set(responses) >= {"400", "413"}, where
        for status, answer in responses.items():
            if int(status) >= 400:
                schema = answer["content"]["application/json"]["schema"]
                assert schema["$ref"].endswith("/ErrorEnvelope"), (*where, status)
                assert "X-Request-Id" in answer["headers"], (*where, status)
        if path in GENERATIONS:
            assert set(responses) >= {"400", "429", "502"}, where
            for status in ("429", "502"):
                headers = set(responses[status]["headers"])
                assert headers >= {"Retry-After", "retry-after-ms", "x-should-retry"}, where
        if (method in ("patch", "delete") and path == NODE) or path.endswith(
            ("/split", "/children", "/siblings", "/branch", "/replay")
        ):
            assert "409" in responses, where


def test_idempotency_key_is_optional_on_the_creating_posts(document: dict[str, Any]):
    idempotent = {("/v1/looms", "post"), ("/v1/looms/import", "post"), (NODE + "/branch", "post")}
    for path, method, operation in operations(document, "/v1/looms"):
        keys = [p for p in operation.get("parameters", []) if p["name"] == "Idempotency-Key"]
        if (path, method) in idempotent:
            (key,) = keys
            assert key["in"] == "header" and key["required"] is False
            assert key["schema"]["maxLength"] == 255
            assert set(operation["responses"]["409"]["headers"]) >= {"Retry-After"}
        else:
            assert keys == [], (path, method)
    jobs = document["paths"]["/v1/completion-jobs"]["post"]["parameters"]
    assert [(p["name"], p["required"]) for p in jobs] == [("Idempotency-Key", True)]
    harvest = document["paths"]["/v1/harvest"]["post"]["parameters"]
    assert [(p["name"], p["required"]) for p in harvest] == [("Idempotency-Key", False)]


def test_loom_bounds_and_limits(document: dict[str, Any]):
    paths = document["paths"]
    listing = {p["name"]: p for p in paths["/v1/looms"]["get"]["parameters"]}
    assert listing["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 100}
    assert listing["after"]["in"] == "query" and listing["after"]["required"] is False
    imported = paths["/v1/looms/import"]["post"]
    assert "1234567 bytes" in imported["description"]
    assert "1234567 bytes" in imported["responses"]["413"]["description"]
    assert "321 Nodes" in imported["description"] and "4321 characters" in imported["description"]
    assert "4321 characters" in paths["/v1/looms"]["post"]["description"]
    assert "321 Nodes" in paths[NODE + "/children"]["post"]["description"]
    schemas = document["components"]["schemas"]
    assert schemas["LoomCreateBody"]["required"] == ["prompt"]
    assert schemas["LoomCreateBody"]["additionalProperties"] is False
    assert schemas["NodeSplitBody"]["properties"]["offset"]["minimum"] == 1
    assert schemas["NodeScoreBody"]["properties"]["logprobs"]["maximum"] == 100
    branch_body = schemas["LoomBranchBody"]["properties"]
    assert "prompt" not in branch_body and branch_body["n"]["maximum"] == 16
    assert "stream" in branch_body


def test_loom_answers(document: dict[str, Any]):
    paths = document["paths"]

    def schema(path: str, method: str, status: str, media: str = "application/json") -> Any:
        content = paths[path][method]["responses"][status]["content"]
        return content[media]["schema"]

    assert schema("/v1/looms", "post", "201")["$ref"].endswith("/Loom")
    created = paths["/v1/looms"]["post"]["responses"]["201"]["headers"]
    assert {"Location", "Idempotent-Replayed"} <= set(created)
    assert schema("/v1/looms", "get", "200")["$ref"].endswith("/LoomList")
    assert schema(LOOM + "/export", "get", "200")["$ref"].endswith("/LoomExport")
    assert schema(NODE, "get", "200")["$ref"].endswith("/LoomNode")
    assert schema(NODE, "patch", "200")["$ref"].endswith("/LoomNodeList")
    for made in ("/split", "/children", "/siblings"):
        assert schema(NODE + made, "post", "201")["$ref"].endswith("/LoomNodeList")
    assert schema(NODE + "/text", "get", "200", "text/plain") == {"type": "string"}
    assert set(paths[NODE + "/branch"]["post"]["responses"]["200"]["content"]) == {
        "text/event-stream"
    }
    event = schema(NODE + "/branch", "post", "200", "text/event-stream")
    assert event["$ref"].endswith("/LoomBranchEvent")
    event = document["components"]["schemas"]["LoomBranchEvent"]
    assert event["properties"]["event"]["enum"] == ["started", "delta", "done", "error"]
    assert schema(NODE + "/branch", "post", "201")["$ref"].endswith("/LoomBranch")
    assert schema(NODE + "/replay", "post", "200")["$ref"].endswith("/LoomReplay")
    assert schema(NODE + "/score", "post", "200")["$ref"].endswith("/LoomScore")
    node = document["components"]["schemas"]["LoomNode"]
    assert node["properties"]["origin"]["enum"] == ["root", "model", "human", "split", "import"]
    assert node["properties"]["status"]["enum"] == ["generating", "ready", "failed"]


def test_loom_answer_schemas_match_the_views():
    """The hand schemas' required fields are exactly what views.py and export_file.py write."""
    from datetime import datetime, timezone

    from vllm_acs.looms.export_file import export_document
    from vllm_acs.looms.views import branch_view, loom_summary, loom_view
    from vllm_acs.routes.looms.openapi import loom_schemas
    from vllm_acs.storage.loom_records import Loom, LoomNode, LoomTree

    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    loom = Loom("loom_1", "key", "account", "t", 1, now, now)
    root = LoomNode("loom_1", None, 0, "root", "ready", "Hello", now, now, id="node_1")
    tree = LoomTree(loom, [root])
    schemas = loom_schemas()
    node = loom_view(tree)["nodes"][0]
    assert set(schemas["LoomNode"]["required"]) == set(node)
    assert set(schemas["LoomSummary"]["required"]) == set(loom_summary(loom))
    assert set(schemas["Loom"]["required"]) == set(loom_view(tree))
    assert set(schemas["LoomBranch"]["properties"]) == set(branch_view(tree, "node_1", []))
    exported = export_document(tree, now)
    assert set(schemas["LoomExport"]["required"]) == set(exported)
    node_schema = schemas["LoomExport"]["properties"]["nodes"]["items"]
    assert set(node_schema["required"]) == set(exported["nodes"][0])


def test_the_completion_lists_the_request_window_answer(document: dict[str, Any]):
    responses = document["paths"]["/v1/completions"]["post"]["responses"]
    late = responses["504"]
    assert "upstream_deadline" in late["description"]
    assert set(late["headers"]) == {
        "X-Request-Id",
        "X-Acs-Upstream-Model",
        "X-Acs-Upstream-Gpu",
        "X-Acs-Upstream-Error-Kind",
        "x-should-retry",
    }
    assert "Retry-After" not in late["headers"]
    assert late["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorEnvelope")
    assert "keepalive" in responses["200"]["description"]


def test_the_model_status_operation(document: dict[str, Any]):
    operation = document["paths"]["/v1/models/{model_id}/status"]["get"]
    assert operation["operationId"] == "getModelStatus"
    (model_id,) = operation["parameters"]
    assert (model_id["name"], model_id["in"], model_id["required"]) == ("model_id", "path", True)
    responses = operation["responses"]
    assert set(responses) == {"200", "401", "404", "500", "503"}
    assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ModelStatus"
    )
    assert {"Retry-After", "retry-after-ms"} <= set(responses["503"]["headers"])
    status = document["components"]["schemas"]["ModelStatus"]
    assert set(status["required"]) == set(status["properties"]) == {"id", "warm", "nodes"}
    assert status["properties"]["warm"]["type"] == "boolean"
    nodes = status["properties"]["nodes"]
    assert (nodes["type"], nodes["minimum"]) == ("integer", 0)
