"""/openapi.json describes what the server really does: a bounded schemathesis run over every
operation (positive and negative examples) finds no 500 and no answer that breaks the schema."""

from __future__ import annotations

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

pytestmark = pytest.mark.e2e

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
OPERATIONS = [
    ("/v1/completions", "POST", POSITIVE, 40),
    ("/v1/completions", "POST", NEGATIVE, 40),
    ("/v1/chat/completions", "POST", POSITIVE, 10),
    ("/v1/models", "GET", POSITIVE, 3),
    ("/v1/models/{model_id}", "GET", POSITIVE, 10),
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
]


@pytest.fixture(scope="session")
def api_schema(acs_server):
    return schemathesis.openapi.from_url(f"{acs_server.base_url}/openapi.json")


@pytest.mark.parametrize(("path", "method", "mode", "examples"), OPERATIONS)
def test_operation_conforms(api_schema, auth, path: str, method: str, mode, examples: int):
    # Bounded and reproducible: a fixed number of examples, derandomized, on loopback only.
    operation = api_schema[path][method]
    statuses: list[int] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
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


def test_document_covers_the_public_surface(acs_server):
    document = httpx.get(f"{acs_server.base_url}/openapi.json").json()
    assert set(document["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/completion-jobs",
        "/v1/completion-jobs/{job_id}",
        "/v1/completion-jobs/{job_id}/result",
        "/v1/harvest",
        "/v1/harvest/{job_id}",
        "/downloads/{job_id}/{file_name}",
        "/health",
    }
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
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if path.startswith("/v1/") and int(status) >= 400:
                    schema_ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert schema_ref.endswith("/ErrorEnvelope"), (path, status)
                    assert "X-Request-Id" in response["headers"]
