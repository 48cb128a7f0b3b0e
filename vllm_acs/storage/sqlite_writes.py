"""SQLite write transactions run inline on the event loop, on a plain (pysqlite) connection.

API server process and the CLI, SQLite only (PostgreSQL writes go through the async engine).
Through aiosqlite every statement is a round trip to the connection's thread and back to the
event loop, where it waits behind every other ready task; a write transaction of ten such steps
held SQLite's one write lock (and this process's writer lock) for ten turns of a busy loop, and
every other writer queued behind it: on a loaded node the writes of job submits, claims and ends
were taken one at a time at tens per second. A transaction here runs its statements directly:
the lock is held for the SQL's own time (microseconds for the repositories' small statements),
at the price of blocking the loop for that time. Reads stay on aiosqlite; they never wait for a
lock in WAL mode.

`InlineConnection` offers the part of `AsyncConnection` that the repositories use inside a write
transaction (`execute`, `exec_driver_sql`, `dialect`), so they are written once for both engines.
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
    """The plain engine on the same database file as `engine` (made once per engine)."""
    inline = _INLINE.get(engine.sync_engine)
    if inline is None:
        url = engine.url.set(drivername="sqlite")
        # check_same_thread off: the CLI and tests may drive one engine from several loops.
        inline = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(inline, "connect", _autocommit_driver)
        event.listen(inline, "begin", _begin_immediate)
        _INLINE[engine.sync_engine] = inline
    return inline


def dispose_inline(engine: AsyncEngine) -> None:
    """Closes the inline engine's connections (the storage is closing)."""
    inline = _INLINE.pop(engine.sync_engine, None)
    if inline is not None:
        inline.dispose()


class InlineConnection:
    """A sync SQLAlchemy connection inside a write transaction, awaited like an async one."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    @property
    def dialect(self) -> Any:
        return self._connection.dialect

    async def execute(self, statement: Any, parameters: Any = None) -> CursorResult[Any]:
        return self._connection.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> CursorResult[Any]:
        return self._connection.exec_driver_sql(statement, parameters)
