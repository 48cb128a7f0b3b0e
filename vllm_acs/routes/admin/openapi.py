"""The /v1/admin operations of /openapi.json: the `admin` scope, bounds, query parameters and
every error answer. API server process. Bodies are the strict models the routes validate with.
"""

from __future__ import annotations

from typing import Any

from ...storage.applications import STATUSES
from ...storage.key_events import ACTIONS
from ..applications.openapi import body_doc
from ..openapi_parts import REF, RETRY, error_doc, json_doc, path_param
from . import api_router as paths
from .protocol import (
    AccountDetail,
    AccountList,
    AccountPatchBody,
    AccountView,
    AdminKeyList,
    AdminKeyPatchBody,
    AdminKeyView,
    AdminUsage,
    ApproveBody,
    AuditList,
    NodeList,
    RejectBody,
)
from .queries import TEXT_MAX
from .reports import EPOCH_MAX, USAGE_COLUMNS
from .service import KEY_STATES

_SCOPE = "Needs the `admin` scope (403 scope_denied without it); audited under the key's id."


def admin_schemas() -> dict[str, Any]:
    components: dict[str, Any] = {}
    models = (
        ApproveBody,
        RejectBody,
        AccountView,
        AccountDetail,
        AccountList,
        AccountPatchBody,
        AdminKeyView,
        AdminKeyList,
        AdminKeyPatchBody,
        AdminUsage,
        NodeList,
        AuditList,
    )
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _text(name: str, description: str) -> dict[str, Any]:
    return _query(name, {"type": "string", "minLength": 1, "maxLength": TEXT_MAX}, description)


def _errors(*statuses: int) -> dict[str, Any]:
    headers = {400: ("x-should-retry",), 409: ("x-should-retry",), 503: RETRY}
    return {str(s): error_doc(s, *headers.get(s, ())) for s in (401, 403, 500, 503, *statuses)}


def _operation(
    operation_id: str,
    summary: str,
    answer: tuple[str, str],
    *errors: int,
    parameters: list[dict[str, Any]] | None = None,
    body: tuple[str, bool] | None = None,
    description: str = "",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "description": f"{_SCOPE} {description}".strip(),
        "responses": {"200": json_doc(*answer), **_errors(*errors)},
    }
    if parameters:
        doc["parameters"] = parameters
    if body is not None:
        doc["requestBody"] = body_doc(*body)
    return doc


_APPLICATION_ID = {**path_param("application_id"), "description": "An application id (app_...)"}
_ACCOUNT_ID = {**path_param("account_id"), "description": "An account id (acct_...) or name"}
_KEY_ID = {**path_param("key_id"), "description": "A key id (key_...) or visible prefix"}
_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "At most this many")


def admin_paths() -> dict[str, Any]:
    decide = {"parameters": [_APPLICATION_ID]}
    return {
        paths.APPLICATIONS: {
            "get": _operation(
                "adminListApplications",
                "Applications, newest first, with the applicants' answers",
                ("The applications", "ApplicationList"),
                400,
                parameters=[
                    _query(
                        "status",
                        {"type": "string", "enum": [*STATUSES, "all"]},
                        "Default pending",
                    ),
                    _LIMIT,
                ],
            )
        },
        paths.APPLICATION + "/approve": {
            "post": _operation(
                "adminApproveApplication",
                "Approve a pending application and its account (the applicant can then claim)",
                ("The application", "ApplicationView"),
                400,
                404,
                409,
                413,
                body=("ApproveBody", False),
                description="An application that is not pending is a 409 application_not_pending.",
                **decide,
            )
        },
        paths.APPLICATION + "/reject": {
            "post": _operation(
                "adminRejectApplication",
                "Reject a pending application (its claim code then says so)",
                ("The application", "ApplicationView"),
                400,
                404,
                409,
                413,
                body=("RejectBody", False),
                **decide,
            )
        },
        paths.ACCOUNTS: {
            "get": _operation(
                "adminListAccounts",
                "Every account: status, budget, this month's spend, keys by state",
                ("The accounts", "AccountList"),
            )
        },
        paths.ACCOUNT: {
            "get": _operation(
                "adminGetAccount",
                "One account and its keys",
                ("The account", "AccountDetail"),
                404,
                parameters=[_ACCOUNT_ID],
            ),
            "patch": _operation(
                "adminUpdateAccount",
                "Approve, suspend or resume an account; spend-cap it; set its monthly total",
                ("The account", "AccountView"),
                400,
                404,
                413,
                parameters=[_ACCOUNT_ID],
                body=("AccountPatchBody", True),
            ),
        },
        paths.KEYS: {
            "get": _operation(
                "adminListKeys",
                "The keys of every account (or one): scopes, limits, spend, last use",
                ("The keys", "AdminKeyList"),
                400,
                404,
                parameters=[
                    _text("account_id", "Only this account's keys (id or name)"),
                    _query("state", {"type": "string", "enum": list(KEY_STATES)}, "Only these"),
                ],
            )
        },
        paths.KEY: {
            "patch": _operation(
                "adminUpdateKey",
                "Pause or resume any key, rename it, set its limits (null clears one)",
                ("The key", "AdminKeyView"),
                400,
                404,
                409,
                413,
                parameters=[_KEY_ID],
                body=("AdminKeyPatchBody", True),
                description="A paused key gets 401 key_disabled from its next request; only "
                "the operator's side resumes it. A revoked key is a 409 key_not_changeable.",
            ),
            "delete": _operation(
                "adminRevokeKey",
                "Revoke any key for good (401 key_revoked from its next request)",
                ("The revoked key", "AdminKeyView"),
                404,
                parameters=[_KEY_ID],
            ),
        },
        paths.USAGE: {
            "get": _with_csv(
                _operation(
                    "adminUsage",
                    "Usage across accounts per UTC day, account, key, model and workload",
                    ("The rows", "AdminUsage"),
                    400,
                    404,
                    parameters=[
                        _query(
                            "period",
                            {"type": "string", "pattern": r"^\d{4}-(0[1-9]|1[0-2])$"},
                            "A UTC month, YYYY-MM (default: this one)",
                        ),
                        _text("account_id", "Only this account (id or name)"),
                        _text("key_id", "Only this key id"),
                        _text("model", "Only this model id"),
                        _text("workload", "Only this X-Acs-Workload"),
                        _query(
                            "format",
                            {"type": "string", "enum": ["json", "csv"]},
                            "csv: text/csv with the columns " + ",".join(USAGE_COLUMNS),
                        ),
                    ],
                )
            )
        },
        paths.NODES: {
            "get": _operation(
                "adminNodes",
                "The deployment's nodes: model, warm or not, last heartbeat, versions",
                ("The nodes", "NodeList"),
            )
        },
        paths.AUDIT: {
            "get": _operation(
                "adminAudit",
                "The audit log of every operator and key-management action, newest first",
                ("The events", "AuditList"),
                400,
                parameters=[
                    _text("account_id", "Only this account (id or name)"),
                    _text("key_id", "Only this key id"),
                    _text("actor", "Only this actor: operator, a key id, an application id"),
                    _query("action", {"type": "string", "enum": list(ACTIONS)}, "Only this"),
                    _query(
                        "since",
                        {"type": "integer", "minimum": 0, "maximum": EPOCH_MAX},
                        "Unix seconds: events at or after",
                    ),
                    _query(
                        "before",
                        {"type": "integer", "minimum": 1, "maximum": 2**62},
                        "An event id: older events (the next page)",
                    ),
                    _LIMIT,
                ],
            )
        },
    }


def _with_csv(operation: dict[str, Any]) -> dict[str, Any]:
    """The usage's 200 is JSON, or CSV with `format=csv`."""
    ok = operation["responses"]["200"]
    ok["content"]["text/csv"] = {"schema": {"type": "string"}}
    return operation
