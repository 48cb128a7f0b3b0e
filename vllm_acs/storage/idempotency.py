"""Idempotency records: one per (API key, Idempotency-Key), reserved before the work starts and
completed with the first answer, which a retry replays.

API server process. Concurrent reserves of one key race on the primary key: exactly one wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .tables import idempotency_records
from .transactions import point_read, utc, utc_or_none, write_transaction

RUNNING = "running"
DONE = "done"
NO_ANSWER = "no_answer"
RETENTION = timedelta(days=7)


@dataclass(frozen=True)
class StoredAnswer:
    """An answer as the client got it: status, raw body text, the headers worth replaying."""

    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IdempotencyTarget:
    key_id: str
    idempotency_key: str


# `scope["state"]` key of the claim of the request that holds a fresh record.
IDEMPOTENCY_STATE_KEY = "acs_idempotency"


@dataclass
class IdempotencyClaim:
    """The first request with a key, while it runs: a route that stores the answer itself, in its
    own transaction (JobRepository.submit), sets `completed` so the middleware does not."""

    target: IdempotencyTarget
    completed: bool = False


@dataclass(frozen=True)
class Reserved:
    """This request holds the record: it does the work, then completes, releases or abandons."""

    target: IdempotencyTarget


@dataclass(frozen=True)
class Existing:
    """Another request holds or held the record. `answer` is set when `state` is done."""

    fingerprint: str
    state: str
    answer: StoredAnswer | None
    job_id: str | None
    route: str | None = None
    # When a running record turns into no_answer (for Retry-After); None once it ended.
    lease_expires_at: datetime | None = None


# The statements on one record, built once with bind parameters (`_bound`): building one per
# call (and its cache key) cost SQLAlchemy more than SQLite took to run it.
_c = idempotency_records.c
_BOUND_TARGET = (_c.key_id == bindparam("t_key_id")) & (
    _c.idempotency_key == bindparam("t_idempotency_key")
)
_DELETE_EXPIRED = delete(idempotency_records).where(
    _BOUND_TARGET, _c.expires_at < bindparam("now", type_=_c.expires_at.type)
)
_SELECT = select(idempotency_records).where(_BOUND_TARGET)
_COMPLETE = (
    update(idempotency_records)
    .where(_BOUND_TARGET, _c.state == RUNNING)
    .values(
        state=DONE,
        status=bindparam("v_status"),
        body=bindparam("v_body"),
        headers=bindparam("v_headers"),
        job_id=bindparam("v_job_id"),
        lease_expires_at=None,
        expires_at=bindparam("v_expires_at", type_=_c.expires_at.type),
    )
)
_RENEW = (
    update(idempotency_records)
    .where(
        _BOUND_TARGET,
        _c.state == RUNNING,
        _c.lease_expires_at >= bindparam("now", type_=_c.lease_expires_at.type),
    )
    .values(lease_expires_at=bindparam("v_lease_expires_at", type_=_c.lease_expires_at.type))
)
_RELEASE = delete(idempotency_records).where(_BOUND_TARGET, _c.state == RUNNING)
_ABANDON = (
    update(idempotency_records)
    .where(_BOUND_TARGET, _c.state == RUNNING)
    .values(state=NO_ANSWER, lease_expires_at=None)
)
# Its values are the execute's parameters (the columns by name).
_RESERVE = {
    name: dialect.insert(idempotency_records)
    .on_conflict_do_nothing(index_elements=[_c.key_id, _c.idempotency_key])
    .returning(_c.key_id)
    for name, dialect in (("sqlite", sqlite), ("postgresql", postgresql))
}


def _bound(target: IdempotencyTarget, **values: Any) -> dict[str, Any]:
    """The parameters of the statements above for `target`."""
    return {"t_key_id": target.key_id, "t_idempotency_key": target.idempotency_key, **values}


def _existing(row: Any, now: datetime) -> Existing:
    lease = utc_or_none(row.lease_expires_at)
    state = row.state
    # A holder that neither completed nor renewed in time is presumed dead.
    if state == RUNNING and lease is not None and lease < now:
        state = NO_ANSWER
    answer = None
    if state == DONE:
        answer = StoredAnswer(row.status, row.body or "", json.loads(row.headers or "{}"))
    return Existing(
        fingerprint=row.fingerprint,
        state=state,
        answer=answer,
        job_id=row.job_id,
        route=row.route,
        lease_expires_at=lease if state == RUNNING else None,
    )


async def complete_on(
    conn: AsyncConnection,
    target: IdempotencyTarget,
    answer: StoredAnswer,
    now: datetime,
    retention: timedelta = RETENTION,
    job_id: str | None = None,
) -> bool:
    """Marks a running record done with `answer`, inside the caller's transaction.

    False when the record is not running (released, abandoned, done already, never reserved)."""
    now = utc(now)
    result = await conn.execute(
        _COMPLETE,
        _bound(
            target,
            v_status=answer.status,
            v_body=answer.body,
            v_headers=json.dumps(answer.headers, separators=(",", ":")),
            v_job_id=job_id,
            v_expires_at=now + retention,
        ),
    )
    return result.rowcount == 1


class IdempotencyRecords:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def reserve(
        self,
        target: IdempotencyTarget,
        route: str,
        fingerprint: str,
        now: datetime,
        lease_s: float,
        retention: timedelta = RETENTION,
    ) -> Reserved | Existing:
        """A new running record (Reserved), or the record another request made (Existing)."""
        now = utc(now)
        insert = _RESERVE[self._engine.dialect.name]
        values = dict(
            key_id=target.key_id,
            idempotency_key=target.idempotency_key,
            route=route,
            fingerprint=fingerprint,
            state=RUNNING,
            lease_expires_at=now + timedelta(seconds=lease_s),
            created_at=now,
            expires_at=now + retention,
        )
        while True:
            async with write_transaction(self._engine) as conn:
                # A record past its retention is gone for the client even before the sweep.
                await conn.execute(_DELETE_EXPIRED, _bound(target, now=now))
                if (await conn.execute(insert, values)).first() is not None:
                    return Reserved(target)
                # The conflict waited for the winner's commit; this statement sees its row.
                row = (await conn.execute(_SELECT, _bound(target))).first()
            # None: the winner released its record in between; this request may try again.
            if row is not None:
                return _existing(row, now)

    async def get(self, target: IdempotencyTarget, now: datetime) -> Existing | None:
        now = utc(now)
        async with point_read(self._engine) as conn:
            row = (await conn.execute(_SELECT, _bound(target))).first()
        return None if row is None else _existing(row, now)

    async def renew(self, target: IdempotencyTarget, now: datetime, lease_s: float) -> bool:
        """Extends a running record's lease (long work); False when it is not running any more."""
        now = utc(now)
        lease = now + timedelta(seconds=lease_s)
        async with write_transaction(self._engine) as conn:
            result = await conn.execute(_RENEW, _bound(target, now=now, v_lease_expires_at=lease))
        return result.rowcount == 1

    async def complete(
        self,
        target: IdempotencyTarget,
        answer: StoredAnswer,
        now: datetime,
        retention: timedelta = RETENTION,
        job_id: str | None = None,
    ) -> None:
        async with write_transaction(self._engine) as conn:
            await complete_on(conn, target, answer, now, retention, job_id)

    async def release(self, target: IdempotencyTarget) -> None:
        """Deletes a running record: the request was refused before it started (stores nothing)."""
        async with write_transaction(self._engine) as conn:
            await conn.execute(_RELEASE, _bound(target))

    async def abandon(self, target: IdempotencyTarget) -> None:
        """The work started but ended with no answer to store: a retry gets no_answer."""
        async with write_transaction(self._engine) as conn:
            await conn.execute(_ABANDON, _bound(target))

    async def delete_expired(self, now: datetime) -> int:
        """Removes the records whose retention ended; the job sweep calls it."""
        async with write_transaction(self._engine) as conn:
            return await delete_expired_on(conn, utc(now))


async def delete_expired_on(conn: AsyncConnection, now: datetime) -> int:
    result = await conn.execute(
        delete(idempotency_records).where(idempotency_records.c.expires_at < utc(now))
    )
    return result.rowcount
