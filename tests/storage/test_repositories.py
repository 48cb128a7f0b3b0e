"""Accounts, keys, usage rows and budget counters on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.storage.helpers import settings_for
from vllm_acs.storage import open_storage
from vllm_acs.storage.api_key_secret import hash_secret, looks_like_secret
from vllm_acs.storage.errors import ConflictError, NotFoundError, SchemaNotReady
from vllm_acs.storage.migrate import current_revision, head_revision
from vllm_acs.storage.usage import UsageRow


def test_schema_is_created_at_head_and_accounts_and_keys_work(database_url: str):
    async def body() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            assert await current_revision(storage.engine) == head_revision()
            account = await storage.accounts.create("alice")
            assert account.status == "pending" and not account.spend_capped
            with pytest.raises(ConflictError):
                await storage.accounts.create("alice")
            assert (await storage.accounts.approve("alice")).status == "approved"
            assert (await storage.accounts.set_spend_cap(account.id, True)).spend_capped
            assert (await storage.accounts.suspend(account.id)).status == "suspended"
            assert (await storage.accounts.set_monthly_tokens("alice", 5000)).monthly_tokens == 5000

            key, secret = await storage.keys.create(
                account.id, scopes=("completions",), monthly_tokens=100, max_running=2
            )
            assert looks_like_secret(secret) and secret.startswith(key.prefix)
            assert (await storage.keys.get(key.prefix)).id == key.id
            assert (await storage.keys.get(key.id)).monthly_tokens == 100
            found = await storage.keys.lookup(key.prefix)
            assert found is not None
            assert found.secret_hash == hash_secret(secret)
            assert found.account_status == "suspended" and found.account_monthly_tokens == 5000
            assert found.key.scopes == ("completions",) and found.key.max_running == 2
            assert secret not in repr(found) and secret not in str(key.as_json())

            assert (await storage.keys.set_state(key.prefix, "paused")).state == "paused"
            assert (await storage.keys.set_limits(key.id, daily_tokens=7)).daily_tokens == 7
            assert (await storage.keys.set_state(key.id, "revoked")).state == "revoked"
            with pytest.raises(ConflictError):
                await storage.keys.set_state(key.id, "active")
            assert [k.id for k in await storage.keys.list(account.id)] == [key.id]
            with pytest.raises(NotFoundError):
                await storage.keys.get("acs-bm-missing0")
            assert await storage.keys.lookup("acs-bm-missing0") is None
        finally:
            await storage.close()

    asyncio.run(body())


def test_usage_rows_and_budget_counters_are_written_together(database_url: str):
    async def body() -> None:
        storage = await open_storage(settings_for(database_url), upgrade_schema=True)
        try:
            account = await storage.accounts.create("bob", approved=True)
            key, _ = await storage.keys.create(account.id)
            moment = datetime(2026, 11, 29, 23, 59, tzinfo=timezone.utc)
            common = dict(
                route="/v1/completions",
                status=200,
                latency_ms=3,
                key_id=key.id,
                key_prefix=key.prefix,
                account_id=account.id,
                created_at=moment,
            )
            await storage.usage.insert(
                [
                    UsageRow(prompt_tokens=5, completion_tokens=7, model="tiny", **common),
                    UsageRow(prompt_tokens=1, completion_tokens=2, model="tiny", **common),
                    UsageRow(prompt_tokens=3, completion_tokens=0, model="other", **common),
                ]
            )
            settled = await storage.usage.read_settled(
                [
                    f"key:{key.id}:month:2026-11",
                    f"key:{key.id}:day:2026-11-29",
                    f"key:{key.id}:month-in:2026-11",
                    f"key:{key.id}:month-out:2026-11",
                    f"account:{account.id}:month:2026-11",
                    f"key:{key.id}:month:2026-12",
                ]
            )
            assert settled == {
                f"key:{key.id}:month:2026-11": 18,
                f"key:{key.id}:day:2026-11-29": 18,
                f"key:{key.id}:month-in:2026-11": 9,
                f"key:{key.id}:month-out:2026-11": 9,
                f"account:{account.id}:month:2026-11": 18,
            }
            per_key = await storage.usage.per_key_model_month()
            assert {(r["model"], r["requests"], r["total_tokens"]) for r in per_key} == {
                ("tiny", 2, 15),
                ("other", 1, 3),
            }
            (total,) = await storage.usage.per_account_month("2026-11")
            assert total["total_tokens"] == 18 and total["account_id"] == account.id
        finally:
            await storage.close()

    asyncio.run(body())


def test_postgresql_is_not_upgraded_behind_the_operators_back(pg_database: str):
    from tests.storage.conftest import _reset_pg

    _reset_pg(pg_database)

    async def body() -> None:
        with pytest.raises(SchemaNotReady, match="vllm-acs db upgrade"):
            await open_storage(settings_for(pg_database))

    asyncio.run(body())


def test_nodes_starting_together_upgrade_once(database_url: str, tmp_path: Path):
    """Two processes upgrade the same fresh database at once; both end at head, neither fails."""
    env = {**os.environ, "VLLM_ACS_DATABASE_URL": database_url, "VLLM_ACS_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "vllm_acs.cli", "db", "upgrade", "--json"]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out) == {"revision": head_revision()}


def test_key_lookup_survives_a_dropped_database_connection(pg_database: str):
    from tests.storage.conftest import _reset_pg

    _reset_pg(pg_database)

    async def body() -> None:
        import asyncpg

        storage = await open_storage(settings_for(pg_database), upgrade_schema=True)
        try:
            account = await storage.accounts.create("frank", approved=True)
            key, _ = await storage.keys.create(account.id)
            assert await storage.keys.lookup(key.prefix) is not None
            admin = await asyncpg.connect(pg_database.replace("+asyncpg", ""))
            try:
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            finally:
                await admin.close()
            assert killed >= 1
            found = await storage.keys.lookup(key.prefix)
            assert found is not None and found.key.id == key.id
        finally:
            await storage.close()

    asyncio.run(body())
