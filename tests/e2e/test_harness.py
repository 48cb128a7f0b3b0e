"""The test harness itself: stopping a server leaves none of vLLM's processes behind."""

from __future__ import annotations

import httpx
import pytest

from tests.harness import ServerProcess, group_members

pytestmark = pytest.mark.e2e


def test_stop_leaves_no_orphan_process(tiny_model_dir, tmp_path):
    server = ServerProcess(model_dir=tiny_model_dir, log_path=tmp_path / "server.log").start()
    pgid = server.process.pid
    try:
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        # The API server, vLLM's EngineCore and its worker all run in the server's group.
        assert len(group_members(pgid)) >= 2
    finally:
        server.stop()
    assert group_members(pgid) == []
