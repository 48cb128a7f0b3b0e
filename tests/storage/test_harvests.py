"""Harvest submits on SQLite and PostgreSQL with an explicit clock: one not ended per key, the
deployment's capacity, the monthly quota (counted per UTC month, kept whatever the retention), the
idempotency answer in the same transaction, and nothing written by a refused submit; concurrent
submits never overshoot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.storage.helpers import migrated_engine
from vllm_acs.states import JobStatus
from vllm_acs.storage.errors import HarvestLimitReached
from vllm_acs.storage.harvests import HARVEST_KIND, HarvestRepository
from vllm_acs.storage.idempotency import IdempotencyRecords, IdempotencyTarget, Reserved
from vllm_acs.storage.jobs import JobRepository, NewJob, StoredAnswer
from vllm_acs.storage.tables import jobs

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=timezone.utc)
Body = Callable[[HarvestRepository, JobRepository, AsyncEngine], Awaitable[None]]
LIMITS = {"per_key": 1, "capacity": 3, "monthly_quota": None}


def new(key: str = "key_a") -> NewJob:
    return NewJob(HARVEST_KIND, key, "acct_" + key, "tiny", {"layers": [1]})


def _run(database_url: str, body: Body) -> None:
    async def main() -> None:
        async with migrated_engine(database_url) as engine:
            await body(HarvestRepository(engine), JobRepository(engine), engine)

    asyncio.run(main())


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(jobs))).scalar_one())


async def _submit(repo: HarvestRepository, job: NewJob, now: datetime, **limits) -> None:
    await repo.submit(job, now, **{**LIMITS, **limits}, idempotency=None, answer=None)


def test_one_harvest_not_ended_per_key(database_url: str):
    async def body(repo: HarvestRepository, jobs_repo: JobRepository, engine) -> None:
        first = new()
        await _submit(repo, first, T0)
        with pytest.raises(HarvestLimitReached) as refused:
            await _submit(repo, new(), T0)
        assert refused.value.limit == "concurrency"
        await _submit(repo, new("key_b"), T0)  # another key is not held back
        assert await _count(engine) == 2
        # Once the first ended, the key may submit again.
        await jobs_repo.cancel(first.id, "key_a", T0)
        await _submit(repo, new(), T0)
        assert await _count(engine) == 3

    _run(database_url, body)


def test_the_deployment_capacity(database_url: str):
    async def body(repo: HarvestRepository, _jobs: JobRepository, engine) -> None:
        for key in ("key_a", "key_b", "key_c"):
            await _submit(repo, new(key), T0)
        with pytest.raises(HarvestLimitReached) as refused:
            await _submit(repo, new("key_d"), T0)
        assert (refused.value.limit, refused.value.value) == ("capacity", 3)
        assert await _count(engine) == 3

    _run(database_url, body)


def test_the_monthly_quota_counts_per_utc_month(database_url: str):
    async def body(repo: HarvestRepository, jobs_repo: JobRepository, _engine) -> None:
        for day in range(2):
            job = new()
            await _submit(repo, job, T0 + timedelta(days=day * 0.01), monthly_quota=2)
            await jobs_repo.cancel(job.id, "key_a", T0)
        with pytest.raises(HarvestLimitReached) as refused:
            await _submit(repo, new(), T0, monthly_quota=2)
        assert refused.value.limit == "quota"
        # Retention deleting the rows forgets nothing of the month's count.
        await jobs_repo.sweep(T0 + timedelta(days=8))
        with pytest.raises(HarvestLimitReached):
            await _submit(repo, new(), T0 + timedelta(days=8), monthly_quota=2)
        assert await repo.used_this_month("key_a", T0) == 2
        # December is a new month.
        await _submit(
            repo, new(), datetime(2026, 12, 1, 0, 0, 1, tzinfo=timezone.utc), monthly_quota=2
        )

    _run(database_url, body)


def test_the_idempotency_answer_is_stored_with_the_job(database_url: str):
    async def body(repo: HarvestRepository, jobs_repo: JobRepository, engine) -> None:
        records = IdempotencyRecords(engine)
        target = IdempotencyTarget("key_a", "h-1")
        assert isinstance(await records.reserve(target, "/v1/harvest", "fp", T0, 120), Reserved)
        job = new()
        answer = StoredAnswer(202, '{"job_id": "x"}', {"location": "/v1/harvest/x"})
        await repo.submit(job, T0, **LIMITS, idempotency=target, answer=answer)
        found = await records.reserve(target, "/v1/harvest", "fp", T0, 120)
        assert found.state == "done" and found.answer == answer
        stored = await jobs_repo.get(job.id, "key_a")
        assert stored is not None and stored.status is JobStatus.QUEUED

    _run(database_url, body)


def test_concurrent_submits_of_one_key_never_overshoot(database_url: str):
    async def body(repo: HarvestRepository, _jobs: JobRepository, engine) -> None:
        results = await asyncio.gather(
            *(_submit(repo, new(), T0) for _ in range(8)), return_exceptions=True
        )
        assert sum(r is None for r in results) == 1
        assert all(isinstance(r, HarvestLimitReached) for r in results if r is not None)
        assert await _count(engine) == 1

    _run(database_url, body)
