"""The job-file store's contract, on the local directory and on S3 (a real SeaweedFS): atomic
whole-file writes, byte ranges, sizes, children, times, files and trees deleted, safe names only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from vllm_acs.storage.files import FileNameError, FileStore, LocalFileStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> FileStore:
    if request.param == "local":
        return LocalFileStore(tmp_path / "files")
    from vllm_acs.storage.files_s3 import S3FileStore

    seaweedfs = request.getfixturevalue("seaweedfs")
    return S3FileStore.from_settings(seaweedfs.settings(seaweedfs.prefix("files")))


async def _joined(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def test_write_read_size_and_replace(store):
    async def scenario() -> None:
        stored = await store.write("harvests/job_1/manifest.json", b"{}")
        assert (stored.name, stored.size) == ("harvests/job_1/manifest.json", 2)
        assert await store.read("harvests/job_1/manifest.json") == b"{}"
        await store.write("harvests/job_1/manifest.json", b'{"a": 1}')
        assert await store.read("harvests/job_1/manifest.json") == b'{"a": 1}'
        assert await store.size("harvests/job_1/manifest.json") == 8
        assert await store.size("harvests/job_1/missing") is None
        assert await store.size("harvests/job_1") is None  # a folder is not a file
        # No temporary file is left beside it.
        assert await store.children("harvests/job_1") == ["manifest.json"]
        with pytest.raises(FileNotFoundError):
            await store.read("harvests/job_1/missing")
        await store.write("harvests/job_1/empty", b"")
        assert await store.size("harvests/job_1/empty") == 0
        assert await store.read("harvests/job_1/empty") == b""

    asyncio.run(scenario())


def test_ranges_come_in_chunks(store):
    store.CHUNK = 7
    data = bytes(range(256)) * 4

    async def scenario() -> None:
        await store.write("f/data", data)
        assert await _joined(store.read_range("f/data", 0, len(data) - 1)) == data
        assert await _joined(store.read_range("f/data", 100, 199)) == data[100:200]
        assert await _joined(store.read_range("f/data", 1000, 5000)) == data[1000:]
        assert await _joined(store.read_range("f/data", 5, 5)) == data[5:6]
        with pytest.raises(FileNotFoundError):
            await _joined(store.read_range("f/missing", 0, 10))

    asyncio.run(scenario())


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_mix(store):
    old, new = b"a" * (3 << 20), b"b" * (3 << 20)

    async def scenario() -> None:
        await store.write("harvests/job_1/shard", old)
        seen: set[bytes] = set()

        async def reader() -> None:
            for _ in range(6):
                data = await store.read("harvests/job_1/shard")
                assert data in (old, new)
                seen.add(data[:1])

        await asyncio.gather(store.write("harvests/job_1/shard", new), reader(), reader())
        assert await store.read("harvests/job_1/shard") == new

    asyncio.run(scenario())


def test_children_and_modified_at(store):
    async def scenario() -> None:
        before = datetime.now(timezone.utc) - timedelta(seconds=5)
        await store.write("harvests/job_1/a", b"1")
        await store.write("harvests/job_1/_state/b", b"2")
        await store.write("harvests/job_2/a", b"3")
        assert await store.children("harvests") == ["job_1", "job_2"]
        assert await store.children("harvests/job_1") == ["_state", "a"]
        assert await store.children("nothing/here") == []
        after = datetime.now(timezone.utc) + timedelta(seconds=5)
        for name in ("harvests/job_1/a", "harvests/job_1"):
            written = await store.modified_at(name)
            assert written is not None and before <= written <= after, name
        assert await store.modified_at("harvests/job_9") is None

    asyncio.run(scenario())


def test_delete_tree(store):
    async def scenario() -> None:
        await store.write("harvests/job_1/a", b"1")
        await store.write("harvests/job_1/_state/b", b"2")
        await store.write("harvests/job_10/a", b"3")
        await store.write("harvests/job_2/a", b"4")
        await store.delete_tree("harvests/job_1")
        await store.delete_tree("harvests/job_1")  # idempotent
        assert await store.size("harvests/job_1/a") is None
        assert await store.size("harvests/job_1/_state/b") is None
        # A prefix is whole segments: job_10 is not under job_1.
        assert await store.size("harvests/job_10/a") == 1
        # An emptied folder may be listed a while (SeaweedFS), but no file is left in it.
        assert set(await store.children("harvests")) - {"job_1"} == {"job_10", "job_2"}
        assert await store.modified_at("harvests/job_1") is None
        await store.delete_tree("harvests/job_2/a")  # one file
        assert await store.size("harvests/job_2/a") is None

    asyncio.run(scenario())


def test_delete_one_file(store):
    async def scenario() -> None:
        await store.write("harvests/job_3/_parts/state_0000_00001.safetensors", b"1")
        await store.write("harvests/job_3/_parts/state_0000_00002.safetensors", b"22")
        await store.delete("harvests/job_3/_parts/state_0000_00001.safetensors")
        await store.delete("harvests/job_3/_parts/state_0000_00001.safetensors")  # idempotent
        await store.delete("harvests/job_3/_parts/never_written")
        assert await store.size("harvests/job_3/_parts/state_0000_00001.safetensors") is None
        assert await store.size("harvests/job_3/_parts/state_0000_00002.safetensors") == 2
        with pytest.raises(FileNameError):
            await store.delete("harvests/../job_3")

    asyncio.run(scenario())


def test_local_files_have_no_url_of_their_own(tmp_path):
    now = datetime.now(timezone.utc)
    store = LocalFileStore(tmp_path)
    assert asyncio.run(store.download_urls(["a/b"], now + timedelta(days=1), now)) is None


@pytest.mark.parametrize("name", ["", "/etc/passwd", "a/../b", "a//b", "..", "a/./b", "a b"])
def test_names_that_could_leave_the_root_are_refused(store, name):
    with pytest.raises(FileNameError):
        asyncio.run(store.write(name, b"x"))
    with pytest.raises(FileNameError):
        asyncio.run(store.read(name))
