"""Usage rows and settled budget counters: written in one transaction, read for reports.

Used by the usage ledger's writer task (API server process) and by `vllm-acs usage`. A row holds
metadata only: never a prompt, a completion or a key secret.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .periods import all_lines, counter_with_period, month_of, reservation
from .tables import budget_counters, usage_rows
from .transactions import write_transaction

# The `X-Acs-Workload` values the spec names; any other value is recorded as none.
WORKLOADS = frozenset({"interactive", "batch"})


def recorded_workload(header: str | None) -> str | None:
    """What a usage row records for an `X-Acs-Workload` header: one of `WORKLOADS` (case and
    surrounding spaces ignored) or None. The spec ignores unrecognised values, so a long or odd
    one never reaches the `workload` column (a row the database refuses)."""
    if header is None or len(header) > 32:
        return None
    value = header.strip().lower()
    return value if value in WORKLOADS else None


@dataclass(frozen=True)
class UsageRow:
    route: str
    status: int
    latency_ms: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    request_id: str | None = None
    key_id: str | None = None
    key_prefix: str | None = None
    account_id: str | None = None
    model: str | None = None
    workload: str | None = None
    # 1 when an activation request used a unit of the key's monthly quota.
    activation_requests: int = 0
    # When the request was admitted: its tokens count in that UTC day and month.
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def counter_increments(rows: Iterable[UsageRow]) -> dict[str, int]:
    """Tokens each budget counter (full name, with period) gains from `rows`."""
    totals: dict[str, int] = collections.defaultdict(int)
    for row in rows:
        if row.key_id is None or row.account_id is None:
            continue
        for _, counter, granularity, kind in all_lines(row.key_id, row.account_id):
            if kind == "requests":
                amount = row.activation_requests
            else:
                amount = reservation(kind, row.prompt_tokens, row.completion_tokens)
            if amount:
                totals[counter_with_period(counter, granularity, row.created_at)] += amount
    return dict(totals)


def _upsert(dialect_name: str) -> Any:
    dialect = sqlite if dialect_name == "sqlite" else postgresql
    statement = dialect.insert(budget_counters)
    return statement.on_conflict_do_update(
        index_elements=[budget_counters.c.counter],
        set_={"used": budget_counters.c.used + statement.excluded.used},
    )


_UPSERTS = {name: _upsert(name) for name in ("sqlite", "postgresql")}


async def _add_to_counters(conn: AsyncConnection, increments: dict[str, int]) -> None:
    if not increments:
        return
    statement = _UPSERTS["sqlite" if conn.dialect.name == "sqlite" else "postgresql"]
    # A fixed order, so that two nodes flushing at once never deadlock on these rows.
    await conn.execute(
        statement, [{"counter": c, "used": n} for c, n in sorted(increments.items())]
    )


class UsageRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def insert(self, rows: Sequence[UsageRow]) -> None:
        """The rows and their budget counters, in one transaction: both or neither."""
        if not rows:
            return
        values = [{**asdict(row), "period": month_of(row.created_at)} for row in rows]
        async with write_transaction(self._engine) as conn:
            await conn.execute(usage_rows.insert(), values)
            await _add_to_counters(conn, counter_increments(rows))

    async def insert_once(self, row: UsageRow) -> bool:
        """The row and its counters unless a row with its `request_id` (and key and month) is
        there already: a step that may run again after a crash (a harvest's shard) is charged
        once. True when it was written now."""
        if row.request_id is None:
            raise ValueError("insert_once needs the row's request_id")
        period = month_of(row.created_at)
        values = {**asdict(row), "period": period}
        c = usage_rows.c
        present = select(c.id).where(
            c.key_id == row.key_id, c.period == period, c.request_id == row.request_id
        )
        async with write_transaction(self._engine) as conn:
            if (await conn.execute(present.limit(1))).first() is not None:
                return False
            await conn.execute(usage_rows.insert(), [values])
            await _add_to_counters(conn, counter_increments([row]))
        return True

    async def read_settled(self, counters: Iterable[str]) -> dict[str, int]:
        names = list(counters)
        if not names:
            return {}
        query = select(budget_counters.c.counter, budget_counters.c.used).where(
            budget_counters.c.counter.in_(names)
        )
        async with self._engine.connect() as conn:
            return {row.counter: int(row.used) for row in await conn.execute(query)}

    async def per_key_model_month(self, period: str | None = None) -> list[dict[str, Any]]:
        """Tokens and requests per (key, model, month), newest month first."""
        c = usage_rows.c
        return await self._monthly_totals(
            [c.account_id, c.key_id, c.key_prefix, c.model],
            [c.account_id, c.key_prefix, c.model],
            period,
        )

    async def per_account_month(self, period: str | None = None) -> list[dict[str, Any]]:
        """Tokens and requests per (account, month), newest month first."""
        c = usage_rows.c
        return await self._monthly_totals([c.account_id], [c.account_id], period)

    async def _monthly_totals(
        self, group: list[Any], order: list[Any], period: str | None
    ) -> list[dict[str, Any]]:
        c = usage_rows.c
        query = (
            select(
                c.period,
                *group,
                func.count().label("requests"),
                func.sum(c.prompt_tokens).label("prompt_tokens"),
                func.sum(c.completion_tokens).label("completion_tokens"),
            )
            .group_by(c.period, *group)
            .order_by(c.period.desc(), *order)
        )
        if period is not None:
            query = query.where(c.period == period)
        async with self._engine.connect() as conn:
            return [_totals(row._asdict()) for row in await conn.execute(query)]

    async def key_month_by_model_day(self, key_id: str, period: str) -> list[dict[str, Any]]:
        """One key's rows of a UTC month summed per (UTC day, model): requests, prompt and
        completion tokens, activation requests. Days in order, models by name."""
        c = usage_rows.c
        day = _utc_day(c.created_at, self._engine.dialect.name)
        query = (
            select(
                day.label("day"),
                c.model,
                func.count().label("requests"),
                func.sum(c.prompt_tokens).label("prompt_tokens"),
                func.sum(c.completion_tokens).label("completion_tokens"),
                func.sum(c.activation_requests).label("activation_requests"),
            )
            .where(c.key_id == key_id, c.period == period)
            .group_by(day, c.model)
            .order_by(day, c.model)
        )
        async with self._engine.connect() as conn:
            return [
                {
                    "date": str(row.day),
                    "model": row.model,
                    "requests": int(row.requests),
                    "prompt_tokens": int(row.prompt_tokens or 0),
                    "completion_tokens": int(row.completion_tokens or 0),
                    "activation_requests": int(row.activation_requests or 0),
                }
                for row in await conn.execute(query)
            ]

    async def days_across_accounts(
        self,
        period: str,
        *,
        account_id: str | None = None,
        key_id: str | None = None,
        model: str | None = None,
        workload: str | None = None,
        limit: int = 100_000,
    ) -> list[dict[str, Any]]:
        """A UTC month's rows summed per (UTC day, account, key, model, workload), filtered by
        what is given: the console's usage across accounts. Ordered by day, then the rest."""
        c = usage_rows.c
        day = _utc_day(c.created_at, self._engine.dialect.name)
        group = [day, c.account_id, c.key_id, c.key_prefix, c.model, c.workload]
        query = (
            select(
                day.label("day"),
                c.account_id,
                c.key_id,
                c.key_prefix,
                c.model,
                c.workload,
                func.count().label("requests"),
                func.sum(c.prompt_tokens).label("prompt_tokens"),
                func.sum(c.completion_tokens).label("completion_tokens"),
                func.sum(c.activation_requests).label("activation_requests"),
            )
            .where(c.period == period)
            .group_by(*group)
            .order_by(*group)
            .limit(limit)
        )
        for column, value in (
            (c.account_id, account_id),
            (c.key_id, key_id),
            (c.model, model),
            (c.workload, workload),
        ):
            if value is not None:
                query = query.where(column == value)
        async with self._engine.connect() as conn:
            return [
                {
                    "date": str(row.day),
                    "account_id": row.account_id,
                    "key_id": row.key_id,
                    "key_prefix": row.key_prefix,
                    "model": row.model,
                    "workload": row.workload,
                    "requests": int(row.requests),
                    "prompt_tokens": int(row.prompt_tokens or 0),
                    "completion_tokens": int(row.completion_tokens or 0),
                    "activation_requests": int(row.activation_requests or 0),
                }
                for row in await conn.execute(query)
            ]

    async def rows(self, limit: int = 1000) -> list[dict[str, Any]]:
        query = select(usage_rows).order_by(usage_rows.c.id.desc()).limit(limit)
        async with self._engine.connect() as conn:
            return [dict(row._mapping) for row in await conn.execute(query)]


def _utc_day(column: Any, dialect_name: str) -> Any:
    """The UTC date of a timestamp column: SQLite keeps UTC text; PostgreSQL converts a
    timestamptz to its session's zone unless told UTC."""
    if dialect_name == "postgresql":
        return func.date(func.timezone("UTC", column))
    return func.date(column)


def _totals(row: dict[str, Any]) -> dict[str, Any]:
    row["prompt_tokens"] = int(row["prompt_tokens"] or 0)
    row["completion_tokens"] = int(row["completion_tokens"] or 0)
    row["total_tokens"] = row["prompt_tokens"] + row["completion_tokens"]
    return row
