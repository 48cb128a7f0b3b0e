"""Which exceptions mean a shared service is unreachable (not a bug): the database (SQLAlchemy,
asyncpg, aiosqlite's locks, a pool timeout), Redis, or the object store of the job files
(obstore, which raises only its own errors; a missing file is the store's None, never one).
API server process: the error envelope answers them `503` with Retry-After instead of `500`.
"""

from __future__ import annotations

from typing import Literal

import sqlalchemy.exc
from redis import exceptions as redis_errors

Outage = Literal["database", "counters", "files"]
_NETWORK = (ConnectionError, TimeoutError)  # OSError's ConnectionRefusedError etc.; asyncio's


def outage_of(error: BaseException) -> Outage | None:
    """`database`, `counters`, `files`, or None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
            return "counters"
        if type(current).__module__.startswith("obstore"):
            return "files"
        if isinstance(
            current,
            (
                sqlalchemy.exc.OperationalError,
                sqlalchemy.exc.InterfaceError,
                sqlalchemy.exc.TimeoutError,
                sqlalchemy.exc.DisconnectionError,
            ),
        ):
            return "database"
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return "database"
        kind = type(current)
        if kind.__module__.startswith("asyncpg") and "Connection" in kind.__name__:
            return "database"
        if isinstance(current, _NETWORK):
            return "database" if _from_database(current) else None
        current = current.__cause__ or current.__context__
    return None


def _from_database(error: BaseException) -> bool:
    """A bare connection error or timeout raised while talking to the database (asyncpg raises
    OSError / TimeoutError when connecting)."""
    trace = error.__traceback__
    while trace is not None:
        module = trace.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("asyncpg", "sqlalchemy", "aiosqlite")):
            return True
        trace = trace.tb_next
    return False
