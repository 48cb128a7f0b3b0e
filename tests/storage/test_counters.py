"""The Hold, clamping, slots and starts on both counters backends (embedded and real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone

import pytest

from tests.services import REDIS_URL
from tests.storage.helpers import principal
from vllm_acs.storage.counters import AdmitRequest, Counters
from vllm_acs.storage.counters_embedded import EmbeddedCounters
from vllm_acs.storage.counters_redis import RedisCounters
from vllm_acs.storage.errors import BudgetExhausted, QueueFull, StartsExhausted

Factory = Callable[[dict[str, int]], Counters]


def _reader(settled: dict[str, int]) -> Callable[[Iterable[str]], Awaitable[dict[str, int]]]:
    async def read(counters: Iterable[str]) -> dict[str, int]:
        return {c: settled[c] for c in counters if c in settled}

    return read


@pytest.fixture(params=["embedded", "redis"])
def make_counters(request: pytest.FixtureRequest) -> Factory:
    if request.param == "embedded":
        return lambda settled: EmbeddedCounters(_reader(settled))
    prefix = request.getfixturevalue("redis_prefix")
    return lambda settled: RedisCounters.from_url(
        REDIS_URL, _reader(settled), prefix=prefix, lease_ms=5000
    )


def _month() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m")


def _run(make: Factory, body: Callable[[Counters], Awaitable[None]], **settled: int) -> None:
    async def main() -> None:
        counters = make(dict(settled))
        try:
            await body(counters)
        finally:
            await counters.close()

    asyncio.run(main())


def test_hold_reserves_worst_case_and_settle_charges_real_usage(make_counters: Factory):
    who = principal(monthly_tokens=1000, monthly_output_tokens=500)
    counter = f"key:key_t:month:{_month()}"

    async def body(counters: Counters) -> None:
        ticket = await counters.admit(AdmitRequest(who, prompt_tokens=10, choices=2, max_tokens=50))
        assert ticket.running and ticket.applied_max_tokens == 50
        assert await counters.committed(counter) == 110
        assert await counters.committed(f"key:key_t:month-out:{_month()}") == 100
        await counters.settle(ticket, 10, 30)
        await counters.settle(ticket, 10, 30)  # idempotent
        assert await counters.committed(counter) == 40
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_output_is_clamped_to_what_fits_per_choice(make_counters: Factory):
    who = principal(monthly_tokens=100, daily_tokens=1000)

    async def body(counters: Counters) -> None:
        # 100 - 40 already settled - 10 prompt = 50 left for 3 choices: 16 each.
        ticket = await counters.admit(AdmitRequest(who, prompt_tokens=10, choices=3, max_tokens=99))
        assert ticket.applied_max_tokens == 16
        assert await counters.committed(f"key:key_t:month:{_month()}") == 40 + 10 + 48
        with pytest.raises(BudgetExhausted) as refused:
            await counters.admit(AdmitRequest(who, prompt_tokens=2, choices=1, max_tokens=5))
        assert refused.value.budget == "key_monthly"
        await counters.settle(ticket, 10, 0)

    _run(make_counters, body, **{f"key:key_t:month:{_month()}": 40})


@pytest.mark.parametrize(
    ("limits", "budget"),
    [
        ({"daily_tokens": 5}, "key_daily"),
        ({"monthly_input_tokens": 5}, "key_monthly_input"),
        ({"monthly_output_tokens": 0}, "key_monthly_output"),
        ({"account_monthly_tokens": 6}, "account_monthly"),
    ],
)
def test_the_refusal_names_the_budget(make_counters: Factory, limits: dict, budget: str):
    async def body(counters: Counters) -> None:
        with pytest.raises(BudgetExhausted) as refused:
            await counters.admit(AdmitRequest(principal(**limits), 6, 1, 10))
        assert refused.value.budget == budget
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_a_new_period_starts_from_zero(make_counters: Factory):
    who = principal(monthly_tokens=10)

    async def body(counters: Counters) -> None:
        # Last month's counter is full; this month's is a different counter.
        ticket = await counters.admit(AdmitRequest(who, 2, 1, 8))
        assert ticket.applied_max_tokens == 8
        await counters.settle(ticket, 2, 8)

    _run(make_counters, body, **{"key:key_t:month:2000-01": 10})


def test_slots_queue_in_order_and_refuse_beyond_the_queue(make_counters: Factory):
    who = principal(max_running=1, max_waiting=2)

    async def body(counters: Counters) -> None:
        first = await counters.admit(AdmitRequest(who, 1, 1, 1))
        second = await counters.admit(AdmitRequest(who, 1, 1, 1))
        third = await counters.admit(AdmitRequest(who, 1, 1, 1))
        assert (first.running, second.running, third.running) == (True, False, False)
        assert await counters.slots("key_t") == (1, 2)
        with pytest.raises(QueueFull) as full:
            await counters.admit(AdmitRequest(who, 1, 1, 1))
        assert full.value.retry_after_ms > 0
        order: list[str] = []

        async def run(name: str, ticket) -> None:
            await counters.wait_for_slot(ticket)
            order.append(name)
            await counters.settle(ticket, 1, 1)

        tasks = [
            asyncio.create_task(run("third", third)),
            asyncio.create_task(run("second", second)),
        ]
        await asyncio.sleep(0.05)
        assert order == []
        await counters.settle(first, 1, 1)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == ["second", "third"]
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_a_waiter_that_gives_up_frees_its_place(make_counters: Factory):
    who = principal(max_running=1, max_waiting=1)

    async def body(counters: Counters) -> None:
        first = await counters.admit(AdmitRequest(who, 1, 1, 1))
        waiting = await counters.admit(AdmitRequest(who, 1, 1, 1))
        task = asyncio.create_task(counters.wait_for_slot(waiting))
        await asyncio.sleep(0.02)
        task.cancel()
        await counters.settle(waiting, 0, 0)
        assert await counters.slots("key_t") == (1, 0)
        await counters.settle(first, 0, 0)
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_starts_per_minute(make_counters: Factory):
    who = principal(starts_per_minute=3)

    async def body(counters: Counters) -> None:
        for _ in range(3):
            await counters.settle(await counters.admit(AdmitRequest(who, 1, 1, 1)), 1, 1)
        with pytest.raises(StartsExhausted) as limited:
            await counters.admit(AdmitRequest(who, 1, 1, 1))
        assert 59_000 <= limited.value.retry_after_ms <= 60_001

    _run(make_counters, body)


def test_redis_restarts_budget_counters_from_the_database(redis_prefix: str):
    """A counter Redis lost (restart, eviction) starts again from the settled tokens in SQL."""
    counter = f"key:key_t:month:{_month()}"
    settled = {counter: 90}

    async def body() -> None:
        counters = RedisCounters.from_url(
            REDIS_URL, _reader(settled), prefix=redis_prefix, lease_ms=5000
        )
        try:
            who = principal(monthly_tokens=100)
            ticket = await counters.admit(AdmitRequest(who, 1, 1, 50))
            assert ticket.applied_max_tokens == 9
            await counters.settle(ticket, 1, 9)
            assert await counters.committed(counter) == 100
            settled[counter] = 95  # what the ledger wrote so far
            await counters._redis.delete(f"{redis_prefix}:bud:{counter}")  # Redis lost it
            ticket = await counters.admit(AdmitRequest(who, 1, 1, 50))
            assert ticket.applied_max_tokens == 4
            await counters.settle(ticket, 1, 0)
        finally:
            await counters.close()

    asyncio.run(body())
