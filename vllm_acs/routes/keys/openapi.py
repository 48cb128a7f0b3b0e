"""The /v1/keys operations of /openapi.json: bounds, headers and every error answer.

API server process. Bodies are the strict models the routes validate with (`protocol.py`).
"""

from __future__ import annotations

from typing import Any

from ..openapi_parts import IDEMPOTENCY_KEY, REF, RETRY, error_doc, json_doc, path_param
from .protocol import ApiKeyList, ApiKeyView, CreatedApiKey, KeyCreateBody, KeyPatchBody
from .service import KEYS_PATH

_KEY_ID = {**path_param("key_id"), "description": "A key id (key_...) of the caller's account"}
_SCOPE_NOTE = "Needs the `keys` scope (403 scope_denied without it)."


def key_schemas() -> dict[str, Any]:
    components: dict[str, Any] = {}
    for model in (KeyCreateBody, KeyPatchBody, ApiKeyView, CreatedApiKey, ApiKeyList):
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def _body(name: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model=name)}}},
    }


def _errors(*statuses: int) -> dict[str, Any]:
    headers = {400: ("x-should-retry",), 409: RETRY, 429: ("x-should-retry",), 503: RETRY}
    return {str(s): error_doc(s, *headers.get(s, ())) for s in statuses}


def key_paths() -> dict[str, Any]:
    return {
        KEYS_PATH: {
            "post": {
                "operationId": "createKey",
                "summary": "A new key of the caller's account; its secret is shown this once",
                "description": f"{_SCOPE_NOTE} A key grants at most the scopes it holds (403 "
                "scope_denied, param scopes) and budgets at most its own (403 scope_denied, "
                "param the budget); a budget left out is the caller's own. A budget above the "
                "account's monthly total is a 400 naming the field. An account with "
                "max_keys_per_account live keys is refused (429 key_capacity). With "
                "Idempotency-Key a resent create returns the same key and secret "
                "(Idempotent-Replayed: true).",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": _body("KeyCreateBody"),
                "responses": {
                    "201": json_doc(
                        "The key, with its secret",
                        "CreatedApiKey",
                        "Location",
                        "Idempotent-Replayed",
                    ),
                    **_errors(400, 401, 403, 409, 413, 429, 500, 503),
                },
            },
            "get": {
                "operationId": "listKeys",
                "summary": "The account's keys with this month's spend; never a secret",
                "description": _SCOPE_NOTE,
                "responses": {
                    "200": json_doc("The keys", "ApiKeyList"),
                    **_errors(401, 403, 500, 503),
                },
            },
        },
        KEYS_PATH + "/{key_id}": {
            "patch": {
                "operationId": "updateKey",
                "summary": "Rename a key, change its budgets (null clears one), pause or resume it",
                "description": f"{_SCOPE_NOTE} A paused key is refused (401 key_disabled) on "
                "every node from its next request. A budget is at most the caller's own (a key "
                "lowers its own, never raises or clears them) and a key the operator paused is "
                "resumed by the operator only (both 403 scope_denied). Another account's key "
                "is a 404; a revoked key is a 409 key_not_changeable.",
                "parameters": [_KEY_ID],
                "requestBody": _body("KeyPatchBody"),
                "responses": {
                    "200": json_doc("The key", "ApiKeyView"),
                    **_errors(400, 401, 403, 404, 409, 413, 500, 503),
                },
            },
            "delete": {
                "operationId": "revokeKey",
                "summary": "Revoke a key for good (401 key_revoked from its next request)",
                "description": f"{_SCOPE_NOTE} Another account's key is a 404.",
                "parameters": [_KEY_ID],
                "responses": {
                    "200": json_doc("The revoked key", "ApiKeyView"),
                    **_errors(401, 403, 404, 500, 503),
                },
            },
        },
    }
