"""The bodies and answers of /v1/admin (also their OpenAPI schemas). Strict: an unknown field,
a wrong type or a bound outside the limits is a 400 naming the field.

API server process. Pure pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..applications.protocol import NOTE_MAX
from ..keys.protocol import BUDGET_MAX, NAME_MAX_CHARS

_STRICT = ConfigDict(extra="forbid", strict=True)
Limit = Annotated[int, Field(ge=0, le=BUDGET_MAX)]
Note = Annotated[str, Field(max_length=NOTE_MAX)]


class ApproveBody(BaseModel):
    model_config = _STRICT

    monthly_tokens: Limit | None = Field(
        default=None, description="The account's monthly token total (null: none)"
    )
    note: Note | None = None


class RejectBody(BaseModel):
    model_config = _STRICT

    note: Note | None = None


class KeyCounts(BaseModel):
    active: int
    paused: int
    revoked: int


class AccountView(BaseModel):
    object: Literal["account"] = "account"
    id: str
    name: str
    status: Literal["pending", "approved", "suspended", "rejected"]
    spend_capped: bool
    monthly_tokens: int | None = Field(description="The account's monthly total; null: none")
    period: str = Field(description="The UTC month of month_spend, YYYY-MM")
    month_spend: int = Field(ge=0, description="Tokens settled this month across its keys")
    keys: KeyCounts
    created_at: int


class KeyLimitsView(BaseModel):
    monthly_tokens: int | None
    daily_tokens: int | None
    monthly_input_tokens: int | None
    monthly_output_tokens: int | None
    max_running: int | None
    max_waiting: int | None
    starts_per_minute: int | None
    monthly_activation_requests: int | None


class AdminKeyView(BaseModel):
    object: Literal["api_key"] = "api_key"
    id: str
    account_id: str
    account_name: str | None
    name: str | None
    prefix: str = Field(description="The visible start of the secret; never the secret")
    state: Literal["active", "paused", "revoked"]
    paused_by: str | None = Field(description="`operator` (shell or admin key) or a key's id")
    scopes: list[str]
    limits: KeyLimitsView = Field(description="null: the node's default (traffic) or no cap")
    month_spend: int = Field(ge=0, description="Tokens settled this UTC month")
    created_at: int | None
    last_used_at: int | None
    revoked_at: int | None


class AccountDetail(AccountView):
    api_keys: list[AdminKeyView]


class AccountList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AccountView]


class AccountPatchBody(BaseModel):
    """Only the fields sent change."""

    model_config = _STRICT

    status: Literal["approved", "suspended"] | None = Field(
        default=None,
        description="approved: approve or resume; suspended: every key of the account gets 401 "
        "account_suspended",
    )
    spend_capped: bool | None = Field(default=None, description="true: 429 spend_cap")
    monthly_tokens: Limit | None = Field(default=None, description="null clears the total")


class AdminKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdminKeyView]


class AdminKeyPatchBody(BaseModel):
    """Only the fields sent change; a limit sent as null is cleared."""

    model_config = _STRICT

    state: Literal["active", "paused"] | None = Field(
        default=None, description="paused: refused (401 key_disabled) until resumed"
    )
    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS)] | None = None
    monthly_tokens: Limit | None = None
    daily_tokens: Limit | None = None
    monthly_input_tokens: Limit | None = None
    monthly_output_tokens: Limit | None = None
    max_running: Limit | None = None
    max_waiting: Limit | None = None
    starts_per_minute: Limit | None = None
    monthly_activation_requests: Limit | None = None


class AdminUsageRow(BaseModel):
    date: str = Field(description="The UTC day, YYYY-MM-DD")
    account_id: str | None
    account_name: str | None
    key_id: str | None
    key_prefix: str | None
    model: str | None
    workload: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    activation_requests: int


class AdminUsage(BaseModel):
    object: Literal["admin_usage"] = "admin_usage"
    period: str
    generated_at: int
    rows: list[AdminUsageRow]


class NodeView(BaseModel):
    id: str
    address: str
    model_id: str
    checkpoint: str
    warm: bool = Field(description="Its heartbeat is younger than registry_node_ttl_ms")
    started_at: int
    last_heartbeat_at: int
    plugin_version: str | None
    vllm_version: str | None


class ModelNodes(BaseModel):
    id: str
    nodes: int = Field(description="Warm nodes serving it")
    warm: bool


class NodeList(BaseModel):
    object: Literal["list"] = "list"
    generated_at: int
    data: list[NodeView]
    models: list[ModelNodes]


class AuditEvent(BaseModel):
    id: int
    at: int
    actor: str = Field(description="`operator`, a key id, or an application id")
    action: str
    account_id: str
    key_id: str = Field(description="`-` for an action on an account or an application")
    changes: dict[str, object]


class AuditList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditEvent]
    next_before: int | None = Field(description="Pass as `before` for the next (older) page")
