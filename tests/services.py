"""The machine's PostgreSQL and Redis for tests: a private database or key prefix, removed after.

They fail loudly when a service is down (`scripts/ensure-services.sh`, run by `make test`,
starts them).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

PG_ADMIN_DSN = os.environ.get("ACS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ACS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def _pg_admin(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def private_pg_database() -> Iterator[str]:
    """A new PostgreSQL database (its SQLAlchemy URL), dropped at the end."""
    name = f"acs_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    except OSError as error:
        raise RuntimeError(
            f"PostgreSQL is not reachable at {PG_ADMIN_DSN} ({error}); "
            "start it with scripts/ensure-services.sh"
        ) from error
    host = PG_ADMIN_DSN.split("://", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql+asyncpg://{host}/{name}"
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def private_redis_prefix() -> Iterator[str]:
    """A Redis key prefix of its own; every key under it is deleted at the end."""
    from redis import Redis

    prefix = f"acs-test-{secrets.token_hex(4)}"
    client = Redis.from_url(REDIS_URL)
    try:
        client.ping()
        yield prefix
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
