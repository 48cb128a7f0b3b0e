"""The bodies and answers of /v1/keys (also their OpenAPI schemas). Strict: an unknown field, a
wrong type or a bound outside the limits is a 400 naming the field.

API server process. Pure pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME_MAX_CHARS = 200
# Integers a JSON client can hold exactly (2^53 - 1), and far above any token budget.
BUDGET_MAX = 9_007_199_254_740_991
_STRICT = ConfigDict(extra="forbid", strict=True)

Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS)]
Budget = Annotated[int, Field(ge=0, le=BUDGET_MAX)]
Scope = Literal["completions", "jobs", "harvest", "looms", "keys"]
# A new key's budget: never above the calling key's own (issue 31).
_INHERITED = (
    "; at most the calling key's own; left out: the calling key's own; null: no cap (only for "
    "a key without one)"
)


class KeyCreateBody(BaseModel):
    model_config = _STRICT

    name: Name | None = None
    scopes: list[Scope] | None = Field(
        default=None,
        min_length=1,
        max_length=5,
        description="At most the scopes the calling key holds; default: the calling key's "
        "scopes other than `keys`",
    )
    monthly_tokens: Budget | None = Field(
        default=None,
        description="prompt + completion tokens per UTC month" + _INHERITED,
    )
    daily_tokens: Budget | None = Field(
        default=None,
        description="prompt + completion tokens per UTC day" + _INHERITED,
    )
    monthly_input_tokens: Budget | None = Field(
        default=None,
        description="prompt tokens per UTC month" + _INHERITED,
    )
    monthly_output_tokens: Budget | None = Field(
        default=None,
        description="completion tokens per UTC month" + _INHERITED,
    )


class KeyPatchBody(BaseModel):
    """Only the fields sent change; a budget sent as null is cleared. A budget is at most the
    calling key's own (a key lowers its own budgets, never raises or clears them); a key that
    the operator paused is resumed by the operator only (`403 scope_denied`)."""

    model_config = _STRICT

    name: Name | None = None
    monthly_tokens: Budget | None = None
    daily_tokens: Budget | None = None
    monthly_input_tokens: Budget | None = None
    monthly_output_tokens: Budget | None = None
    state: Literal["active", "paused"] | None = Field(
        default=None, description="paused: refused (401 key_disabled) until resumed"
    )


class KeyBudgets(BaseModel):
    monthly_tokens: int | None
    daily_tokens: int | None
    monthly_input_tokens: int | None
    monthly_output_tokens: int | None


class ApiKeyView(BaseModel):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str | None
    prefix: str = Field(description="The visible start of the secret; never the secret")
    state: Literal["active", "paused", "revoked"]
    scopes: list[str]
    budgets: KeyBudgets
    month_spend: int = Field(ge=0, description="Tokens settled this UTC month")
    created_at: int | None = Field(description="Unix seconds")
    last_used_at: int | None = Field(
        description="Unix seconds of the key's last request that reached admission"
    )
    revoked_at: int | None = Field(description="Unix seconds")


class CreatedApiKey(ApiKeyView):
    key: str | None = Field(
        description="The secret, shown this once: only its hash is kept (a resent create with "
        "its Idempotency-Key shows it again; null if the seal cannot be opened)"
    )


class ApiKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApiKeyView]
