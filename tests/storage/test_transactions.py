"""write_transaction on SQLite: the writers of one process take turns before they reach SQLite's
write lock, so none of them meets SQLITE_BUSY (or its busy handler's sleeps) because of another.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event, text

from vllm_acs.storage.db import create_engine
from vllm_acs.storage.transactions import write_transaction

WRITERS = 30


def _no_busy_wait(dbapi_connection: Any, _record: Any) -> None:
    # A writer that finds the lock taken fails at once instead of waiting: contention shows.
    dbapi_connection.cursor().execute("PRAGMA busy_timeout=0")


async def _concurrent_writers(url: str) -> int:
    engine = create_engine(url)
    event.listen(engine.sync_engine, "connect", _no_busy_wait)
    try:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (i INTEGER)")

        async def writer(i: int) -> None:
            async with write_transaction(engine) as conn:
                await conn.execute(text("INSERT INTO t (i) VALUES (:i)"), {"i": i})
                for _ in range(3):  # holding the write lock across awaits, as repositories do
                    await asyncio.sleep(0)
                await conn.execute(text("UPDATE t SET i = i + 1000 WHERE i = :i"), {"i": i})

        await asyncio.gather(*(writer(i) for i in range(WRITERS)))
        async with engine.connect() as conn:
            return (await conn.execute(text("SELECT count(*) FROM t WHERE i >= 1000"))).scalar()
    finally:
        await engine.dispose()


def test_concurrent_sqlite_writers_of_one_process_never_meet_a_busy_lock(sqlite_url):
    assert asyncio.run(_concurrent_writers(sqlite_url)) == WRITERS


def test_the_turns_are_per_event_loop(sqlite_url):
    # A second loop (the CLI's asyncio.run after another) gets its own turns, not a dead lock.
    assert asyncio.run(_concurrent_writers(sqlite_url)) == WRITERS
    assert asyncio.run(_concurrent_writers(sqlite_url)) == 2 * WRITERS
