"""The local job-file store: atomic whole-file writes, byte ranges, sizes, safe names only."""

from __future__ import annotations

import pytest

from vllm_acs.storage.files import FileNameError, LocalFileStore


def test_write_read_size_and_replace(tmp_path):
    store = LocalFileStore(tmp_path)
    stored = store.write("harvests/job_1/manifest.json", b"{}")
    assert (stored.name, stored.size) == ("harvests/job_1/manifest.json", 2)
    assert store.read("harvests/job_1/manifest.json") == b"{}"
    store.write("harvests/job_1/manifest.json", b'{"a": 1}')
    assert store.size("harvests/job_1/manifest.json") == 8
    assert store.size("harvests/job_1/missing") is None
    # No temporary file is left beside it.
    assert [p.name for p in (tmp_path / "harvests" / "job_1").iterdir()] == ["manifest.json"]
    with pytest.raises(FileNotFoundError):
        store.read("harvests/job_1/missing")


def test_ranges_come_in_chunks(tmp_path):
    store = LocalFileStore(tmp_path)
    store.CHUNK = 7
    data = bytes(range(256)) * 4
    store.write("f/data", data)
    assert b"".join(store.open_range("f/data", 0, len(data) - 1)) == data
    assert b"".join(store.open_range("f/data", 100, 199)) == data[100:200]
    assert b"".join(store.open_range("f/data", 1000, 5000)) == data[1000:]


def test_delete_tree(tmp_path):
    store = LocalFileStore(tmp_path)
    store.write("harvests/job_1/a", b"1")
    store.write("harvests/job_1/_state/b", b"2")
    store.write("harvests/job_2/a", b"3")
    store.delete_tree("harvests/job_1")
    store.delete_tree("harvests/job_1")  # idempotent
    assert store.size("harvests/job_1/a") is None and store.size("harvests/job_2/a") == 1


@pytest.mark.parametrize("name", ["", "/etc/passwd", "a/../b", "a//b", "..", "a/./b", "a b"])
def test_names_that_could_leave_the_root_are_refused(tmp_path, name):
    with pytest.raises(FileNameError):
        LocalFileStore(tmp_path).write(name, b"x")
