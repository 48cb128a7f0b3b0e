"""A Loom branch survives a SIGKILL of its node: the restart's reaper hands the branch back, it
runs again into the same Nodes, they end `ready` with their full text, and only that run is
charged; the branch's Idempotency-Key then answers its result.

One node on embedded SQLite, killed with its whole process group while the branch streams,
then started again on the same VLLM_ACS_HOME (the same database) and a new port.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.e2e.crashed_node import RESTARTED_LEASE_MS, crash_node, read_sqlite
from tests.harness import group_members, started

pytestmark = pytest.mark.e2e


def test_a_branch_killed_mid_stream_is_finished_once_by_the_restart(
    tiny_model_dir, tmp_path_factory
):
    home = tmp_path_factory.mktemp("looms-crash-home")
    first = crash_node(tiny_model_dir, home, "node-first")
    body = {"n": 2, "max_tokens": 2000, "seed": 7, "stream": True}
    with started(first):
        record = first.create_key_record("looms-crash")
        auth = {"Authorization": f"Bearer {record['key']}"}
        with httpx.Client(base_url=first.base_url, headers=auth, timeout=60) as client:
            loom = client.post("/v1/looms", json={"prompt": "Far away"}).json()
            root = loom["nodes"][0]["id"]
            url = f"/v1/looms/{loom['id']}/nodes/{root}/branch"
            headers = {"Idempotency-Key": "crash-branch"}
            with client.stream("POST", url, json=body, headers=headers) as stream:
                lines = stream.iter_lines()
                assert next(lines) == "event: started"
                children = json.loads(next(lines).removeprefix("data: "))["nodes"]
                assert next(lines) == ""
                assert next(lines) == "event: delta"  # the engine is generating
                pgid = first.process.pid
                os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(pgid) == [], "processes of the killed node survived SIGKILL"

    ids = [child["id"] for child in children]
    job_id = children[0]["generation"]["branch_id"]
    # Killed mid-branch: claimed, its children generating, nothing charged yet.
    (job,) = read_sqlite(home, "SELECT status, attempt FROM jobs WHERE id = ?", job_id)
    assert (job["status"], job["attempt"]) == ("running", 0)
    rows = read_sqlite(home, "SELECT status FROM loom_nodes WHERE job_id = ?", job_id)
    assert [r["status"] for r in rows] == ["generating", "generating"]
    assert read_sqlite(home, "SELECT id FROM usage_rows WHERE request_id = ?", job_id) == []

    second = crash_node(tiny_model_dir, home, "node-second", lease_ms=RESTARTED_LEASE_MS)
    with started(second):
        with httpx.Client(base_url=second.base_url, headers=auth, timeout=60) as client:
            deadline = time.monotonic() + 300
            while True:
                nodes = {n["id"]: n for n in client.get(f"/v1/looms/{loom['id']}").json()["nodes"]}
                if all(nodes[i]["status"] != "generating" for i in ids if i in nodes):
                    break
                assert time.monotonic() < deadline, second.log_tail()
                time.sleep(0.5)
            # The same Nodes, finished once: no extra children, full text, ready.
            assert nodes[root]["children"] == [i for i in ids if i in nodes]
            assert len(nodes) == 1 + len(nodes[root]["children"])
            for node_id in nodes[root]["children"]:
                node = nodes[node_id]
                assert node["status"] == "ready" and node["text"]
                assert node["generation"]["finish_reason"] in ("length", "stop")
            # The key's retry of the branch gets its stored answer.
            again = client.post(url, json=body, headers=headers)
            assert again.status_code == 201, again.text
            assert again.headers["idempotent-replayed"] == "true"
            assert [n["id"] for n in again.json()["nodes"]] == nodes[root]["children"]

        (job,) = read_sqlite(home, "SELECT status, attempt FROM jobs WHERE id = ?", job_id)
        assert (job["status"], job["attempt"]) == ("succeeded", 1)
        deadline = time.monotonic() + 30
        while not (
            rows := read_sqlite(home, "SELECT status FROM usage_rows WHERE request_id = ?", job_id)
        ):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert [r["status"] for r in rows] == [200]
