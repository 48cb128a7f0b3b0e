"""The pieces /openapi.json is made of: the error envelope, the headers, error and JSON answers.

API server process. Shared by routes/openapi.py and each feature's own operations.
"""

from __future__ import annotations

from typing import Any

from ..errors import REQUEST_ID_PATTERN

REF = "#/components/schemas/{model}"

ERROR_ENVELOPE = {
    "type": "object",
    "required": ["error", "request_id"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string", "description": "The spec's error code"},
            },
        },
        "request_id": {"type": "string", "description": "Equals the X-Request-Id header"},
    },
}

HEADERS: dict[str, dict[str, Any]] = {
    "X-Request-Id": {
        "description": "The request's trace id (the client's when 1-64 of [A-Za-z0-9_-])",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{REQUEST_ID_PATTERN.pattern}$"},
    },
    "X-Acs-Upstream-Model": {"description": "The checkpoint", "schema": {"type": "string"}},
    "X-Acs-Upstream-Gpu": {"description": "The operator's gpu_shape", "schema": {"type": "string"}},
    "X-Acs-Upstream-Error-Kind": {
        "description": "Mirrors error.code on engine errors",
        "schema": {"type": "string"},
    },
    "X-Acs-Max-Tokens-Clamped": {
        "description": "requested=N,applied=M,reason=budget|deadline|deadline+budget,"
        "source=client|default",
        "schema": {"type": "string"},
    },
    "Retry-After": {"description": "Seconds before a retry", "schema": {"type": "string"}},
    "retry-after-ms": {"description": "Milliseconds before a retry", "schema": {"type": "string"}},
    "x-should-retry": {
        "description": "false: resending cannot fix it",
        "schema": {"type": "string"},
    },
    "Location": {
        "description": "The path of what was made (a job, a Loom)",
        "schema": {"type": "string"},
    },
    "X-Acs-Longpoll": {
        "description": "declined: too many reads wait on this node; answered at once",
        "schema": {"type": "string", "enum": ["declined"]},
    },
    "Idempotent-Replayed": {
        "description": "true: the first answer to this Idempotency-Key, sent again",
        "schema": {"type": "string", "enum": ["true"]},
    },
}

ERROR_TEXT = {
    400: "Invalid request (invalid_request, bad_json, model_not_found, context_length_exceeded, "
    "harvest_unsupported, loom_file_invalid, "
    "deadline_infeasible, full_vocab_prompt_too_long, activation_prompt_too_long, "
    "position_steering_unavailable, chat_completions_unsupported, vllm_invalid_request, "
    "vllm_context_length)",
    401: "No valid key (missing_authorization, invalid_api_key, key_revoked, key_disabled, "
    "account_suspended, account_not_approved, account_rejected; invalid_claim_code)",
    403: "scope_denied: the key lacks the route's scope (or grants one it does not hold, sets a "
    "budget above its own, or resumes a key the operator paused); "
    "download_url_invalid: an expired, "
    "unsigned or altered download URL; application_rejected: the operator did not approve the "
    "application",
    404: "Unknown route or id (not_found, model_not_found, job_not_found, harvest_job_not_found, "
    "loom_not_found, loom_node_not_found, key_not_found, account_not_found, "
    "application_not_found; applications_closed: the node's application form is off)",
    409: "idempotency_conflict, no_answer, job_not_cancellable, harvest_not_cancellable, "
    "key_not_changeable, loom_node_conflict, loom_node_limit, application_not_pending "
    "(x-should-retry: false); application_pending: not reviewed yet; running "
    "(Retry-After): the first request with this Idempotency-Key has not answered yet",
    410: "application_expired, claim_code_used: the claim code no longer works",
    413: "request_too_large",
    416: "range_not_satisfiable: the Range is not one range inside the file",
    429: "budget_exceeded, activation_quota_exceeded, job_capacity, harvest_quota_exceeded, "
    "loom_capacity, key_capacity, applications_full (no Retry-After), queue_full, "
    "rate_limited, spend_cap, "
    "harvest_concurrency_exceeded, harvest_capacity_exceeded (Retry-After)",
    500: "internal_error",
    502: "The inference engine failed (vllm_oom, vllm_engine_dead, upstream_server_error; "
    "capture_incomplete (retry after Retry-After), capture_rows_missing (not retryable))",
    503: "A shared part of the deployment did not answer (db_pool_exhausted, circuit_open, "
    "harvest_unavailable); retry after Retry-After",
    504: "upstream_deadline: a request without stream did not finish inside the request window "
    "and was stopped (x-should-retry: false, no Retry-After; lower max_tokens or stream). Once "
    "keepalive bytes have committed a 200, the same envelope is the body of that 200",
}


# The headers of an answer a client may retry (or is told not to).
RETRY = ("Retry-After", "retry-after-ms", "x-should-retry")
# A writing POST's Idempotency-Key header: optional where not every client sends one.
IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Sending the same request again with the same key returns the first answer "
    "(Idempotent-Replayed: true); another body with it is 409 idempotency_conflict",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
}
IDEMPOTENCY_KEY_REQUIRED: dict[str, Any] = {**IDEMPOTENCY_KEY, "required": True}


def path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


JOB_ID = path_param("job_id")


def headers_doc(*names: str) -> dict[str, Any]:
    return {name: {"$ref": f"#/components/headers/{name}"} for name in ("X-Request-Id", *names)}


def error_doc(status: int, *headers: str) -> dict[str, Any]:
    return {
        "description": ERROR_TEXT[status],
        "headers": headers_doc(*headers),
        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorEnvelope")}}},
    }


def json_doc(description: str, schema_name: str, *headers: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": headers_doc(*headers),
        "content": {"application/json": {"schema": {"$ref": REF.format(model=schema_name)}}},
    }
