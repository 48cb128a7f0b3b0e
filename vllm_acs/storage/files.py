"""Where job files live (harvest shards, manifests, stats): one small async interface, its local
directory implementation (the embedded default) and, in files_s3.py, an S3-compatible one.

API server process (the harvest job writes, the download route reads) and the CLI. Names are
relative paths like `harvests/<job id>/shard_00000.safetensors`; a write is atomic (a reader sees
the whole file or none of it), which is what lets a resumed harvest trust every file it finds.
Every method is a coroutine: the local store does its file I/O in worker threads, so no caller
blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Protocol

from ..private_paths import make_private_folder

# Path segments of letters, digits, `_`, `-` and `.`, never `.` or `..` alone.
_SEGMENT = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,200}$")


class FileNameError(ValueError):
    """A name that is not a relative path of plain segments."""


@dataclass(frozen=True)
class StoredFile:
    name: str
    size: int


class FileStore(Protocol):
    async def write(self, name: str, data: bytes) -> StoredFile:
        """Stores `data` under `name`, replacing what was there, atomically."""
        ...

    async def read(self, name: str) -> bytes:
        """The whole file; FileNotFoundError when there is none."""
        ...

    async def size(self, name: str) -> int | None:
        """The file's size, or None when there is none."""
        ...

    def read_range(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes `start` .. `end` (inclusive) in chunks (an async generator); FileNotFoundError
        from the first chunk when there is no such file."""
        ...

    async def delete(self, name: str) -> None:
        """Removes the file `name` (idempotent: nothing when there is none)."""
        ...

    async def delete_tree(self, prefix: str) -> None:
        """Removes every file under `prefix` (idempotent)."""
        ...

    async def children(self, prefix: str) -> list[str]:
        """The names directly under `prefix` (files and folders), sorted; [] when none. A folder
        emptied by `delete_tree` may still be named a while (SeaweedFS keeps it)."""
        ...

    async def modified_at(self, name: str) -> datetime | None:
        """When the file (or the newest file of the folder) was last written; None if absent."""
        ...

    async def download_urls(
        self, names: Sequence[str], expires_at: datetime, now: datetime
    ) -> list[str] | None:
        """URLs that serve these files themselves, without the node, until `expires_at` (an
        object store's presigned GETs), in order; or None: the node serves them at its signed
        `/downloads` URLs."""
        ...


def check_name(name: str) -> list[str]:
    """The segments of a safe relative name; FileNameError otherwise."""
    segments = name.split("/")
    if not segments or not all(_SEGMENT.match(segment) for segment in segments):
        raise FileNameError(f"not a plain relative file name: {name!r}")
    return segments


class LocalFileStore:
    """Files under one directory of this machine (the operator's data directory by default)."""

    CHUNK = 1 << 20

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root.joinpath(*check_name(name))

    async def write(self, name: str, data: bytes) -> StoredFile:
        path = self._path(name)
        await asyncio.to_thread(_write_atomically, path, data)
        return StoredFile(name, len(data))

    async def read(self, name: str) -> bytes:
        return await asyncio.to_thread(self._path(name).read_bytes)

    async def size(self, name: str) -> int | None:
        return await asyncio.to_thread(_size, self._path(name))

    async def read_range(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        path = self._path(name)
        handle: BinaryIO = await asyncio.to_thread(path.open, "rb")
        try:
            await asyncio.to_thread(handle.seek, start)
            left = end - start + 1
            while left > 0:
                data = await asyncio.to_thread(handle.read, min(self.CHUNK, left))
                if not data:
                    return
                left -= len(data)
                yield data
        finally:
            handle.close()

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._path(name).unlink, missing_ok=True)

    async def delete_tree(self, prefix: str) -> None:
        await asyncio.to_thread(_delete_tree, self._path(prefix))

    async def children(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(_children, self._path(prefix))

    async def modified_at(self, name: str) -> datetime | None:
        return await asyncio.to_thread(_modified_at, self._path(name))

    async def download_urls(
        self, names: Sequence[str], expires_at: datetime, now: datetime
    ) -> list[str] | None:
        return None  # the node's own /downloads route serves local files


def _write_atomically(path: Path, data: bytes) -> None:
    make_private_folder(path.parent)
    # A temporary name in the same directory, then rename: atomic on POSIX. mkstemp makes the
    # file 0600, and the rename keeps it.
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except FileNotFoundError:
        return None


def _delete_tree(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _children(path: Path) -> list[str]:
    return sorted(child.name for child in path.iterdir()) if path.is_dir() else []


def _modified_at(path: Path) -> datetime | None:
    try:
        if path.is_dir():
            times = [p.stat().st_mtime for p in path.rglob("*")] or [path.stat().st_mtime]
            stamp = max(times)
        else:
            stamp = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return datetime.fromtimestamp(stamp, tz=timezone.utc)
