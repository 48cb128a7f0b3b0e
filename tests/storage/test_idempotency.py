"""Idempotency records on SQLite and PostgreSQL with an explicit clock: reserve (one winner under
concurrency), complete, release, abandon, a lease that passes (no_answer), renew, retention."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone

from sqlalchemy.ext.asyncio import AsyncEngine

from tests.storage.helpers import migrated_engine
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.idempotency import (
    Existing,
    IdempotencyRecords,
    IdempotencyTarget,
    Reserved,
    StoredAnswer,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
ROUTE = "/v1/completion-jobs"
FP = "f" * 64
TARGET = IdempotencyTarget("key_a", "retry-me-1")
ANSWER = StoredAnswer(202, '{"id":"job_1","status":"queued"}', {"location": "/v1/x/job_1"})
Body = Callable[[IdempotencyRecords, AsyncEngine], Awaitable[None]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _run(database_url: str, body: Body) -> None:
    async def main() -> None:
        async with migrated_engine(database_url) as engine:
            await body(IdempotencyRecords(engine), engine)

    asyncio.run(main())


def test_reserve_then_complete_replays_the_answer(database_url: str):
    async def body(records: IdempotencyRecords, _engine: AsyncEngine) -> None:
        assert await records.get(TARGET, T0) is None
        assert await records.reserve(TARGET, ROUTE, FP, T0, 30) == Reserved(TARGET)
        again = await records.reserve(TARGET, ROUTE, "0" * 64, at(1), 30)
        assert again == Existing(FP, "running", None, None, ROUTE, lease_expires_at=at(30))
        # Keys are scoped to the API key that sent them.
        other = IdempotencyTarget("key_b", TARGET.idempotency_key)
        assert await records.reserve(other, ROUTE, FP, at(1), 30) == Reserved(other)

        await records.complete(TARGET, ANSWER, at(2), job_id="job_1")
        done = await records.reserve(TARGET, ROUTE, FP, at(3), 30)
        assert done == Existing(FP, "done", ANSWER, "job_1", ROUTE)
        assert await records.get(TARGET, at(3)) == done
        # A done record is final: neither a second complete, an abandon nor a release touch it.
        await records.complete(TARGET, StoredAnswer(500, "{}", {}), at(4))
        await records.abandon(TARGET)
        await records.release(TARGET)
        assert await records.get(TARGET, at(5)) == done
        # The lease no longer matters once the answer is stored.
        assert await records.get(TARGET, at(10_000)) == done

    _run(database_url, body)


def test_concurrent_reserves_have_exactly_one_winner(database_url: str):
    async def body(records: IdempotencyRecords, _engine: AsyncEngine) -> None:
        other_engine = create_engine(database_url)
        try:
            nodes = [records, IdempotencyRecords(other_engine)]
            outcomes = await asyncio.gather(
                *(
                    nodes[i % 2].reserve(TARGET, ROUTE, f"{i:064d}", at(i / 1000), 30)
                    for i in range(20)
                )
            )
        finally:
            await other_engine.dispose()
        winners = [o for o in outcomes if isinstance(o, Reserved)]
        assert len(winners) == 1
        (record,) = {o.fingerprint for o in outcomes if isinstance(o, Existing)}
        stored = await records.get(TARGET, at(1))
        assert stored is not None and stored.state == "running" and stored.fingerprint == record

    _run(database_url, body)


def test_release_stores_nothing_and_abandon_answers_no_answer(database_url: str):
    async def body(records: IdempotencyRecords, _engine: AsyncEngine) -> None:
        await records.reserve(TARGET, ROUTE, FP, T0, 30)
        await records.release(TARGET)  # refused before it started (400, 401, 429)
        assert await records.get(TARGET, at(1)) is None
        assert await records.reserve(TARGET, ROUTE, "1" * 64, at(1), 30) == Reserved(TARGET)

        await records.abandon(TARGET)  # started, then ended without an answer to store
        gone = await records.reserve(TARGET, ROUTE, "1" * 64, at(2), 30)
        assert gone == Existing("1" * 64, "no_answer", None, None, ROUTE)
        await records.complete(TARGET, ANSWER, at(3))  # too late: it stays no_answer
        assert (await records.get(TARGET, at(4))).state == "no_answer"
        await records.release(TARGET)
        assert (await records.get(TARGET, at(4))).state == "no_answer"

    _run(database_url, body)


def test_a_running_record_past_its_lease_reads_as_no_answer(database_url: str):
    async def body(records: IdempotencyRecords, _engine: AsyncEngine) -> None:
        await records.reserve(TARGET, ROUTE, FP, T0, 30)
        assert (await records.get(TARGET, at(30))).state == "running"  # at the lease's end
        late = await records.reserve(TARGET, ROUTE, FP, at(30.001), 30)
        assert late == Existing(FP, "no_answer", None, None, ROUTE)
        assert not await records.renew(TARGET, at(31), 30)  # a passed lease stays passed

        other = IdempotencyTarget("key_a", "long-work")
        await records.reserve(other, ROUTE, FP, T0, 30)
        assert await records.renew(other, at(29), 30)
        held = await records.get(other, at(58))
        assert held.state == "running" and held.lease_expires_at == at(59)
        # The holder finishing after its lease still stores the answer for the next retry.
        await records.complete(other, ANSWER, at(70))
        assert (await records.get(other, at(71))).answer == ANSWER
        assert not await records.renew(other, at(72), 30)

    _run(database_url, body)


def test_a_record_past_its_retention_is_gone_before_and_after_the_sweep(database_url: str):
    week = timedelta(days=7)

    async def body(records: IdempotencyRecords, _engine: AsyncEngine) -> None:
        kept = IdempotencyTarget("key_a", "kept")
        await records.reserve(TARGET, ROUTE, FP, T0, 30)
        await records.complete(TARGET, ANSWER, T0, retention=week)
        await records.reserve(kept, ROUTE, FP, T0, 30, retention=2 * week)
        assert (await records.reserve(TARGET, ROUTE, "2" * 64, T0 + week, 30)).state == "done"
        # Past its retention the key is free again, even before a sweep deleted the record.
        after = T0 + week + timedelta(microseconds=1)
        assert await records.reserve(TARGET, ROUTE, "2" * 64, after, 30) == Reserved(TARGET)
        assert await records.delete_expired(after) == 0
        assert await records.delete_expired(after + week) == 1  # `kept`, at 2 weeks
        assert await records.get(kept, after) is None
        assert (await records.get(TARGET, after)).fingerprint == "2" * 64

    _run(database_url, body)
