"""local_key.py: the embedded default's key, made once, kept 0600, the same on every run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vllm_acs.auth.local_key import LocalKeyRefused, banner, ensure_local_key, key_file
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage


def _run(settings: Settings, work):
    async def run():
        storage = await open_storage(settings, upgrade_schema=True)
        try:
            return await work(storage)
        finally:
            await storage.close()

    return asyncio.run(run())


def test_made_once_kept_private_and_the_same_later(tmp_path: Path):
    settings = Settings(home=tmp_path)
    secret, made = _run(settings, lambda storage: ensure_local_key(settings, storage))
    assert made and key_file(settings).stat().st_mode & 0o777 == 0o600
    again, made_again = _run(settings, lambda storage: ensure_local_key(settings, storage))
    assert (again, made_again) == (secret, False)
    text = banner(secret, key_file(settings), 8123, made, "tiny-llama")
    assert f'-H "Authorization: Bearer {secret}"' in text and "127.0.0.1:8123" in text


def test_a_revoked_kept_key_is_reported_not_replaced(tmp_path: Path):
    settings = Settings(home=tmp_path)
    secret, _ = _run(settings, lambda storage: ensure_local_key(settings, storage))

    async def revoke(storage):
        await storage.keys.set_state(secret[:15], "revoked")

    _run(settings, revoke)
    with pytest.raises(LocalKeyRefused, match="revoked"):
        _run(settings, lambda storage: ensure_local_key(settings, storage))
    assert key_file(settings).read_text().strip() == secret


def test_a_configured_database_never_gets_a_key_by_itself(tmp_path: Path):
    settings = Settings(home=tmp_path, database_url="postgresql+asyncpg://127.0.0.1/test")

    with pytest.raises(LocalKeyRefused, match="never makes keys"):
        asyncio.run(ensure_local_key(settings, storage=None))
    assert not key_file(settings).exists()


def test_the_local_key_is_audited_as_the_operators_when_made(tmp_path: Path):
    settings = Settings(home=tmp_path)
    secret, _ = _run(settings, lambda storage: ensure_local_key(settings, storage))
    _run(settings, lambda storage: ensure_local_key(settings, storage))  # a later run: no event

    async def events(storage):
        return await storage.key_events.list()

    [event] = _run(settings, events)
    assert (event.actor, event.action) == ("operator", "create")
    assert event.changes == {
        "name": "local",
        "scopes": ["completions", "harvest", "jobs", "looms"],
        "via": "local-key",
    }
    assert secret[:15] not in str(event.changes)
