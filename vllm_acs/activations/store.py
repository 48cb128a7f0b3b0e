"""Capture files: how captured rows travel from the workers to the API server, by reference.

Workers (writer side) create one file per ACS request under a shared-memory directory, named by the
payload's capture id, and write rows into it in place during the forward pass; the API server
(reader side) reads it once vLLM has returned the request's final output, then releases it.
numpy and the standard library only.

Layout: a 256-byte header, then uint16 bf16 bits shaped [capacity, n_layers, hidden] (position
major, so that a step's rows are one contiguous range the writer can reserve with fallocate).
Header: int64 magic, version, n_layers, capacity, hidden, rows_done, status, writer pid; then an
error message (UTF-8, NUL-padded). `rows_done` is the number of leading positions (prompt, then
generated tokens) the workers have processed for this request; it is raised only after those rows
are written, so a reader never sees a row counted before it is there.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

MAGIC = 0x31504143534341  # "ACSCAP1" little-endian
VERSION = 1
HEADER_BYTES = 256
_MESSAGE_OFFSET = 64
SUFFIX = ".acscap"
STATUS_OK = 0
STATUS_FAILED = 1
BYTES_PER_MB = 1024 * 1024


def capture_buffer_rows(capture_mb: float, hidden: int) -> int:
    """The rows of a worker's capture buffer (`VLLM_ACS_CAPTURE_BUFFER_MB`), a row being one
    token at one layer (2 x hidden bytes): what one forward step can capture, over all its
    requests. The workers size the buffer with it and the API server refuses what can never fit."""
    return max(1, int(capture_mb * BYTES_PER_MB) // (2 * hidden))


class CaptureError(RuntimeError):
    """A capture cannot be read as asked; the API server answers 502 (see the subclasses)."""


class CaptureMissingError(CaptureError):
    """No file: the workers never saw the request's payload (`capture_rows_missing`)."""


class CaptureIncompleteError(CaptureError):
    """The file holds fewer rows than expected, or the workers marked it failed
    (`capture_incomplete`)."""


class CaptureExistsError(CaptureError):
    """A file with this capture id already exists: capture ids must be unique per request."""


def capture_root(configured: Path | None = None) -> Path:
    """The directory of capture files: the `capture_dir` setting, else /dev/shm/vllm-acs."""
    if configured is not None:
        return Path(configured)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "vllm-acs"


def capture_path(root: Path, capture_id: str) -> Path:
    # The payload already restricts capture ids to [A-Za-z0-9_-]; check again: this names a file.
    if not capture_id or not all(c.isalnum() or c in "_-" for c in capture_id):
        raise ValueError(f"invalid capture id {capture_id!r}")
    return root / f"{capture_id}{SUFFIX}"


@dataclass(frozen=True)
class CaptureHeader:
    n_layers: int
    capacity: int
    hidden: int
    rows_done: int
    failed: bool
    message: str


class CaptureWriter:
    """Worker side: one request's capture file, mapped into memory."""

    def __init__(
        self, path: Path, fd: int, mapping: mmap.mmap, n_layers: int, capacity: int, hidden: int
    ):
        self.path = path
        self._fd = fd
        # numpy views of the mapping; the mapping stays until the last view is gone.
        self._mapping = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8)
        self._header = self._bytes[:_MESSAGE_OFFSET].view(np.int64)
        # rows[p, i] is the residual stream at position p after the i-th captured layer.
        rows = self._bytes[HEADER_BYTES:].view(np.uint16)
        self.rows = rows.reshape(capacity, n_layers, hidden)
        self.capacity = capacity
        self._row_bytes = 2 * n_layers * hidden
        self._reserved = 0
        self._rows_done = 0  # what the header says, kept here: advance runs every step

    @classmethod
    def create(
        cls, root: Path, capture_id: str, *, n_layers: int, capacity: int, hidden: int
    ) -> CaptureWriter:
        path = capture_path(root, capture_id)
        size = HEADER_BYTES + 2 * n_layers * capacity * hidden
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        try:
            try:
                fd = os.open(path, flags, 0o600)
            except FileNotFoundError:  # the first capture of this root: make the directory
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise CaptureExistsError(f"capture file {path} already exists") from None
        try:
            # Sparse: on tmpfs no page is used until `reserve` allocates it.
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        writer = cls(path, fd, mapping, n_layers, capacity, hidden)
        writer._header[:8] = [MAGIC, VERSION, n_layers, capacity, hidden, 0, STATUS_OK, os.getpid()]
        return writer

    def reserve(self, rows: int) -> None:
        """Allocates the pages of positions [0, rows) before they are written. Raises OSError
        (ENOSPC) when the directory is full: writing to an unallocated page of a full tmpfs would
        kill the process with SIGBUS instead."""
        rows = min(self.capacity, rows)
        if rows <= self._reserved:
            return
        # Reserve ahead so that a decode step does not cost a system call per token.
        target = min(self.capacity, max(rows, 2 * self._reserved, 64))
        start = HEADER_BYTES + self._reserved * self._row_bytes
        length = (target - self._reserved) * self._row_bytes
        if length > 0 and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(self._fd, start, length)
        if length > 0:
            _populate(self._mapping, start, length)
        self._reserved = target

    @property
    def reserved(self) -> int:
        """Positions [0, reserved) have their pages allocated."""
        return self._reserved

    @property
    def rows_done(self) -> int:
        return int(self._header[5])

    def advance(self, rows_done: int) -> None:
        """Marks positions [0, rows_done) processed; call only after their rows are written."""
        if rows_done > self._rows_done:
            self._rows_done = rows_done
            self._header[5] = rows_done

    def fail(self, message: str) -> None:
        """Marks the capture unusable; the reader raises CaptureIncompleteError with `message`."""
        encoded = message.encode("utf-8")[: HEADER_BYTES - _MESSAGE_OFFSET - 1]
        self._bytes[_MESSAGE_OFFSET : _MESSAGE_OFFSET + len(encoded)] = np.frombuffer(
            encoded, dtype=np.uint8
        )
        self._header[6] = STATUS_FAILED

    def close(self) -> None:
        """Drops this writer's views (the mapping goes with the last view; a shared mapping needs
        no flush for readers); the file stays until the reader releases it."""
        del self.rows, self._header, self._bytes, self._mapping
        os.close(self._fd)


# madvise(MADV_POPULATE_WRITE): Linux 5.14 on; this Python's mmap may not name it.
_POPULATE_WRITE = getattr(
    mmap, "MADV_POPULATE_WRITE", 23 if os.uname().sysname == "Linux" else None
)


def _populate(mapping: mmap.mmap, start: int, length: int) -> None:
    """Maps the reserved rows' pages writable now, in one system call, rather than one page
    fault at a time as the steps write them (a decode step of 32 capturing requests would take
    a fault per request whenever their rows cross a page). Best effort: an older kernel leaves
    the faults to the steps (and a failure here, the write's own fault)."""
    global _POPULATE_WRITE
    if _POPULATE_WRITE is None:
        return
    first = start - start % mmap.PAGESIZE
    try:
        mapping.madvise(_POPULATE_WRITE, first, min(start + length, len(mapping)) - first)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # a kernel without it: not asked again
            _POPULATE_WRITE = None
    except ValueError:
        pass


def read_header(capture_id: str, *, root: Path | None = None) -> CaptureHeader:
    """API side: the header of a capture file. Raises CaptureMissingError."""
    path = capture_path(capture_root(root), capture_id)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(HEADER_BYTES)
    except FileNotFoundError:
        raise CaptureMissingError(f"no capture file for {capture_id}") from None
    if len(raw) < HEADER_BYTES:
        raise CaptureIncompleteError(f"capture file for {capture_id} is truncated")
    fields = np.frombuffer(raw[:_MESSAGE_OFFSET], dtype=np.int64)
    if int(fields[0]) != MAGIC or int(fields[1]) != VERSION:
        raise CaptureIncompleteError(f"capture file for {capture_id} has an unknown format")
    message = raw[_MESSAGE_OFFSET:].split(b"\0", 1)[0].decode("utf-8", "replace")
    return CaptureHeader(
        n_layers=int(fields[2]),
        capacity=int(fields[3]),
        hidden=int(fields[4]),
        rows_done=int(fields[5]),
        failed=int(fields[6]) != STATUS_OK,
        message=message,
    )


def check_applied(capture_id: str, *, n_rows: int, root: Path | None = None) -> CaptureHeader:
    """API side: raises unless the workers processed `n_rows` positions without a failure.

    For a steer-only request this is the proof that the steering path saw the request.
    """
    header = read_header(capture_id, root=root)
    if header.failed:
        raise CaptureIncompleteError(f"the workers failed request {capture_id}: {header.message}")
    if header.rows_done < n_rows:
        raise CaptureIncompleteError(
            f"capture {capture_id} holds {header.rows_done} of {n_rows} rows"
        )
    return header


def read_capture(
    capture_id: str, *, n_layers: int, hidden: int, n_rows: int, root: Path | None = None
) -> np.ndarray:
    """API side: the captured rows, uint16 bf16 bits shaped [n_layers, n_rows, hidden].

    `n_rows` is prompt tokens + generated tokens - 1. Raises CaptureMissingError when there is no
    file and CaptureIncompleteError when it is short, failed, or shaped otherwise than asked.
    """
    header = check_applied(capture_id, n_rows=n_rows, root=root)
    if (header.n_layers, header.hidden) != (n_layers, hidden) or header.capacity < n_rows:
        raise CaptureIncompleteError(
            f"capture {capture_id} is [{header.n_layers}, {header.capacity}, {header.hidden}], "
            f"expected [{n_layers}, >= {n_rows}, {hidden}]"
        )
    path = capture_path(capture_root(root), capture_id)
    size = HEADER_BYTES + 2 * n_layers * header.capacity * hidden
    mapping = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
    rows = mapping[HEADER_BYTES:].view(np.uint16).reshape(header.capacity, n_layers, hidden)
    result = np.ascontiguousarray(rows[:n_rows].transpose(1, 0, 2))
    del rows, mapping
    return result


def release(capture_id: str, *, root: Path | None = None) -> None:
    """API side: deletes the capture file (idempotent). Call however the request ended."""
    with contextlib.suppress(FileNotFoundError):
        capture_path(capture_root(root), capture_id).unlink()


def sweep(*, root: Path | None = None, older_than_s: float = 3600.0) -> int:
    """Deletes capture files older than `older_than_s` (left by crashed processes); returns the
    number deleted."""
    directory = capture_root(root)
    if not directory.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    removed = 0
    for path in directory.glob(f"*{SUFFIX}"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    if removed:
        logger.info("removed %d stale capture files from %s", removed, directory)
    return removed
