"""Migration 0007 (`api_keys.paused_by`) on SQLite and PostgreSQL: from 0006 to head, a paused key
takes the actor of its last pause in the audit trail, or `operator` when there is none; the
schema at head equals `tables.py`; down to 0006 and up again."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from vllm_acs.storage.db import create_engine
from vllm_acs.storage.migrate import _config, current_revision, head_revision, upgrade
from vllm_acs.storage.tables import metadata

_KEY = (
    "INSERT INTO api_keys (id, account_id, prefix, secret_hash, state, scopes, created_at) "
    "VALUES (:id, 'acct_old', :prefix, 'h', :state, 'completions', CURRENT_TIMESTAMP)"
)
_PAUSE = (
    "INSERT INTO key_events (at, account_id, key_id, actor, action, changes) "
    "VALUES (CURRENT_TIMESTAMP, 'acct_old', :key, :actor, :action, '{}')"
)


def _differences(connection: Connection) -> list[Any]:
    return compare_metadata(MigrationContext.configure(connection), metadata)


def _columns(connection: Connection) -> set[str]:
    return {c["name"] for c in inspect(connection).get_columns("api_keys")}


def _downgrade(connection: Connection, revision: str) -> None:
    command.downgrade(_config(connection), revision)


def test_0007_keeps_who_paused_each_key_and_downgrades(database_url: str):
    async def main() -> None:
        engine = create_engine(database_url)
        try:
            assert head_revision() >= "0007"
            assert await upgrade(engine, "0006") == "0006"
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO accounts (id, name, status, spend_capped, created_at) "
                        "VALUES ('acct_old', 'old', 'approved', false, CURRENT_TIMESTAMP)"
                    )
                )
                for key, state in (
                    ("key_by_key", "paused"),
                    ("key_by_op", "paused"),
                    ("key_no_trail", "paused"),
                    ("key_active", "active"),
                ):
                    await conn.execute(
                        text(_KEY), {"id": key, "prefix": f"acs-bm-{key}", "state": state}
                    )
                for key, actor, action in (
                    ("key_by_key", "operator", "pause"),
                    ("key_by_key", "operator", "resume"),
                    ("key_by_key", "key_admin", "pause"),
                    ("key_by_op", "key_admin", "pause"),
                    ("key_by_op", "operator", "pause"),
                    ("key_active", "operator", "pause"),
                    ("key_active", "operator", "resume"),
                ):
                    await conn.execute(text(_PAUSE), {"key": key, "actor": actor, "action": action})
            assert await upgrade(engine) == head_revision()
            async with engine.connect() as conn:
                assert await conn.run_sync(_differences) == []
                rows = await conn.execute(text("SELECT id, paused_by FROM api_keys ORDER BY id"))
                assert dict(rows.all()) == {
                    "key_active": None,
                    "key_by_key": "key_admin",
                    "key_by_op": "operator",
                    "key_no_trail": "operator",
                }
            async with engine.begin() as conn:
                await conn.run_sync(_downgrade, "0006")
            assert await current_revision(engine) == "0006"
            async with engine.connect() as conn:
                assert "paused_by" not in await conn.run_sync(_columns)
                count = await conn.execute(text("SELECT count(*) FROM api_keys"))
                assert count.scalar_one() == 4
            assert await upgrade(engine) == head_revision()
        finally:
            await engine.dispose()

    asyncio.run(main())
