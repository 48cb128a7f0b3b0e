"""The usage ledger: off the response path, and nothing lost while the database is slow or down."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from tests.storage.helpers import settings_for
from vllm_acs.storage import open_storage
from vllm_acs.storage.usage import UsageRow


def _row(i: int) -> UsageRow:
    return UsageRow(
        route="/v1/completions",
        status=200,
        latency_ms=1,
        prompt_tokens=i,
        key_id="key_x",
        account_id="acct_x",
        request_id=f"r{i}",
    )


def test_record_does_not_wait_for_a_locked_database(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"

    async def body() -> None:
        storage = await open_storage(settings_for(url))
        try:
            locker = sqlite3.connect(
                tmp_path / "acs.sqlite3", isolation_level=None, check_same_thread=False
            )
            unlock = threading.Timer(0.4, locker.rollback)
            try:
                locker.execute("BEGIN EXCLUSIVE")
                unlock.start()
                started = time.perf_counter()
                for i in range(100):
                    storage.ledger.record(_row(i))
                # Well under the 0.4 s the database stays locked: record() did not wait for it.
                assert time.perf_counter() - started < 0.3
                await asyncio.sleep(0.1)
                await storage.ledger.flush(10)
                assert len(await storage.usage.rows()) == 100
            finally:
                unlock.cancel()
                if unlock.is_alive():
                    unlock.join()
                locker.close()
        finally:
            await storage.close()

    asyncio.run(body())


def test_a_failing_database_delays_rows_but_never_loses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"

    async def body() -> None:
        storage = await open_storage(settings_for(url))
        real_insert = storage.usage.insert
        failures = [OSError("database unavailable")] * 3

        async def flaky_insert(rows: list[UsageRow]) -> None:
            if failures:
                raise failures.pop()
            await real_insert(rows)

        monkeypatch.setattr(storage.usage, "insert", flaky_insert)
        try:
            for i in range(10):
                storage.ledger.record(_row(i))
            await storage.ledger.flush(10)
            assert failures == []
            rows = await storage.usage.rows()
            assert sorted(r["request_id"] for r in rows) == sorted(f"r{i}" for i in range(10))
        finally:
            await storage.close()

    asyncio.run(body())


def test_close_drains_the_queue(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"

    async def body() -> None:
        storage = await open_storage(settings_for(url))
        for i in range(5):
            storage.ledger.record(_row(i))
        await storage.close()
        reopened = await open_storage(settings_for(url))
        try:
            assert len(await reopened.usage.rows()) == 5
        finally:
            await reopened.close()

    asyncio.run(body())
