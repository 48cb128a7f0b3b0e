"""The harvest operations of /openapi.json: bounds, headers and every error answer.

API server process.
"""

from __future__ import annotations

from typing import Any

from ...contract.harvest_request import HARVEST_BODY_LIMIT_BYTES, HarvestBody
from ..long_poll import wait_param
from ..openapi_parts import IDEMPOTENCY_KEY, JOB_ID, REF, RETRY, error_doc, json_doc
from .protocol import HarvestJob, HarvestSubmitted
from .service import DOWNLOADS_PATH, HARVEST_PATH


def harvest_schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in (HarvestBody, HarvestSubmitted, HarvestJob):
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _submit() -> dict[str, Any]:
    return {
        "operationId": "createHarvest",
        "summary": "Capture the residual stream of many prompts into safetensors shards",
        "description": f"Bodies up to {HARVEST_BODY_LIMIT_BYTES} bytes on this route.",
        "parameters": [IDEMPOTENCY_KEY],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model="HarvestBody")}}},
        },
        "responses": {
            "202": json_doc("The harvest, pending", "HarvestSubmitted", "Location"),
            "400": error_doc(400, "x-should-retry"),
            "401": error_doc(401),
            "403": error_doc(403),
            "409": error_doc(409, *RETRY),
            "413": error_doc(413, "x-should-retry"),
            "429": error_doc(429, *RETRY),
            "500": error_doc(500, "x-should-retry"),
            "503": error_doc(503, *RETRY),
        },
    }


def _read() -> dict[str, Any]:
    return {
        "operationId": "getHarvest",
        "parameters": [
            JOB_ID,
            wait_param("Hold the answer up to this many seconds until the status changes"),
        ],
        "responses": {
            "200": json_doc(
                "The harvest: status, progress, and when done its signed file URLs",
                "HarvestJob",
                "X-Acs-Longpoll",
                "Retry-After",
            ),
            "400": error_doc(400, "x-should-retry"),
            "401": error_doc(401),
            "404": error_doc(404),
            "500": error_doc(500),
            "503": error_doc(503, *RETRY),
        },
    }


def _download() -> dict[str, Any]:
    query = [
        {"name": name, "in": "query", "required": True, "schema": {"type": "string"}}
        for name in ("expires", "signature")
    ]
    return {
        "operationId": "downloadHarvestFile",
        "summary": "A harvest file by its signed URL (no API key); HTTP Range supported",
        "security": [],
        "parameters": [
            JOB_ID,
            {"name": "file_name", "in": "path", "required": True, "schema": {"type": "string"}},
            *query,
            {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"}},
        ],
        "responses": {
            "200": {"description": "The whole file"},
            "206": {"description": "The requested range (Content-Range)"},
            "403": error_doc(403, "x-should-retry"),
            "404": error_doc(404),
            "416": error_doc(416, "x-should-retry"),
        },
    }


def harvest_paths() -> dict[str, Any]:
    return {
        HARVEST_PATH: {"post": _submit()},
        HARVEST_PATH + "/{job_id}": {
            "get": _read(),
            "delete": {
                "operationId": "cancelHarvest",
                "parameters": [JOB_ID],
                "responses": {
                    "200": json_doc("The harvest, cancelled", "HarvestJob"),
                    "401": error_doc(401),
                    "404": error_doc(404),
                    "409": error_doc(409, "x-should-retry"),
                    "500": error_doc(500),
                    "503": error_doc(503, *RETRY),
                },
            },
        },
        DOWNLOADS_PATH + "/{job_id}/{file_name}": {"get": _download()},
    }
