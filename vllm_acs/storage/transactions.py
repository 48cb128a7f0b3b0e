"""Write transactions that take the database's write lock up front, point reads, and the UTC
clock checks.

Used by the job, idempotency and usage repositories in the API server process. Every time they
store is given by the caller (`now`), never read here: the tests drive an explicit clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from .sqlite_inline import InlineConnection, inline_engine, inline_read_engine

# The two-key advisory lock space does not overlap the one-key space of the migration lock.
_KEY_LOCK_SPACE = 7356124
_KEY_LOCK = text("SELECT pg_advisory_xact_lock(:space, hashtext(:key))")


# One SQLite writer at a time per engine and event loop (see write_transaction).
_SQLITE_WRITERS: weakref.WeakKeyDictionary[Engine, dict[asyncio.AbstractEventLoop, asyncio.Lock]]
_SQLITE_WRITERS = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[Any]:
    """One transaction that commits on success (an `AsyncConnection`, or on SQLite an
    `InlineConnection` that offers the same `execute`).

    On SQLite it is `BEGIN IMMEDIATE`: a deferred transaction that reads before it writes fails
    with SQLITE_BUSY when another writer went first (WAL), instead of waiting out the busy timeout.
    The writers of this process take their turns on an asyncio lock first: SQLite has one write
    lock, and writers contending for it inside SQLite wait in its busy handler's sleeps (up to
    100 ms each), which leave the lock idle while work queues up; and the transaction's
    statements run inline (`sqlite_inline`), so the lock is held for the SQL's own time. Other
    processes (the CLI) still meet the busy timeout."""
    if engine.dialect.name != "sqlite":
        async with engine.begin() as conn:
            yield conn
        return
    async with _sqlite_writer_lock(engine):
        with inline_engine(engine).begin() as conn:
            yield InlineConnection(conn)


@contextlib.asynccontextmanager
async def point_read(engine: AsyncEngine) -> AsyncIterator[Any]:
    """A connection for a small indexed read on the request path (a key by prefix, a job by id).

    On SQLite the read runs inline on a plain autocommit connection (`sqlite_inline`): no lock,
    no round trip through aiosqlite's thread. On PostgreSQL a pooled async connection."""
    if engine.dialect.name != "sqlite":
        async with engine.connect() as conn:
            yield conn
        return
    with inline_read_engine(engine).connect() as conn:
        yield InlineConnection(conn)


def _sqlite_writer_lock(engine: AsyncEngine) -> asyncio.Lock:
    per_loop = _SQLITE_WRITERS.setdefault(engine.sync_engine, {})
    loop = asyncio.get_running_loop()
    lock = per_loop.get(loop)
    if lock is None:
        for stale in [other for other in per_loop if other.is_closed()]:
            del per_loop[stale]
        lock = per_loop[loop] = asyncio.Lock()
    return lock


async def serialize_per_key(conn: Any, key_id: str) -> None:
    """Makes the rest of this transaction exclusive per API key, so a count then insert is exact.

    PostgreSQL: a transaction-level advisory lock on the key. SQLite needs nothing more: the
    transaction holds the database's one write lock already (`write_transaction`)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(_KEY_LOCK, {"space": _KEY_LOCK_SPACE, "key": key_id})


def utc(moment: datetime) -> datetime:
    """`moment` in UTC; a naive datetime is refused, since SQLite would store it as it is."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a time given to storage must be timezone-aware, got {moment!r}")
    return moment.astimezone(timezone.utc)


def utc_or_none(moment: datetime | None) -> datetime | None:
    """A stored time as an aware UTC datetime (SQLite hands back naive ones, written in UTC)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)
