"""What `GET /v1/usage` tells a key about itself: every budget that applies to it (limit, spent,
held by requests in flight, remaining, resets at), this month's tokens per model and UTC day,
activation requests against their quota, and its traffic limits with what is in use now.

API server process; storage and the leaves only. A budget with a limit is read from the shared
counters that admission decides on (settled plus held, on Redis's or this process's books), so
the page shows exactly what the next request is checked against, on every node; a budget without
one is read from the ledger's settled counters (nothing holds against it).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from ..auth.principal import Principal
from ..storage.counters import Counters
from ..storage.periods import (
    ACTIVATION_QUOTA,
    all_lines,
    counter_with_period,
    line_limits,
    month_of,
)
from ..storage.usage import UsageRepository


def resets_at(granularity: str, now: datetime) -> datetime:
    """The start of the next UTC day or month."""
    now = now.astimezone(timezone.utc)
    if granularity == "day":
        return datetime(now.year, now.month, now.day, tzinfo=timezone.utc) + timedelta(days=1)
    if now.month == 12:
        return datetime(now.year + 1, 1, 1, tzinfo=timezone.utc)
    return datetime(now.year, now.month + 1, 1, tzinfo=timezone.utc)


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


async def usage_report(
    principal: Principal, counters: Counters, usage: UsageRepository, now: datetime
) -> dict[str, Any]:
    limits = principal.limits
    line_limit = line_limits(principal, activation=True)  # the report shows the quota too
    lines = [
        (name, counter_with_period(counter, granularity, now), granularity, kind)
        for name, counter, granularity, kind in all_lines(principal.key_id, principal.account_id)
    ]
    limited = [counter for name, counter, _, _ in lines if line_limit[name] is not None]
    live = await counters.budget_state(limited)
    settled = await usage.read_settled(c for _, c, _, _ in lines if c not in live)
    budgets: list[dict[str, Any]] = []
    activations: dict[str, Any] = {}
    for name, counter, granularity, kind in lines:
        limit = line_limit[name]
        if counter in live:
            state = live[counter]
            spent, held = state.settled, state.held
        else:
            spent, held = settled.get(counter, 0), None
        entry = {
            "name": name,
            "unit": "requests" if kind == "requests" else "tokens",
            "counts": kind,
            "limit": limit,
            "spent": spent,
            "held": held,
            "remaining": None if limit is None else max(0, limit - spent - (held or 0)),
            "resets_at": _unix(resets_at(granularity, now)),
        }
        if name == ACTIVATION_QUOTA:
            activations = entry
        else:
            budgets.append(entry)
    period = month_of(now)
    days = await usage.key_month_by_model_day(principal.key_id, period)
    traffic = await counters.traffic(principal.key_id)
    return {
        "object": "usage",
        "key_id": principal.key_id,
        "key_prefix": principal.key_prefix,
        "account_id": principal.account_id,
        "period": period,
        "generated_at": _unix(now),
        "budgets": budgets,
        "activation_requests": activations,
        "models": _per_model(days),
        "days": days,
        "traffic": {
            "max_running": limits.max_running,
            "running": traffic.running,
            "max_waiting": limits.max_waiting,
            "waiting": traffic.waiting,
            "starts_per_minute": limits.starts_per_minute,
            "starts_last_minute": traffic.starts_last_minute,
        },
    }


def _per_model(days: list[dict[str, Any]]) -> list[dict[str, Any]]:
    totals: dict[str | None, dict[str, Any]] = {}
    for day in days:
        row = totals.setdefault(
            day["model"],
            {"model": day["model"], "requests": 0, "prompt_tokens": 0, "completion_tokens": 0},
        )
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            row[field] += day[field]
    for row in totals.values():
        row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
    return sorted(totals.values(), key=lambda r: str(r["model"]))
