"""Capture files: worker-side writer, API-side reader, short and failed captures, cleanup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from vllm_acs.activations.store import (
    CaptureExistsError,
    CaptureIncompleteError,
    CaptureMissingError,
    CaptureWriter,
    capture_root,
    check_applied,
    read_capture,
    read_header,
    release,
    sweep,
)


def _write(root: Path, capture_id: str, rows_done: int) -> np.ndarray:
    writer = CaptureWriter.create(root, capture_id, n_layers=2, capacity=5, hidden=4)
    data = np.arange(5 * 2 * 4, dtype=np.uint16).reshape(5, 2, 4)
    writer.reserve(rows_done)
    writer.rows[:rows_done] = data[:rows_done]
    writer.advance(rows_done)
    writer.close()
    return data


def test_rows_written_by_the_worker_are_read_layer_major(tmp_path: Path):
    data = _write(tmp_path, "req-1", rows_done=5)
    rows = read_capture("req-1", n_layers=2, hidden=4, n_rows=4, root=tmp_path)
    assert rows.shape == (2, 4, 4) and rows.dtype == np.uint16
    assert np.array_equal(rows, data[:4].transpose(1, 0, 2))
    header = read_header("req-1", root=tmp_path)
    assert (header.n_layers, header.capacity, header.hidden, header.rows_done) == (2, 5, 4, 5)


def test_a_short_capture_is_an_error_not_fewer_rows(tmp_path: Path):
    _write(tmp_path, "short", rows_done=3)
    with pytest.raises(CaptureIncompleteError, match="3 of 4"):
        read_capture("short", n_layers=2, hidden=4, n_rows=4, root=tmp_path)


def test_a_missing_capture_is_an_error(tmp_path: Path):
    with pytest.raises(CaptureMissingError):
        read_capture("never", n_layers=2, hidden=4, n_rows=1, root=tmp_path)
    with pytest.raises(CaptureMissingError):
        check_applied("never", n_rows=1, root=tmp_path)


def test_a_shape_mismatch_is_an_error(tmp_path: Path):
    _write(tmp_path, "shape", rows_done=5)
    with pytest.raises(CaptureIncompleteError, match="expected"):
        read_capture("shape", n_layers=3, hidden=4, n_rows=2, root=tmp_path)


def test_a_failed_request_is_an_error_with_the_workers_message(tmp_path: Path):
    writer = CaptureWriter.create(tmp_path, "bad", n_layers=0, capacity=0, hidden=4)
    writer.advance(10)
    writer.fail("layer 9 is not in [0, 4)")
    with pytest.raises(CaptureIncompleteError, match=r"layer 9 is not in \[0, 4\)"):
        check_applied("bad", n_rows=1, root=tmp_path)


def test_steer_only_requests_are_checked_by_positions_processed(tmp_path: Path):
    writer = CaptureWriter.create(tmp_path, "steer", n_layers=0, capacity=0, hidden=4)
    writer.advance(7)
    assert check_applied("steer", n_rows=7, root=tmp_path).rows_done == 7
    with pytest.raises(CaptureIncompleteError):
        check_applied("steer", n_rows=8, root=tmp_path)


def test_capture_ids_are_unique(tmp_path: Path):
    CaptureWriter.create(tmp_path, "dup", n_layers=1, capacity=1, hidden=4).close()
    with pytest.raises(CaptureExistsError):
        CaptureWriter.create(tmp_path, "dup", n_layers=1, capacity=1, hidden=4)


def test_release_is_idempotent_and_sweep_removes_stale_files(tmp_path: Path):
    _write(tmp_path, "gone", rows_done=1)
    release("gone", root=tmp_path)
    release("gone", root=tmp_path)
    assert not list(tmp_path.iterdir())
    _write(tmp_path, "old", rows_done=1)
    _write(tmp_path, "new", rows_done=1)
    old = tmp_path / "old.acscap"
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sweep(root=tmp_path, older_than_s=3600) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["new.acscap"]


def test_the_file_is_sparse_until_rows_are_reserved(tmp_path: Path):
    writer = CaptureWriter.create(tmp_path, "big", n_layers=4, capacity=10_000, hidden=1024)
    assert os.stat(writer.path).st_blocks * 512 < 1 << 20
    writer.reserve(1)
    writer.close()


def test_the_default_root_is_shared_memory_when_there_is_one(tmp_path: Path):
    assert capture_root(tmp_path) == tmp_path
    if os.access("/dev/shm", os.W_OK):
        assert capture_root() == Path("/dev/shm/vllm-acs")
