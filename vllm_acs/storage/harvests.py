"""Harvest submits: the job row, under the harvest limits, with its idempotency answer and the
key's monthly harvest count, in one transaction. API server process (the harvest route).

The rest of a harvest's life is the generic job machinery's (storage/jobs.py).
"""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..states import ACTIVE
from .errors import HarvestLimitReached, IdempotencyRecordLost
from .idempotency import IdempotencyTarget, StoredAnswer, complete_on
from .job_records import Job, NewJob, insert_values, job_from_row
from .periods import month_of
from .tables import budget_counters, jobs
from .transactions import serialize_per_key, utc, write_transaction

HARVEST_KIND = "harvest"
_ACTIVE = sorted(s.value for s in ACTIVE)
# Serializes every harvest submit of the deployment for the capacity count (PostgreSQL; SQLite's
# one write lock does it already). Taken after the per-key lock, always in that order.
_CAPACITY_LOCK = "harvest-capacity"


def quota_counter(key_id: str, moment: datetime) -> str:
    """The budget-counter row that counts a key's harvests in one UTC month."""
    return f"key:{key_id}:month-harvests:{month_of(moment)}"


async def _unfinished(conn: AsyncConnection, key_id: str | None = None) -> int:
    query = select(func.count()).where(jobs.c.kind == HARVEST_KIND, jobs.c.status.in_(_ACTIVE))
    if key_id is not None:
        query = query.where(jobs.c.key_id == key_id)
    return int((await conn.execute(query)).scalar_one())


async def _used(conn: AsyncConnection, counter: str) -> int:
    query = select(budget_counters.c.used).where(budget_counters.c.counter == counter)
    return int((await conn.execute(query)).scalar_one_or_none() or 0)


async def _count_one(conn: AsyncConnection, counter: str) -> None:
    dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
    statement = dialect.insert(budget_counters).values(counter=counter, used=1)
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=[budget_counters.c.counter],
            set_={"used": budget_counters.c.used + 1},
        )
    )


class HarvestRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def submit(
        self,
        job: NewJob,
        now: datetime,
        *,
        per_key: int,
        capacity: int,
        monthly_quota: int | None,
        idempotency: IdempotencyTarget | None,
        answer: StoredAnswer | None,
    ) -> Job:
        """Inserts the queued harvest, or raises HarvestLimitReached (checked in the order
        concurrency, capacity, quota) having written nothing."""
        now = utc(now)
        values = insert_values(job, now)
        counter = quota_counter(job.key_id, now)
        async with write_transaction(self._engine) as conn:
            await serialize_per_key(conn, job.key_id)
            if await _unfinished(conn, job.key_id) >= per_key:
                raise HarvestLimitReached("concurrency", per_key)
            await serialize_per_key(conn, _CAPACITY_LOCK)
            if await _unfinished(conn) >= capacity:
                raise HarvestLimitReached("capacity", capacity)
            if monthly_quota is not None and await _used(conn, counter) >= monthly_quota:
                raise HarvestLimitReached("quota", monthly_quota)
            await conn.execute(jobs.insert().values(**values))
            await _count_one(conn, counter)
            done = idempotency is None or answer is None
            if not done:
                assert idempotency is not None and answer is not None
                done = await complete_on(conn, idempotency, answer, now, job_id=job.id)
            if not done:
                raise IdempotencyRecordLost("the idempotency record is no longer running")
        return job_from_row(SimpleNamespace(**values))

    async def unfinished(self, key_id: str) -> int:
        """The key's harvests not ended (a read; the submit counts again under its lock)."""
        async with self._engine.connect() as conn:
            return await _unfinished(conn, key_id)

    async def unfinished_in_deployment(self) -> int:
        """Every key's harvests not ended (a read; the submit counts again under its lock)."""
        async with self._engine.connect() as conn:
            return await _unfinished(conn)

    async def used_this_month(self, key_id: str, now: datetime) -> int:
        async with self._engine.connect() as conn:
            return await _used(conn, quota_counter(key_id, now))
