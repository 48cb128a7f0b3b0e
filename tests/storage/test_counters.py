"""The Hold, clamping, slots and starts on both counters backends (embedded and real Redis).

Also a completion job's admission: its start alone at submit (take_start), then its run without a
start and without clamping (count_start=False, allow_clamp=False).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone

import pytest

from tests.services import REDIS_URL
from tests.storage.helpers import principal
from vllm_acs.storage.counters import AdmitRequest, Counters, TrafficInUse
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


def _day() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


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


# A completion job: its start is taken at submit (take_start), its run is admitted without one and
# without clamping (count_start=False, allow_clamp=False).


def test_a_jobs_run_neither_checks_nor_takes_a_start(make_counters: Factory):
    who = principal(starts_per_minute=2)

    async def body(counters: Counters) -> None:
        await counters.take_start(who)
        await counters.take_start(who)
        with pytest.raises(StartsExhausted):
            await counters.admit(AdmitRequest(who, 1, 1, 1))
        # The window is full, yet the jobs' runs are admitted, and again: none takes a start.
        for _ in range(3):
            ticket = await counters.admit(AdmitRequest(who, 1, 1, 1, count_start=False))
            assert ticket.running and ticket.applied_max_tokens == 1
            await counters.settle(ticket, 1, 1)
        with pytest.raises(StartsExhausted) as limited:
            await counters.take_start(who)
        assert 59_000 <= limited.value.retry_after_ms <= 60_001
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_runs_without_a_start_leave_the_window_to_submits(make_counters: Factory):
    who = principal(starts_per_minute=1, max_running=1, max_waiting=1)

    async def body(counters: Counters) -> None:
        running = await counters.admit(AdmitRequest(who, 1, 1, 1, count_start=False))
        waiting = await counters.admit(AdmitRequest(who, 1, 1, 1, count_start=False))
        # The slot and the queue work as for any request.
        assert (running.running, waiting.running) == (True, False)
        with pytest.raises(QueueFull):
            await counters.admit(AdmitRequest(who, 1, 1, 1, count_start=False))
        await counters.take_start(who)
        with pytest.raises(StartsExhausted) as limited:
            await counters.take_start(who)
        assert limited.value.retry_after_ms > 0
        await counters.settle(running, 1, 1)
        await asyncio.wait_for(counters.wait_for_slot(waiting), 5)
        await counters.settle(waiting, 1, 1)
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_take_start_shares_the_window_with_admit(make_counters: Factory):
    who = principal(starts_per_minute=2)

    async def body(counters: Counters) -> None:
        await counters.settle(await counters.admit(AdmitRequest(who, 1, 1, 1)), 1, 1)
        await counters.take_start(who)
        with pytest.raises(StartsExhausted):
            await counters.take_start(who)
        with pytest.raises(StartsExhausted):
            await counters.admit(AdmitRequest(who, 1, 1, 1))
        # A start belongs to the key: another key's window is its own.
        await counters.take_start(principal("key_other", starts_per_minute=2))
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_a_job_refuses_where_a_request_would_be_clamped(make_counters: Factory):
    who = principal(monthly_tokens=100, daily_tokens=1000, starts_per_minute=2)
    counter = f"key:key_t:month:{_month()}"

    async def body(counters: Counters) -> None:
        # 100 - 40 settled - 10 prompt = 50 left for 3 choices: 16 each, not 17.
        with pytest.raises(BudgetExhausted) as refused:
            await counters.admit(AdmitRequest(who, 10, 3, 17, allow_clamp=False))
        assert refused.value.budget == "key_monthly"
        # The refusal says what would fit, for the message that tells the caller.
        assert (refused.value.fits, refused.value.asked) == (16, 17)
        # Nothing held, no slot, no start taken.
        assert await counters.committed(counter) == 40
        assert await counters.committed(f"key:key_t:day:{_day()}") == 0
        assert await counters.slots("key_t") == (0, 0)
        # What fits in full passes, unclamped; the default clamps as before.
        ticket = await counters.admit(AdmitRequest(who, 10, 3, 16, allow_clamp=False))
        assert ticket.applied_max_tokens == 16
        assert await counters.committed(counter) == 40 + 10 + 48
        await counters.settle(ticket, 0, 0)  # refused by the engine: nothing charged
        clamped = await counters.admit(AdmitRequest(who, 10, 3, 17))
        assert clamped.applied_max_tokens == 16
        await counters.settle(clamped, 10, 30)
        assert await counters.committed(counter) == 40 + 10 + 30

    _run(make_counters, body, **{counter: 40})


@pytest.mark.parametrize(
    ("limits", "budget"),
    [
        ({"daily_tokens": 14}, "key_daily"),
        ({"monthly_output_tokens": 9}, "key_monthly_output"),
        ({"account_monthly_tokens": 14}, "account_monthly"),
        # The first budget short of the full max_tokens is named, even where a later one could
        # not hold one token (the default names that later one: it is what refuses a clamp).
        ({"monthly_tokens": 14, "monthly_input_tokens": 4}, "key_monthly"),
    ],
)
def test_a_jobs_refusal_names_the_budget(make_counters: Factory, limits: dict, budget: str):
    async def body(counters: Counters) -> None:
        with pytest.raises(BudgetExhausted) as refused:
            await counters.admit(AdmitRequest(principal(**limits), 5, 1, 10, allow_clamp=False))
        assert refused.value.budget == budget
        # Each named budget holds 9 of the 10 output tokens asked (after the 5 prompt tokens).
        assert (refused.value.fits, refused.value.asked) == (9, 10)
        assert await counters.slots("key_t") == (0, 0)

    _run(make_counters, body)


def test_a_jobs_refusal_holds_nothing_on_any_budget(make_counters: Factory):
    who = principal(monthly_tokens=1000, daily_tokens=1000, monthly_output_tokens=5)
    month = _month()

    async def body(counters: Counters) -> None:
        # key_monthly and key_daily fit; key_monthly_output, later in the order, does not.
        with pytest.raises(BudgetExhausted) as refused:
            await counters.admit(AdmitRequest(who, 5, 1, 10, allow_clamp=False))
        assert refused.value.budget == "key_monthly_output"
        for counter in (f"key:key_t:month:{month}", f"key:key_t:day:{_day()}"):
            assert await counters.committed(counter) == 0
        ticket = await counters.admit(AdmitRequest(who, 5, 1, 5, allow_clamp=False))
        assert ticket.applied_max_tokens == 5
        assert await counters.committed(f"key:key_t:month-out:{month}") == 5
        await counters.settle(ticket, 5, 5)

    _run(make_counters, body)


def test_budget_state_splits_committed_into_settled_and_held(make_counters: Factory):
    """What GET /v1/usage reads: the Hold of requests in flight apart from what is settled, on
    the counters admission decides on; a counter never used is the database's settled tokens."""
    who = principal(monthly_tokens=1000, monthly_input_tokens=900)
    month = _month()
    total, inputs = f"key:key_t:month:{month}", f"key:key_t:month-in:{month}"
    unused = f"key:key_t:day:{_day()}"

    async def body(counters: Counters) -> None:
        first = await counters.admit(AdmitRequest(who, prompt_tokens=10, choices=2, max_tokens=50))
        second = await counters.admit(AdmitRequest(who, prompt_tokens=5, choices=1, max_tokens=20))
        state = await counters.budget_state([total, inputs, unused])
        assert (state[total].committed, state[total].held) == (7 + 110 + 25, 110 + 25)
        assert (state[inputs].settled, state[inputs].held) == (3, 15)
        assert (state[unused].committed, state[unused].held) == (4, 0)
        await counters.settle(first, 10, 30)
        state = await counters.budget_state([total])
        assert (state[total].settled, state[total].held) == (7 + 40, 25)
        await counters.settle(second, 5, 0)  # e.g. an error answer: charged nothing
        state = await counters.budget_state([total, inputs])
        assert (state[total].settled, state[total].held) == (7 + 40 + 5, 0)
        assert (state[inputs].settled, state[inputs].held) == (3 + 10 + 5, 0)

    _run(make_counters, body, **{total: 7, inputs: 3, unused: 4})


def test_traffic_counts_running_waiting_and_starts(make_counters: Factory):
    who = principal(max_running=1, max_waiting=2)

    async def body(counters: Counters) -> None:
        assert await counters.traffic("key_t") == TrafficInUse(0, 0, 0)
        running = await counters.admit(AdmitRequest(who, 1, 1, 1))
        waiting = await counters.admit(AdmitRequest(who, 1, 1, 1))
        assert await counters.traffic("key_t") == TrafficInUse(1, 1, 2)
        await counters.settle(waiting, 0, 0)
        await counters.settle(running, 1, 1)
        assert await counters.traffic("key_t") == TrafficInUse(0, 0, 2)

    _run(make_counters, body)
