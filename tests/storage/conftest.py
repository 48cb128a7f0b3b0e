"""Fixtures for storage tests: a fresh SQLite file or PostgreSQL schema, a private Redis prefix.

They use the real PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) of the machine and fail
loudly when those are not running (`scripts/ensure-services.sh` starts them). Each test run gets
its own PostgreSQL database and Redis key prefix, removed at the end.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ADMIN_DSN = os.environ.get("ACS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ACS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def _pg_admin(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database for this test run (SQLAlchemy URL); dropped at the end."""
    name = f"acs_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    except OSError as error:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_ADMIN_DSN} ({error}); "
            "start it with scripts/ensure-services.sh"
        )
    host = PG_ADMIN_DSN.split("://", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"postgresql+asyncpg://{host}/{name}"
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _reset_pg(url: str) -> None:
    async def reset() -> None:
        import asyncpg

        conn = await asyncpg.connect(url.replace("+asyncpg", ""), timeout=5)
        try:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        finally:
            await conn.close()

    asyncio.run(reset())


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind (the schema is not created yet)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
    url = request.getfixturevalue("pg_database")
    _reset_pg(url)
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix private to one test; its keys are deleted afterwards."""
    from redis import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    prefix = f"acs-test-{secrets.token_hex(4)}"
    client = Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except RedisConnectionError as error:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({error}); run scripts/ensure-services.sh"
        )
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
