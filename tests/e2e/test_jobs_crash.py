"""A completion job survives a SIGKILL of its node: the restarted node's reaper hands the job
back (attempt 1), it runs again and succeeds once, and only that run is charged.

One node on embedded SQLite, killed with its whole process group mid-job, then started again on
the same VLLM_ACS_HOME (the same database) and a new port.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from tests.e2e.crashed_node import RESTARTED_LEASE_MS, crash_node, read_sqlite
from tests.harness import ServerProcess, group_members, started

pytestmark = pytest.mark.e2e

# A key whose requests wait in its queue and never run (no running slot, a queue place): the
# claimed job's run waits for as long as the node lives, so the kill lands mid-job however fast
# the machine generates. `keys set --max-running 1` lets the restarted node run it.
HELD_AT_ADMISSION = ("--max-running", "0", "--max-waiting", "4")
BODY = {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 64, "temperature": 0}
ENDED = {"succeeded", "failed", "cancelled", "expired"}


def _job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/completion-jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def _wait_status(
    client: httpx.Client, job_id: str, wanted: set[str], timeout_s: float, server: ServerProcess
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = _job(client, job_id)
        if job["status"] in wanted:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} still {job['status']} after {timeout_s}s, not one of {wanted}:\n"
                f"{server.log_tail()}"
            )
        time.sleep(0.2)


def test_a_killed_node_leaves_its_job_to_the_restart_which_runs_it_once(
    tiny_model_dir, tmp_path_factory
):
    home = tmp_path_factory.mktemp("jobs-crash-home")
    first = crash_node(tiny_model_dir, home, "node-first")
    with started(first):
        record = first.create_key_record("jobs-crash", *HELD_AT_ADMISSION)
        auth = {"Authorization": f"Bearer {record['key']}"}
        with httpx.Client(base_url=first.base_url, headers=auth, timeout=60) as client:
            submitted = client.post(
                "/v1/completion-jobs", json=BODY, headers={"Idempotency-Key": "crash-1"}
            )
            assert submitted.status_code == 202, submitted.text
            job_id = submitted.json()["id"]
            assert submitted.headers["location"] == f"/v1/completion-jobs/{job_id}"
            _wait_status(client, job_id, {"running"}, 60, first)
            first.wait_for_metric("acs_waiting_requests", 1)  # the claimed job's run, waiting

        pgid = first.process.pid
        os.killpg(pgid, signal.SIGKILL)
        # EngineCore and its workers are in the group too: none may outlive the kill, or the
        # restart would share the machine (and the job) with a half-dead node.
        deadline = time.monotonic() + 15
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(pgid) == [], "processes of the killed node survived SIGKILL"

    # The kill came mid-job: the table still has the dead node's claim and nothing was charged.
    # Were it already over, the rest of the test would prove nothing about a crash.
    (row,) = read_sqlite(home, "SELECT status, attempt FROM jobs WHERE id = ?", job_id)
    assert (row["status"], row["attempt"]) == ("running", 0)
    assert read_sqlite(home, "SELECT id FROM usage_rows WHERE request_id = ?", job_id) == []

    # While no node runs: the key may run from now on.
    first.cli("keys", "set", record["prefix"], "--max-running", "1")
    second = crash_node(tiny_model_dir, home, "node-second", lease_ms=RESTARTED_LEASE_MS)
    assert second.port != first.port
    with started(second):
        with httpx.Client(base_url=second.base_url, headers=auth, timeout=60) as client:
            # The lease has expired by the time the node is up; then the reaper (every 5 s), the
            # claim and the generation on a loaded machine.
            job = _wait_status(client, job_id, ENDED, 240, second)
            assert job["status"] == "succeeded", (job, second.log_tail())
            assert job["result_status"] == 200
            result = client.get(f"/v1/completion-jobs/{job_id}/result")
        assert result.status_code == 200, result.text
        completion = result.json()
        assert completion["object"] == "text_completion"
        usage = completion["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0

        # The usage row is written by the ledger's queue, possibly just after the job ended.
        deadline = time.monotonic() + 30
        while True:
            rows = read_sqlite(
                home,
                "SELECT status, prompt_tokens, completion_tokens, key_id FROM usage_rows "
                "WHERE request_id = ?",
                job_id,
            )
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [tuple(r) for r in rows] == [
            (200, usage["prompt_tokens"], usage["completion_tokens"], record["id"])
        ]

        # The operator's report charges the key that one run and nothing for the killed attempt.
        report = second.cli("usage")["per_key_model_month"]
        charged = [r for r in report if r["key_prefix"] == record["prefix"]]
        assert sum(r["requests"] for r in charged) == 1, charged
        assert sum(r["prompt_tokens"] for r in charged) == usage["prompt_tokens"]
        assert sum(r["completion_tokens"] for r in charged) == usage["completion_tokens"]
        assert sum(r["total_tokens"] for r in charged) == usage["total_tokens"]

        # One hand-back (the reaper's), seen as the operator sees it and in the table itself.
        shown = second.cli("jobs", "show", job_id)
        assert (shown["status"], shown["attempt"]) == ("succeeded", 1)
        (row,) = read_sqlite(home, "SELECT attempt FROM jobs WHERE id = ?", job_id)
        assert row["attempt"] == 1
