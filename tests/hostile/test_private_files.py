"""The node's data is private: the data home, the SQLite database (and its -wal and -shm files),
harvest files, the URL secret and the local key are created 0700 / 0600 under a umask that
would leave them readable by every user of the machine."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from vllm_acs.harvest.download_urls import load_or_create_secret
from vllm_acs.storage.db import create_engine
from vllm_acs.storage.files import LocalFileStore
from vllm_acs.tiny_model import write_tiny_model


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_sqlite_database_and_its_folders_are_private(tmp_path, open_umask):
    home = tmp_path / "new" / "home"
    database = home / "vllm-acs.sqlite3"

    async def write_once() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{database}")
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE t (x TEXT)"))
            await connection.execute(text("INSERT INTO t VALUES ('a prompt')"))
            companions = [p.name for p in home.iterdir() if p.name != database.name]
            assert companions  # the -wal / -shm files exist while the connection is open
            for name in companions:
                assert mode(home / name) == 0o600, name
        await engine.dispose()

    asyncio.run(write_once())
    assert mode(tmp_path / "new") == 0o700
    assert mode(home) == 0o700
    assert mode(database) == 0o600


def test_harvest_files_the_url_secret_and_the_model_folder_are_private(tmp_path, open_umask):
    store = LocalFileStore(tmp_path / "home" / "files")
    asyncio.run(store.write("harvests/job/shard_00000.safetensors", b"rows"))
    shard = tmp_path / "home" / "files" / "harvests" / "job" / "shard_00000.safetensors"
    assert mode(shard) == 0o600
    for folder in (shard.parent, shard.parent.parent, tmp_path / "home" / "files"):
        assert mode(folder) == 0o700, folder

    load_or_create_secret(None, tmp_path / "secret-home")
    assert mode(tmp_path / "secret-home") == 0o700
    assert all(mode(p) == 0o600 for p in (tmp_path / "secret-home").iterdir())

    model = write_tiny_model(tmp_path / "data-home" / "models" / "tiny-llama")
    assert mode(tmp_path / "data-home") == 0o700 and mode(model) == 0o700


def test_a_folder_the_operator_made_keeps_its_mode(tmp_path, open_umask):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    store = LocalFileStore(shared)
    asyncio.run(store.write("harvests/x/manifest.json", b"{}"))
    assert mode(shared) == 0o755
    assert mode(shared / "harvests") == 0o700
