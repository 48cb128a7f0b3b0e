"""write_transaction on SQLite: the writers of one process take turns before they reach SQLite's
write lock, so none of them meets SQLITE_BUSY (or its busy handler's sleeps) because of another.
point_read: reads the latest commit, and on SQLite takes no lock (a writer holding the write
lock does not hold it up).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event, text

from vllm_acs.storage.db import create_engine
from vllm_acs.storage.transactions import point_read, write_transaction

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


async def _value(engine: Any) -> Any:
    async with point_read(engine) as conn:
        return (await conn.execute(text("SELECT v FROM kv WHERE k = 'a'"))).scalar()


async def _reads_follow_commits(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("DROP TABLE IF EXISTS kv")
            await conn.exec_driver_sql("CREATE TABLE kv (k VARCHAR(8) PRIMARY KEY, v INTEGER)")
        seen = [await _value(engine)]
        for v in (1, 2):
            async with write_transaction(engine) as conn:
                await conn.execute(text("DELETE FROM kv WHERE k = 'a'"))
                await conn.execute(text("INSERT INTO kv (k, v) VALUES ('a', :v)"), {"v": v})
            seen.append(await _value(engine))  # the same pooled connection, a new commit
        return seen
    finally:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("DROP TABLE IF EXISTS kv")
        await engine.dispose()


def test_a_point_read_sees_each_commit(database_url):
    assert asyncio.run(_reads_follow_commits(database_url)) == [None, 1, 2]


async def _read_beside_a_held_write_lock(url: str) -> tuple[Any, Any]:
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("CREATE TABLE kv (k VARCHAR(8) PRIMARY KEY, v INTEGER)")
            await conn.exec_driver_sql("INSERT INTO kv (k, v) VALUES ('a', 1)")
        async with write_transaction(engine) as conn:
            await conn.exec_driver_sql("UPDATE kv SET v = 2 WHERE k = 'a'")
            # The write lock is held, the update not committed: the read neither sees the
            # uncommitted value nor takes the lock (it would wait out the busy timeout, then
            # fail with `database is locked`).
            during = await _value(engine)
        return during, await _value(engine)
    finally:
        await engine.dispose()


def test_a_sqlite_point_read_takes_no_lock_and_reads_the_last_commit(sqlite_url):
    assert asyncio.run(_read_beside_a_held_write_lock(sqlite_url)) == (1, 2)
