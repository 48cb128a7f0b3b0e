"""Where job files live (harvest shards, manifests, stats): one small interface and its local
directory implementation, so that an object store can stand in for it.

API server process (the harvest job writes, the download route reads) and the CLI. Names are
relative paths like `harvests/<job id>/shard_00000.safetensors`; a write is atomic (a reader sees
the whole file or none of it), which is what lets a resumed harvest trust every file it finds.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Protocol

# Path segments of letters, digits, `_`, `-` and `.`, never `.` or `..` alone.
_SEGMENT = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,200}$")


class FileNameError(ValueError):
    """A name that is not a relative path of plain segments."""


@dataclass(frozen=True)
class StoredFile:
    name: str
    size: int


class FileStore(Protocol):
    def write(self, name: str, data: bytes) -> StoredFile:
        """Stores `data` under `name`, replacing what was there, atomically."""
        ...

    def read(self, name: str) -> bytes:
        """The whole file; FileNotFoundError when there is none."""
        ...

    def size(self, name: str) -> int | None:
        """The file's size, or None when there is none."""
        ...

    def open_range(self, name: str, start: int, end: int) -> Iterator[bytes]:
        """Bytes `start` .. `end` (inclusive) in chunks; FileNotFoundError when there is none."""
        ...

    def delete_tree(self, prefix: str) -> None:
        """Removes every file under `prefix` (idempotent)."""
        ...

    def children(self, prefix: str) -> list[str]:
        """The names directly under `prefix` (files and folders), sorted; [] when none."""
        ...

    def modified_at(self, name: str) -> datetime | None:
        """When the file (or the newest file of the folder) was last written; None if absent."""
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

    def write(self, name: str, data: bytes) -> StoredFile:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temporary name in the same directory, then rename: atomic on POSIX.
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
        return StoredFile(name, len(data))

    def read(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def size(self, name: str) -> int | None:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            return None

    def open_range(self, name: str, start: int, end: int) -> Iterator[bytes]:
        handle: BinaryIO = self._path(name).open("rb")
        return _chunks(handle, start, end, self.CHUNK)

    def delete_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def children(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        return sorted(child.name for child in path.iterdir()) if path.is_dir() else []

    def modified_at(self, name: str) -> datetime | None:
        path = self._path(name)
        try:
            if path.is_dir():
                times = [p.stat().st_mtime for p in path.rglob("*")] or [path.stat().st_mtime]
                stamp = max(times)
            else:
                stamp = path.stat().st_mtime
        except FileNotFoundError:
            return None
        return datetime.fromtimestamp(stamp, tz=timezone.utc)


def _chunks(handle: BinaryIO, start: int, end: int, chunk: int) -> Iterator[bytes]:
    with handle:
        handle.seek(start)
        left = end - start + 1
        while left > 0:
            data = handle.read(min(chunk, left))
            if not data:
                return
            left -= len(data)
            yield data
