"""SQLite statements run inline on the event loop, on plain (pysqlite) connections.

API server process and the CLI, SQLite only (PostgreSQL goes through the async engine). Through
aiosqlite every statement is a round trip to the connection's own thread and back to the event
loop: the thread waits for the GIL while the loop runs, and the answer waits behind every other
ready task of the loop. On a loaded node that made each statement cost milliseconds of waiting
for microseconds of SQL:

- a write transaction of ten such steps held SQLite's one write lock (and this process's writer
  lock) for ten turns of a busy loop, so job submits, claims and ends were written one at a
  time, at tens per second;
- a key lookup (one indexed read per request) waited p50 417 ms during a burst of job submits,
  behind the other reads queued on the same thread.

Here a write transaction (`inline_engine`: `BEGIN IMMEDIATE`) and a point read
(`inline_read_engine`: autocommit, so it takes no lock and reads the latest commit; WAL lets it
read while another process writes) run their statements directly, at the price of blocking the
loop for the SQL's own time: microseconds for the repositories' small indexed statements, and a
WAL checkpoint now and then. Larger reads (listings, reports) stay on aiosqlite.

`InlineConnection` offers the part of `AsyncConnection` that the repositories use (`execute`,
`exec_driver_sql`, `dialect`), so each statement is written once for both engines.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.ext.asyncio import AsyncEngine


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection of the project, async or inline, sets these."""
    cursor = dbapi_connection.cursor()
    # WAL lets the CLI write while the server reads; the busy timeout waits out short locks.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _autocommit_driver(dbapi_connection: Any, record: Any) -> None:
    # The sqlite3 module's own implicit BEGIN is switched off; `_begin_immediate` begins instead
    # (SQLAlchemy's documented recipe for SQLite transactions).
    sqlite_pragmas(dbapi_connection, record)
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Connection) -> None:
    # IMMEDIATE: the write lock up front, so a transaction that reads before it writes never
    # fails with SQLITE_BUSY halfway (see transactions.write_transaction).
    connection.exec_driver_sql("BEGIN IMMEDIATE")


_INLINE: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def inline_engine(engine: AsyncEngine) -> Engine:
    """The plain engine for write transactions on the same database file as `engine` (made
    once per engine): each transaction begins `BEGIN IMMEDIATE`."""
    return _plain_engine(engine, _INLINE, begin_immediate=True)


_INLINE_READS: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def inline_read_engine(engine: AsyncEngine) -> Engine:
    """The plain engine for point reads on the same file as `engine`: autocommit (no `BEGIN`,
    so no lock is taken and each statement reads the latest commit)."""
    return _plain_engine(engine, _INLINE_READS, begin_immediate=False)


def _plain_engine(
    engine: AsyncEngine,
    made: weakref.WeakKeyDictionary[Engine, Engine],
    *,
    begin_immediate: bool,
) -> Engine:
    inline = made.get(engine.sync_engine)
    if inline is None:
        url = engine.url.set(drivername="sqlite")
        # check_same_thread off: the CLI and tests may drive one engine from several loops.
        inline = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(inline, "connect", _autocommit_driver)
        if begin_immediate:
            event.listen(inline, "begin", _begin_immediate)
        made[engine.sync_engine] = inline
    return inline


def dispose_inline(engine: AsyncEngine) -> None:
    """Closes the inline engines' connections (the storage is closing)."""
    for engines in (_INLINE, _INLINE_READS):
        inline = engines.pop(engine.sync_engine, None)
        if inline is not None:
            inline.dispose()


class InlineConnection:
    """A sync SQLAlchemy connection (in a write transaction, or for a point read), awaited like
    an async one."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    @property
    def dialect(self) -> Any:
        return self._connection.dialect

    async def execute(self, statement: Any, parameters: Any = None) -> CursorResult[Any]:
        return self._connection.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> CursorResult[Any]:
        return self._connection.exec_driver_sql(statement, parameters)
