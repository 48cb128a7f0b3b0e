"""Fixtures for storage tests: a fresh SQLite file or PostgreSQL schema, a private Redis prefix.

They use the real PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) of the machine and fail
loudly when those are not running (`scripts/ensure-services.sh` starts them). Each test run gets
its own PostgreSQL database and Redis key prefix, removed at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import private_pg_database, private_redis_prefix


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database for this test run (SQLAlchemy URL); dropped at the end."""
    try:
        with private_pg_database() as url:
            yield url
    except RuntimeError as error:
        pytest.fail(str(error))


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
    from redis.exceptions import ConnectionError as RedisConnectionError

    try:
        with private_redis_prefix() as prefix:
            yield prefix
    except RedisConnectionError as error:
        pytest.fail(f"Redis is not reachable ({error}); run scripts/ensure-services.sh")
