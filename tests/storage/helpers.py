"""Small builders the storage tests share: settings for a database, an approved account's key,
a migrated engine."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from vllm_acs.auth.principal import KeyLimits, Principal
from vllm_acs.settings import Settings
from vllm_acs.storage import Storage


def settings_for(url: str, home: Path | None = None, **values: Any) -> Settings:
    return Settings(home=home or Path("/nonexistent-acs-home"), database_url=url, **values)


async def approved_key(storage: Storage, **limits: int | None) -> tuple[Any, str]:
    """(ApiKey, secret) of a new key on a new approved account."""
    import secrets

    account = await storage.accounts.create(f"acct-{secrets.token_hex(4)}", approved=True)
    return await storage.keys.create(account.id, **limits)


def principal(key_id: str = "key_t", account_id: str = "acct_t", **limits: Any) -> Principal:
    return Principal(
        key_id=key_id,
        key_prefix="acs-bm-test0000",
        account_id=account_id,
        limits=KeyLimits(**limits),
    )


@contextlib.asynccontextmanager
async def migrated_engine(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on `url` with the schema at head, made by the project's migrations."""
    from vllm_acs.storage.db import create_engine
    from vllm_acs.storage.migrate import upgrade

    engine = create_engine(url)
    try:
        await upgrade(engine)
        yield engine
    finally:
        await engine.dispose()
