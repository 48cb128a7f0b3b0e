"""The completion-jobs operations of /openapi.json: bounds, headers and every error answer.

API server process.
"""

from __future__ import annotations

from typing import Any

from ..long_poll import wait_param
from ..openapi_parts import IDEMPOTENCY_KEY_REQUIRED, JOB_ID, REF, RETRY, error_doc, json_doc
from .protocol import CompletionJob
from .service import JOBS_PATH


def job_schemas() -> dict[str, Any]:
    return {"CompletionJob": CompletionJob.model_json_schema(ref_template=REF)}


def _submit() -> dict[str, Any]:
    return {
        "operationId": "createCompletionJob",
        "summary": "Run one completion on the server; poll it, then fetch its result",
        "parameters": [IDEMPOTENCY_KEY_REQUIRED],
        "requestBody": {
            "required": True,
            "description": "A /v1/completions body without `stream`",
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model="CompletionRequest")}}
            },
        },
        "responses": {
            "202": json_doc("The job, queued", "CompletionJob", "Location", "Idempotent-Replayed"),
            "400": error_doc(400, "x-should-retry"),
            "401": error_doc(401),
            "403": error_doc(403),
            "409": error_doc(409, *RETRY),
            "413": error_doc(413, "x-should-retry"),
            "429": error_doc(429, *RETRY),
            "500": error_doc(500, "x-should-retry"),
        },
    }


def _result() -> dict[str, Any]:
    stored = "The error the job's completion answered with (stored), or this route's own"
    responses: dict[str, Any] = {
        "200": json_doc("The completion, as it answered", "Completion"),
        "202": json_doc(
            "The job has not ended yet", "CompletionJob", "Retry-After", "X-Acs-Longpoll"
        ),
    }
    for status in (400, 401, 403, 404, 429, 500, 502):
        responses[str(status)] = {**error_doc(status, *RETRY), "description": stored}
    return {
        "operationId": "getCompletionJobResult",
        "parameters": [
            JOB_ID,
            wait_param("Hold the answer up to this many seconds until the job ends"),
        ],
        "responses": responses,
    }


def job_paths() -> dict[str, Any]:
    return {
        JOBS_PATH: {"post": _submit()},
        JOBS_PATH + "/{job_id}": {
            "get": {
                "operationId": "getCompletionJob",
                "parameters": [
                    JOB_ID,
                    wait_param("Hold the answer up to this many seconds until the job ends"),
                ],
                "responses": {
                    "200": json_doc(
                        "The job: status and timestamps",
                        "CompletionJob",
                        "X-Acs-Longpoll",
                        "Retry-After",
                    ),
                    "400": error_doc(400, "x-should-retry"),
                    "401": error_doc(401),
                    "404": error_doc(404),
                    "500": error_doc(500),
                },
            },
            "delete": {
                "operationId": "cancelCompletionJob",
                "parameters": [JOB_ID],
                "responses": {
                    "200": json_doc("The job, cancelled", "CompletionJob"),
                    "401": error_doc(401),
                    "404": error_doc(404),
                    "409": error_doc(409, "x-should-retry"),
                    "500": error_doc(500),
                },
            },
        },
        JOBS_PATH + "/{job_id}/result": {"get": _result()},
    }
