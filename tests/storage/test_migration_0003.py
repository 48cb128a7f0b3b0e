"""Migration 0003 (jobs, idempotency records) on SQLite and PostgreSQL: from 0002 to head with
existing rows kept, the schema at head equal to `tables.py`, and back down to 0002."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from tests.storage.helpers import settings_for
from vllm_acs.storage import open_storage
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.migrate import _config, current_revision, head_revision, upgrade
from vllm_acs.storage.tables import metadata

NEW_TABLES = {"jobs", "idempotency_records"}


def _differences(connection: Connection) -> list[Any]:
    return compare_metadata(MigrationContext.configure(connection), metadata)


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _downgrade(connection: Connection, revision: str) -> None:
    command.downgrade(_config(connection), revision)


def test_0003_upgrades_from_0002_matches_the_tables_and_downgrades(database_url: str):
    async def main() -> None:
        engine = create_engine(database_url)
        try:
            assert head_revision() >= "0003"
            assert await upgrade(engine, "0002") == "0002"
            async with engine.begin() as conn:
                assert not NEW_TABLES & await conn.run_sync(_tables)
                await conn.execute(
                    text(
                        "INSERT INTO accounts (id, name, status, spend_capped, created_at) "
                        "VALUES ('acct_old', 'old', 'approved', false, CURRENT_TIMESTAMP)"
                    )
                )
            assert await upgrade(engine) == head_revision()
            async with engine.connect() as conn:
                assert await conn.run_sync(_tables) >= NEW_TABLES
                # The migrations make exactly the schema the repositories are written against.
                assert await conn.run_sync(_differences) == []
                indexes = {i["name"] for i in await conn.run_sync(_jobs_indexes)}
                assert {"ix_jobs_claim", "ix_jobs_key_status"} <= indexes
            async with engine.begin() as conn:
                await conn.run_sync(_downgrade, "0002")
            assert await current_revision(engine) == "0002"
            async with engine.connect() as conn:
                assert not NEW_TABLES & await conn.run_sync(_tables)
            assert await upgrade(engine) == head_revision()
        finally:
            await engine.dispose()
        storage = await open_storage(settings_for(database_url))
        try:
            assert (await storage.accounts.get("acct_old")).name == "old"
            assert await storage.jobs.list() == []
        finally:
            await storage.close()

    asyncio.run(main())


def _jobs_indexes(connection: Connection) -> list[dict[str, Any]]:
    return inspect(connection).get_indexes("jobs")
