"""The answer of GET /v1/usage (also its OpenAPI schema). API server process. Pure pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Budget(BaseModel):
    name: str = Field(
        description="key_monthly, key_daily, key_monthly_input, key_monthly_output, "
        "account_monthly, key_monthly_activations: the name a 429 names"
    )
    unit: Literal["tokens", "requests"]
    counts: Literal["total", "input", "output", "requests"] = Field(
        description="total: prompt + completion tokens; input: prompt; output: completion"
    )
    limit: int | None = Field(description="null: no such cap on this key")
    spent: int = Field(ge=0, description="Settled this period")
    held: int | None = Field(
        description="Reserved now by requests in flight (their prompt plus worst-case output); "
        "null where no limit applies (nothing is held then)"
    )
    remaining: int | None = Field(description="limit - spent - held; null: no limit")
    resets_at: int = Field(description="Unix seconds: the next UTC midnight or 1st of a month")


class DayUsage(BaseModel):
    date: str = Field(description="The UTC day, YYYY-MM-DD")
    model: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    activation_requests: int


class ModelUsage(BaseModel):
    model: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TrafficUse(BaseModel):
    max_running: int
    running: int = Field(ge=0)
    max_waiting: int
    waiting: int = Field(ge=0)
    starts_per_minute: int
    starts_last_minute: int = Field(ge=0)


class UsageReport(BaseModel):
    object: Literal["usage"] = "usage"
    key_id: str
    key_prefix: str
    account_id: str
    period: str = Field(description="The UTC month, YYYY-MM")
    generated_at: int = Field(description="Unix seconds")
    budgets: list[Budget]
    activation_requests: Budget
    models: list[ModelUsage] = Field(description="This month's tokens per model")
    days: list[DayUsage] = Field(description="This month's tokens per UTC day and model")
    traffic: TrafficUse
