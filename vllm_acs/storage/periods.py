"""UTC budget periods and the names of the counters each budget of a key lives under.

Pure, used by the counters backends and the usage ledger (API server process). A counter name
carries its period (`key:<id>:month:2026-11`), so budgets reset at the period boundary without
any job running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from ..auth.principal import Principal

# "requests" counts activation requests, one unit each, not tokens.
BudgetKind = Literal["total", "input", "output", "requests"]
# The line of the monthly activation quota: refused as activation_quota_exceeded, not as a budget.
ACTIVATION_QUOTA = "key_monthly_activations"

# The messages name the budget that refused, as the spec's Budget-cap recovery page lists them.
BUDGET_MESSAGES: dict[str, str] = {
    "key_monthly": "Monthly token budget exhausted for this API key.",
    "account_monthly": "Monthly token budget exhausted for this user (aggregate across keys).",
    "key_daily": "Daily token budget exhausted for this API key.",
    "key_monthly_input": "Monthly input-token budget exhausted for this API key.",
    "key_monthly_output": "Monthly output-token budget exhausted for this API key.",
}
# The same budgets in a sentence that says how much of one is left.
BUDGET_NAMES: dict[str, str] = {
    "key_monthly": "this API key's monthly token budget",
    "account_monthly": "this user's monthly token budget (aggregate across keys)",
    "key_daily": "this API key's daily token budget",
    "key_monthly_input": "this API key's monthly input-token budget",
    "key_monthly_output": "this API key's monthly output-token budget",
}


@dataclass(frozen=True)
class BudgetLine:
    """One budget a request is held against: its counter (without period), limit and kind."""

    name: str
    counter: str
    granularity: Literal["month", "day"]
    kind: BudgetKind
    limit: int


def month_of(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m")


def day_of(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d")


def counter_with_period(line_counter: str, granularity: str, moment: datetime) -> str:
    period = month_of(moment) if granularity == "month" else day_of(moment)
    return f"{line_counter}:{period}"


def key_monthly_counter(key_id: str) -> str:
    """The counter of a key's monthly tokens, before its period (`key:<id>:month`)."""
    return f"key:{key_id}:month"


def all_lines(key_id: str, account_id: str) -> list[tuple[str, str, str, BudgetKind]]:
    """(name, counter, granularity, kind) of every budget a key's usage counts against."""
    return [
        ("key_monthly", key_monthly_counter(key_id), "month", "total"),
        ("key_daily", f"key:{key_id}:day", "day", "total"),
        ("key_monthly_input", f"key:{key_id}:month-in", "month", "input"),
        ("key_monthly_output", f"key:{key_id}:month-out", "month", "output"),
        ("account_monthly", f"account:{account_id}:month", "month", "total"),
        # Last: a token budget that refuses is named first (the quota is checked after it).
        (ACTIVATION_QUOTA, f"key:{key_id}:month-act", "month", "requests"),
    ]


def line_limits(principal: Principal, *, activation: bool) -> dict[str, int | None]:
    """Each budget line's limit for `principal` (None: no cap); the activation quota's only when
    `activation`."""
    limits = principal.limits
    return {
        "key_monthly": limits.monthly_tokens,
        "key_daily": limits.daily_tokens,
        "key_monthly_input": limits.monthly_input_tokens,
        "key_monthly_output": limits.monthly_output_tokens,
        "account_monthly": limits.account_monthly_tokens,
        ACTIVATION_QUOTA: limits.monthly_activation_requests if activation else None,
    }


def budget_lines(principal: Principal, *, activation: bool = False) -> list[BudgetLine]:
    """The budgets that apply to `principal` (those with a limit), in the order they are named;
    the activation quota only for an activation request."""
    by_name = line_limits(principal, activation=activation)
    return [
        BudgetLine(name, counter, granularity, kind, by_name[name])  # type: ignore[arg-type]
        for name, counter, granularity, kind in all_lines(principal.key_id, principal.account_id)
        if by_name[name] is not None
    ]


def reservation(kind: BudgetKind, prompt_tokens: int, output_tokens: int) -> int:
    """What a request with this usage costs one budget. An activation request keeps its unit
    once the engine worked on it (any usage): one refused before the engine ran costs nothing."""
    if kind == "requests":
        return 1 if prompt_tokens + output_tokens > 0 else 0
    if kind == "input":
        return prompt_tokens
    if kind == "output":
        return output_tokens
    return prompt_tokens + output_tokens


def hold(kind: BudgetKind, prompt_tokens: int, output_tokens: int) -> int:
    """What admission holds on one budget: the most the request may cost it."""
    return 1 if kind == "requests" else reservation(kind, prompt_tokens, output_tokens)


def max_tokens_that_fit(
    lines: list[tuple[BudgetLine, int]], prompt_tokens: int, choices: int, max_tokens: int
) -> tuple[int, str | None]:
    """The largest max_tokens <= `max_tokens` that every (line, committed) pair admits.

    Returns (applied, None), or (0, name of the first budget that cannot hold one token per choice).
    """
    applied = max_tokens
    for line, committed in lines:
        available = line.limit - committed
        if line.kind == "requests":
            fits = max_tokens if available >= 1 else 0
        elif line.kind == "input":
            fits = max_tokens if prompt_tokens <= available else 0
        elif line.kind == "output":
            fits = max(0, available) // choices
        else:
            fits = max(0, available - prompt_tokens) // choices
        if fits < 1:
            return 0, line.name
        applied = min(applied, fits)
    return applied, None
