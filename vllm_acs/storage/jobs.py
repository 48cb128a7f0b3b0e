"""Durable jobs (completion jobs, harvests, Loom branches): submit, claim under a lease, renew,
finish, hand back, reap lost leases, cancel, retention. API server process (routes, job runner).
Times are the caller's `now`; a lease holder's writes are fenced on (id, attempt, owner, running).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam, case, delete, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..states import ACTIVE, TERMINAL, IllegalTransition, JobStatus, can_move
from .errors import IdempotencyRecordLost, JobCapacityReached
from .idempotency import RETENTION, IdempotencyTarget, StoredAnswer, complete_on, delete_expired_on
from .job_records import Job, NewJob, SweepReport, insert_values, job_from_row, new_job_id
from .tables import jobs
from .transactions import point_read, serialize_per_key, utc, write_transaction

__all__ = [
    "ATTEMPTS_EXHAUSTED",
    "Job",
    "JobEnd",
    "JobRepository",
    "NewJob",
    "StoredAnswer",
    "SweepReport",
    "new_job_id",
]

ATTEMPTS_EXHAUSTED = "job_attempts_exhausted"


@dataclass(frozen=True)
class JobEnd:
    """How a running job ended, for `finish_many`: fenced on (job_id, attempt, owner)."""

    job_id: str
    attempt: int
    owner: str
    status: JobStatus
    result_status: int | None = None
    result_body: str | None = None
    error_code: str | None = None


_ACTIVE = sorted(s.value for s in ACTIVE)
_TIME = jobs.c.created_at.type


# The statements of every submit and read, built once: building one per call (and computing its
# cache key) cost SQLAlchemy more than SQLite took to run it.
# A job's parts (a harvest's) are its own work, not more jobs of the key.
_COUNT_UNFINISHED = select(func.count()).where(
    jobs.c.key_id == bindparam("key_id"),
    jobs.c.status.in_(_ACTIVE),
    jobs.c.parent_id.is_(None),
)
_INSERT = jobs.insert()
_BY_ID = select(jobs).where(jobs.c.id == bindparam("job_id"))
_BY_ID_OF_KEY = _BY_ID.where(jobs.c.key_id == bindparam("key_id"))


async def _count_unfinished(conn: AsyncConnection, key_id: str) -> int:
    return int((await conn.execute(_COUNT_UNFINISHED, {"key_id": key_id})).scalar_one())


class JobRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def submit(
        self,
        job: NewJob,
        now: datetime,
        *,
        max_unfinished: int | None = None,
        idempotency: IdempotencyTarget | None = None,
        answer: StoredAnswer | None = None,
        idempotency_retention: timedelta = RETENTION,
        claimed_by: tuple[str, float] | None = None,
    ) -> Job:
        """Inserts a queued job; with `idempotency`, marks that running record done with `answer`
        in the same transaction, so a job never exists without its record nor the reverse.
        With `claimed_by` (owner, lease in seconds) the job is inserted already claimed by that
        owner, as if it had claimed it at once (the submitter runs it: a Loom branch)."""
        now = utc(now)
        if idempotency is not None and answer is None:
            raise ValueError("an idempotency record is completed with an answer")
        values = insert_values(job, now)
        if claimed_by is not None:
            owner, lease_s = claimed_by
            values.update(
                status=JobStatus.RUNNING.value,
                owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                started_at=now,
            )
        async with write_transaction(self._engine) as conn:
            if max_unfinished is not None:
                # Count then insert, exclusive per key: concurrent submits never overshoot.
                await serialize_per_key(conn, job.key_id)
                if await _count_unfinished(conn, job.key_id) >= max_unfinished:
                    raise JobCapacityReached(max_unfinished)
            await conn.execute(_INSERT, values)
            if idempotency is not None and answer is not None:
                done = await complete_on(
                    conn, idempotency, answer, now, idempotency_retention, job.id
                )
                if not done:
                    raise IdempotencyRecordLost("the idempotency record is no longer running")
        # The row as inserted, without reading it back.
        return job_from_row(SimpleNamespace(**values))

    async def get(self, job_id: str, key_id: str | None = None) -> Job | None:
        """The job; with `key_id`, only that key's (another key's job is None, as if absent)."""
        query, params = (_BY_ID, {"job_id": job_id})
        if key_id is not None:
            query, params = (_BY_ID_OF_KEY, {"job_id": job_id, "key_id": key_id})
        async with point_read(self._engine) as conn:
            row = (await conn.execute(query, params)).first()
        return None if row is None else job_from_row(row)

    async def list(
        self, *, key_id: str | None = None, status: JobStatus | None = None, limit: int = 100
    ) -> list[Job]:
        """Newest first."""
        query = select(jobs).order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
        if key_id is not None:
            query = query.where(jobs.c.key_id == key_id)
        if status is not None:
            query = query.where(jobs.c.status == JobStatus(status).value)
        async with self._engine.connect() as conn:
            return [job_from_row(row) for row in await conn.execute(query)]

    async def ended_among(self, job_ids: Collection[str]) -> list[str]:
        """Those of `job_ids` that have ended (or no longer exist), in one query."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return []
        query = select(jobs.c.id).where(jobs.c.id.in_(wanted), jobs.c.status.in_(_ACTIVE))
        async with point_read(self._engine) as conn:
            active = {row.id for row in await conn.execute(query)}
        return [job_id for job_id in wanted if job_id not in active]

    async def count_unfinished(self, key_id: str) -> int:
        async with self._engine.connect() as conn:
            return await _count_unfinished(conn, key_id)

    async def claim(
        self,
        owner: str,
        models: Collection[str],
        now: datetime,
        lease_s: float,
        kinds: Collection[str] | None = None,
    ) -> Job | None:
        """Takes the oldest due queued job of one of `models` (and `kinds`) under a lease."""
        claimed = await self.claim_many(owner, models, now, lease_s, kinds, limit=1)
        return claimed[0] if claimed else None

    async def claim_many(
        self,
        owner: str,
        models: Collection[str],
        now: datetime,
        lease_s: float,
        kinds: Collection[str] | None = None,
        *,
        limit: int,
    ) -> list[Job]:
        """Takes up to `limit` of the oldest due queued jobs, oldest first, in one statement.

        PostgreSQL skips rows another claimer has locked; SQLite holds the write lock. One
        statement for many jobs keeps a busy node from queueing one write per job."""
        now = utc(now)
        if limit < 1 or not models or (kinds is not None and not kinds):
            return []
        c = jobs.c
        candidates = (
            select(c.id)
            .where(
                c.status == JobStatus.QUEUED.value,
                c.model.in_(sorted(models)),
                or_(c.not_before.is_(None), c.not_before <= now),
            )
            .order_by(c.created_at, c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        if kinds is not None:
            candidates = candidates.where(c.kind.in_(sorted(kinds)))
        # A materialized CTE: PostgreSQL runs the LIMIT ... SKIP LOCKED pick once (as a plain
        # IN subquery it may run it again per row and take more than `limit`).
        picked = candidates.cte("picked").prefix_with("MATERIALIZED", dialect="postgresql")
        statement = (
            update(jobs)
            .where(c.id.in_(select(picked.c.id)), c.status == JobStatus.QUEUED.value)
            .values(
                status=JobStatus.RUNNING.value,
                owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                started_at=func.coalesce(c.started_at, literal(now, _TIME)),
                updated_at=now,
            )
            .returning(*c)
        )
        async with write_transaction(self._engine) as conn:
            rows = (await conn.execute(statement)).all()
        claimed = [job_from_row(row) for row in rows]
        return sorted(claimed, key=lambda job: (job.created_at, job.id))

    @staticmethod
    def _fenced_update(
        job_id: str, attempt: int, owner: str, now: datetime, values: dict[str, Any]
    ) -> Any:
        c = jobs.c
        return (
            update(jobs)
            .where(
                c.id == job_id,
                c.attempt == attempt,
                c.owner == owner,
                c.status == JobStatus.RUNNING.value,
            )
            .values(updated_at=now, **values)
        )

    async def _fenced(
        self, job_id: str, attempt: int, owner: str, now: datetime, values: dict[str, Any]
    ) -> bool:
        statement = self._fenced_update(job_id, attempt, owner, now, values)
        async with write_transaction(self._engine) as conn:
            return (await conn.execute(statement)).rowcount == 1

    async def renew(
        self, job_id: str, attempt: int, owner: str, now: datetime, lease_s: float
    ) -> bool:
        """Extends the lease; False when the job is not ours any more (reaped, cancelled, ended)."""
        now = utc(now)
        return await self._fenced(
            job_id, attempt, owner, now, {"lease_expires_at": now + timedelta(seconds=lease_s)}
        )

    async def finish(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        status: JobStatus,
        now: datetime,
        *,
        result_status: int | None = None,
        result_body: str | None = None,
        error_code: str | None = None,
    ) -> bool:
        """Ends a running job we hold; False (nothing changed) for a stale or resurrected owner."""
        end = JobEnd(job_id, attempt, owner, status, result_status, result_body, error_code)
        return (await self.finish_many([end], now))[0]

    async def finish_many(self, ends: Sequence[JobEnd], now: datetime) -> list[bool]:
        """`finish` for several jobs in one transaction (a busy runner's ends, written together):
        each fenced on its own, so each answer is that job's alone."""
        for end in ends:
            if not can_move(JobStatus.RUNNING, end.status) or end.status not in TERMINAL:
                raise IllegalTransition(JobStatus.RUNNING, end.status)
        now = utc(now)
        statements = [
            self._fenced_update(
                end.job_id,
                end.attempt,
                end.owner,
                now,
                {
                    "status": JobStatus(end.status).value,
                    "finished_at": now,
                    "lease_expires_at": None,
                    "result_status": end.result_status,
                    "result_body": end.result_body,
                    "error_code": end.error_code,
                },
            )
            for end in ends
        ]
        if not statements:
            return []
        async with write_transaction(self._engine) as conn:
            return [(await conn.execute(statement)).rowcount == 1 for statement in statements]

    async def hand_back(
        self, job_id: str, attempt: int, owner: str, now: datetime, not_before: datetime
    ) -> bool:
        """Running -> queued, to be claimed again from `not_before` (the key's slots were full).

        The attempt stays: handing back is not a failure."""
        now = utc(now)
        return await self._fenced(
            job_id,
            attempt,
            owner,
            now,
            {
                "status": JobStatus.QUEUED.value,
                "owner": None,
                "lease_expires_at": None,
                "not_before": utc(not_before),
            },
        )

    async def reap(self, now: datetime) -> list[str]:
        """Takes back every running job whose lease passed: queued again with one more attempt,
        or failed (`job_attempts_exhausted`) once none is left. Returns their ids."""
        now = utc(now)
        c = jobs.c
        stale = (
            select(c.id)
            .where(c.status == JobStatus.RUNNING.value, c.lease_expires_at < now)
            .order_by(c.id)
            .with_for_update(skip_locked=True)
        )
        retry = c.attempt + 1 < c.max_attempts
        statement = (
            update(jobs)
            .where(
                c.id.in_(stale),
                c.status == JobStatus.RUNNING.value,
                c.lease_expires_at < now,
            )
            .values(
                status=case((retry, JobStatus.QUEUED.value), else_=JobStatus.FAILED.value),
                attempt=c.attempt + 1,
                owner=None,
                lease_expires_at=None,
                finished_at=case((retry, None), else_=literal(now, _TIME)),
                error_code=case((retry, c.error_code), else_=ATTEMPTS_EXHAUSTED),
                updated_at=now,
            )
            .returning(c.id)
        )
        async with write_transaction(self._engine) as conn:
            return sorted(row.id for row in await conn.execute(statement))

    async def cancel(self, job_id: str, key_id: str | None, now: datetime) -> Job | None:
        """Queued or running -> cancelled; a job that ended already comes back unchanged.

        None when there is no such job (or it is another key's). A running job's owner learns it
        at its next renew or finish, both of which then answer False."""
        now = utc(now)
        c = jobs.c
        statement = update(jobs).where(c.id == job_id, c.status.in_(_ACTIVE))
        if key_id is not None:
            statement = statement.where(c.key_id == key_id)
        statement = statement.values(
            status=JobStatus.CANCELLED.value,
            finished_at=now,
            lease_expires_at=None,
            updated_at=now,
        ).returning(*c)
        async with write_transaction(self._engine) as conn:
            row = (await conn.execute(statement)).first()
        if row is not None:
            return job_from_row(row)
        return await self.get(job_id, key_id)

    # --- parts (a harvest spread over nodes) ---------------------------------------------------

    async def add_parts(self, parts: Sequence[NewJob], now: datetime) -> int:
        """Queues the parts of a job, each naming it in `parent_id`; a part that exists already
        (same id: a restarted parent adds them again) is left as it is. Returns how many were
        added."""
        if not parts:
            return 0
        now = utc(now)
        rows = [insert_values(part, now) for part in parts]
        async with write_transaction(self._engine) as conn:
            dialect = sqlite if conn.dialect.name == "sqlite" else postgresql
            statement = (
                dialect.insert(jobs).values(rows).on_conflict_do_nothing(index_elements=[jobs.c.id])
            )
            return (await conn.execute(statement)).rowcount

    async def parts_of(self, parent_id: str) -> list[Job]:
        """The parts of a job, in the order of their ids."""
        query = select(jobs).where(jobs.c.parent_id == parent_id).order_by(jobs.c.id)
        async with point_read(self._engine) as conn:
            return [job_from_row(row) for row in await conn.execute(query)]

    async def report_progress(
        self, job_id: str, attempt: int, owner: str, now: datetime, progress: Mapping[str, Any]
    ) -> bool:
        """A running part's progress, fenced like its lease; False when it is not ours."""
        body = json.dumps(dict(progress), separators=(",", ":"))
        return await self._fenced(job_id, attempt, owner, utc(now), {"progress": body})

    async def cancel_parts(self, parent_id: str, now: datetime) -> int:
        """Every part of `parent_id` not ended yet -> cancelled (their owners learn it at their
        next renew). Returns how many."""
        now = utc(now)
        c = jobs.c
        statement = (
            update(jobs)
            .where(c.parent_id == parent_id, c.status.in_(_ACTIVE))
            .values(
                status=JobStatus.CANCELLED.value,
                finished_at=now,
                lease_expires_at=None,
                updated_at=now,
            )
        )
        async with write_transaction(self._engine) as conn:
            return (await conn.execute(statement)).rowcount

    async def sweep(
        self,
        now: datetime,
        *,
        queued_ttl: timedelta = timedelta(hours=24),
        result_ttl: timedelta = timedelta(hours=24),
        metadata_ttl: timedelta = timedelta(days=7),
        result_ttls: Mapping[str, timedelta] | None = None,
    ) -> SweepReport:
        """Retention: queued jobs expire, ended jobs lose request and result, then the rows go;
        idempotency records past their retention go too. Each step is its own transaction.
        `result_ttls` keeps the results of some kinds longer (a harvest's names its files)."""
        now = utc(now)
        c = jobs.c
        async with write_transaction(self._engine) as conn:
            expired = await conn.execute(
                update(jobs)
                # A part waits its turn behind its harvest's other parts: the harvest, which is
                # running, decides when it ends.
                .where(
                    c.status == JobStatus.QUEUED.value,
                    c.created_at < now - queued_ttl,
                    c.parent_id.is_(None),
                )
                .values(status=JobStatus.EXPIRED.value, finished_at=now, updated_at=now)
            )
        async with write_transaction(self._engine) as conn:
            deleted = await conn.execute(
                delete(jobs).where(c.finished_at.is_not(None), c.finished_at < now - metadata_ttl)
            )
        ttls = dict(result_ttls or {})
        emptied_rows = 0
        for kinds, ttl in [(None, result_ttl), *((k, t) for k, t in ttls.items())]:
            by_kind = c.kind.not_in(list(ttls)) if kinds is None else c.kind == kinds
            async with write_transaction(self._engine) as conn:
                emptied = await conn.execute(
                    update(jobs)
                    .where(
                        by_kind,
                        c.finished_at.is_not(None),
                        c.finished_at < now - ttl,
                        or_(c.request.is_not(None), c.result_body.is_not(None)),
                    )
                    .values(request=None, result_body=None, updated_at=now)
                )
            emptied_rows += emptied.rowcount
        async with write_transaction(self._engine) as conn:
            idempotency_deleted = await delete_expired_on(conn, now)
        return SweepReport(
            expired=expired.rowcount,
            emptied=emptied_rows,
            deleted=deleted.rowcount,
            idempotency_deleted=idempotency_deleted,
        )
