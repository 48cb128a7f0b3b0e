"""The /v1/applications operations of /openapi.json: no key (`security: []`), bounds, headers and
every error answer. API server process. Bodies are the strict models the routes validate with.
"""

from __future__ import annotations

from typing import Any

from ..openapi_parts import REF, RETRY, error_doc, json_doc
from .protocol import (
    APPLICATION_BODY_LIMIT_BYTES,
    ApplicationBody,
    ApplicationForm,
    ApplicationList,
    ApplicationView,
    ClaimBody,
    ClaimedApplication,
    SubmittedApplication,
)
from .service import APPLICATIONS_PATH, CLAIM_PATH, FORM_PATH

_CLOSED = (
    "Answers without a key. Off unless the operator sets VLLM_ACS_APPLICATIONS=open: then "
    "404 applications_closed."
)


def application_schemas() -> dict[str, Any]:
    components: dict[str, Any] = {}
    models = (
        ApplicationBody,
        ClaimBody,
        ApplicationForm,
        SubmittedApplication,
        ClaimedApplication,
        ApplicationView,
        ApplicationList,
    )
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def body_doc(name: str, required: bool = True) -> dict[str, Any]:
    return {
        "required": required,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=name)}}},
    }


def application_paths() -> dict[str, Any]:
    return {
        FORM_PATH: {
            "get": {
                "operationId": "getApplicationForm",
                "summary": "Whether this node takes applications, and the fields' bounds",
                "description": _CLOSED,
                "security": [],
                "responses": {
                    "200": json_doc("The form", "ApplicationForm"),
                    "404": error_doc(404),
                    "500": error_doc(500),
                },
            }
        },
        APPLICATIONS_PATH: {
            "post": {
                "operationId": "applyForAccess",
                "summary": "Apply for access; the answer shows the one-time claim code once",
                "description": f"{_CLOSED} Only the claim code's hash is kept. At most "
                "applications_per_address applications per client address and hour (429 "
                "rate_limited, Retry-After), at most applications_pending_cap waiting for review "
                f"(429 applications_full). Bodies above {APPLICATION_BODY_LIMIT_BYTES} bytes are "
                "refused (413).",
                "security": [],
                "requestBody": body_doc("ApplicationBody"),
                "responses": {
                    "201": json_doc(
                        "The pending application and its claim code", "SubmittedApplication"
                    ),
                    "400": error_doc(400, "x-should-retry"),
                    "404": error_doc(404),
                    "413": error_doc(413),
                    "429": error_doc(429, *RETRY),
                    "500": error_doc(500),
                    "503": error_doc(503, *RETRY),
                },
            }
        },
        CLAIM_PATH: {
            "post": {
                "operationId": "claimApplication",
                "summary": "The approved application's first API key, once, for its claim code",
                "description": "Answers without a key; the code travels in the body. Pending: "
                "409 application_pending; rejected: 403 application_rejected; expired: 410 "
                "application_expired; claimed already: 410 claim_code_used; unknown: 401 "
                "invalid_claim_code.",
                "security": [],
                "requestBody": body_doc("ClaimBody"),
                "responses": {
                    "201": json_doc("The application and its first key", "ClaimedApplication"),
                    "400": error_doc(400, "x-should-retry"),
                    "401": error_doc(401),
                    "403": error_doc(403, "x-should-retry"),
                    "409": error_doc(409, "x-should-retry"),
                    "410": error_doc(410, "x-should-retry"),
                    "413": error_doc(413),
                    "500": error_doc(500),
                    "503": error_doc(503, *RETRY),
                },
            }
        },
    }
