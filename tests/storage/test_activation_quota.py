"""The per-key monthly activation quota on every database and counters backend: exact under
concurrency, checked after the token budgets, released before the engine ran, reset by month."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.services import REDIS_URL
from tests.storage.helpers import approved_key, principal, settings_for
from vllm_acs.auth.principal import Principal
from vllm_acs.storage import Storage, open_storage
from vllm_acs.storage.counters import AdmitRequest, Ticket
from vllm_acs.storage.errors import BudgetExhausted, StorageError
from vllm_acs.storage.periods import ACTIVATION_QUOTA, month_of
from vllm_acs.storage.usage import UsageRow

Body = Callable[[Storage, Principal], Awaitable[None]]


@pytest.fixture(params=["embedded", "redis"])
def counters_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "embedded":
        return {}
    return {"redis_url": REDIS_URL, "redis_prefix": request.getfixturevalue("redis_prefix")}


def _run(
    database_url: str, settings: dict[str, Any], quota: int, body: Body, **limits: Any
) -> None:
    async def main() -> None:
        storage = await open_storage(settings_for(database_url, **settings), upgrade_schema=True)
        try:
            key, _ = await approved_key(storage, monthly_activation_requests=quota)
            who = principal(
                key.id,
                key.account_id,
                monthly_activation_requests=quota,
                max_running=100,
                max_waiting=100,
                **limits,
            )
            await body(storage, who)
        finally:
            await storage.close()

    asyncio.run(main())


def _activation(who: Principal, *, activation: bool = True) -> AdmitRequest:
    return AdmitRequest(who, prompt_tokens=4, choices=1, max_tokens=8, activation=activation)


def _counter(who: Principal, moment: datetime | None = None) -> str:
    return f"key:{who.key_id}:month-act:{month_of(moment or datetime.now(timezone.utc))}"


def _row(who: Principal, units: int, moment: datetime) -> UsageRow:
    return UsageRow(
        route="/v1/completions",
        status=200,
        latency_ms=1,
        prompt_tokens=4,
        completion_tokens=8,
        key_id=who.key_id,
        key_prefix=who.key_prefix,
        account_id=who.account_id,
        activation_requests=units,
        created_at=moment,
    )


def test_twenty_concurrent_admissions_take_exactly_the_quota(
    database_url: str, counters_settings: dict[str, Any]
):
    async def body(storage: Storage, who: Principal) -> None:
        async def one() -> Ticket | StorageError:
            try:
                return await storage.counters.admit(_activation(who))
            except StorageError as refused:
                return refused

        results = await asyncio.gather(*(one() for _ in range(20)))
        tickets = [r for r in results if isinstance(r, Ticket)]
        refused = [r for r in results if not isinstance(r, Ticket)]
        assert len(tickets) == 3
        assert all(isinstance(r, BudgetExhausted) and r.budget == ACTIVATION_QUOTA for r in refused)
        assert await storage.counters.committed(_counter(who)) == 3
        # A plain completion never counts against the quota.
        plain = await storage.counters.admit(_activation(who, activation=False))
        for ticket in tickets:
            storage.counters.report_progress(ticket, 4, 0)
            await storage.counters.settle(ticket, 4, 8)
        await storage.counters.settle(plain, 4, 8)
        assert await storage.counters.committed(_counter(who)) == 3
        with pytest.raises(BudgetExhausted):
            await storage.counters.admit(_activation(who))

    _run(database_url, counters_settings, 3, body)


def test_a_unit_comes_back_unless_the_engine_ran(
    database_url: str, counters_settings: dict[str, Any]
):
    async def body(storage: Storage, who: Principal) -> None:
        # Refused before the engine ran (no progress, no usage): the unit is released.
        ticket = await storage.counters.admit(_activation(who))
        assert await storage.counters.committed(_counter(who)) == 1
        await storage.counters.settle(ticket, 0, 0)
        assert await storage.counters.committed(_counter(who)) == 0
        # Reached the engine, then an error answer (no usage): the unit stays used.
        ticket = await storage.counters.admit(_activation(who))
        storage.counters.report_progress(ticket, 4, 0)
        await storage.counters.settle(ticket, 0, 0)
        assert await storage.counters.committed(_counter(who)) == 1
        with pytest.raises(BudgetExhausted) as refused:
            await storage.counters.admit(_activation(who))
        assert refused.value.budget == ACTIVATION_QUOTA

    _run(database_url, counters_settings, 1, body)


def test_the_token_budget_is_named_before_the_quota(
    database_url: str, counters_settings: dict[str, Any]
):
    async def body(storage: Storage, who: Principal) -> None:
        with pytest.raises(BudgetExhausted) as refused:
            await storage.counters.admit(_activation(who))
        assert refused.value.budget == "key_monthly"
        assert await storage.counters.committed(_counter(who)) == 0

    _run(database_url, counters_settings, 0, body, monthly_tokens=2)


def test_settled_units_persist_and_reset_by_month(
    database_url: str, counters_settings: dict[str, Any]
):
    async def body(storage: Storage, who: Principal) -> None:
        now = datetime.now(timezone.utc)
        last_month = now.replace(day=1) - timedelta(days=1)
        # Last month's quota was used up: this month starts from zero, without any job.
        await storage.usage.insert([_row(who, 1, last_month), _row(who, 1, last_month)])
        ticket = await storage.counters.admit(_activation(who))
        await storage.counters.settle(ticket, 0, 0)
        # This month's settled units (as the ledger writes them) count, as does a plain row's 0.
        await storage.usage.insert([_row(who, 1, now), _row(who, 0, now), _row(who, 1, now)])
        settled = await storage.usage.read_settled([_counter(who), _counter(who, last_month)])
        assert settled == {_counter(who): 2, _counter(who, last_month): 2}

    _run(database_url, counters_settings, 2, body)


def test_a_fresh_node_starts_from_the_settled_units(
    database_url: str, counters_settings: dict[str, Any]
):
    async def body(storage: Storage, who: Principal) -> None:
        now = datetime.now(timezone.utc)
        await storage.usage.insert([_row(who, 1, now), _row(who, 1, now)])
        with pytest.raises(BudgetExhausted) as refused:
            await storage.counters.admit(_activation(who))
        assert refused.value.budget == ACTIVATION_QUOTA
        await storage.counters.settle(
            await storage.counters.admit(_activation(who, activation=False)), 1, 1
        )

    _run(database_url, counters_settings, 2, body)


def test_migration_0002_keeps_existing_keys_and_usage(database_url: str):
    from sqlalchemy import text

    from vllm_acs.storage.db import create_engine
    from vllm_acs.storage.migrate import upgrade

    async def main() -> None:
        engine = create_engine(database_url)
        try:
            assert await upgrade(engine, "0001") == "0001"
            now = datetime.now(timezone.utc)
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO accounts (id, name, status, spend_capped, created_at) "
                        "VALUES ('acct_old', 'old', 'approved', false, :now)"
                    ),
                    {"now": now},
                )
                await conn.execute(
                    text(
                        "INSERT INTO api_keys (id, account_id, prefix, secret_hash, state, "
                        "scopes, created_at) VALUES ('key_old', 'acct_old', 'acs-bm-old00000', "
                        "'00', 'active', 'completions', :now)"
                    ),
                    {"now": now},
                )
                await conn.execute(
                    text(
                        "INSERT INTO usage_rows (route, prompt_tokens, completion_tokens, status, "
                        "latency_ms, period, created_at) VALUES ('/v1/completions', 1, 2, 200, "
                        "3, '2026-11', :now)"
                    ),
                    {"now": now},
                )
            assert await upgrade(engine, "0002") == "0002"
        finally:
            await engine.dispose()
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            key = await storage.keys.get("key_old")
            assert key.monthly_activation_requests is None
            (row,) = await storage.usage.rows()
            assert row["activation_requests"] == 0
        finally:
            await storage.close()

    asyncio.run(main())
