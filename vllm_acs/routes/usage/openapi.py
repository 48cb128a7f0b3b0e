"""The GET /v1/usage operation of /openapi.json. API server process."""

from __future__ import annotations

from typing import Any

from ..openapi_parts import REF, RETRY, error_doc, json_doc
from .api_router import USAGE_PATH
from .protocol import UsageReport


def usage_schemas() -> dict[str, Any]:
    schema = UsageReport.model_json_schema(ref_template=REF)
    components: dict[str, Any] = schema.pop("$defs", {})
    components["UsageReport"] = schema
    return components


def usage_paths() -> dict[str, Any]:
    return {
        USAGE_PATH: {
            "get": {
                "operationId": "getUsage",
                "summary": "The calling key's budgets, this month's tokens and its traffic now",
                "description": "Any valid key, about itself. Budgets with a limit are read from "
                "the counters admission decides on (spent, held by requests in flight, "
                "remaining); the per-day and per-model tokens from the usage ledger.",
                "responses": {
                    "200": json_doc("The usage", "UsageReport"),
                    "401": error_doc(401),
                    "500": error_doc(500),
                    "503": error_doc(503, *RETRY),
                },
            }
        }
    }
