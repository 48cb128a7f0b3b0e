"""A client's side of completion jobs and harvests in e2e tests: submit, then poll until ended.

Every wait has a bound; an AssertionError with the nodes' log tails when it passes.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.e2e.shared_nodes import node_logs
from tests.harness import ServerProcess

ENDED = {"succeeded", "failed", "cancelled", "expired"}


def submit_job(client: httpx.Client, url: str, body: dict[str, Any], idempotency_key: str) -> str:
    """POST a completion job to the node (or proxy) at `url`; its id, once answered 202."""
    response = client.post(
        f"{url}/v1/completion-jobs", json=body, headers={"Idempotency-Key": idempotency_key}
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/completion-jobs/{job['id']}"
    assert job["status"] == "queued"
    return job["id"]


def wait_jobs_ended(
    client: httpx.Client,
    urls: list[str],
    job_ids: list[str],
    timeout_s: float,
    nodes: list[ServerProcess],
) -> dict[str, dict[str, Any]]:
    """Every job's final object, polled round-robin over `urls` until all have ended."""
    ended: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    turn = 0
    while len(ended) < len(job_ids):
        for job_id in [j for j in job_ids if j not in ended]:
            turn += 1
            response = client.get(f"{urls[turn % len(urls)]}/v1/completion-jobs/{job_id}")
            assert response.status_code == 200, response.text
            if response.json()["status"] in ENDED:
                ended[job_id] = response.json()
        if len(ended) < len(job_ids):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(job_ids) - len(ended)} job(s) not ended after {timeout_s}s:\n"
                    f"{node_logs(nodes)}"
                )
            time.sleep(0.5)
    return ended


def wait_harvest_ended(
    client: httpx.Client, job_id: str, nodes: list[ServerProcess], timeout_s: float = 300
) -> dict[str, Any]:
    """The harvest once it is no longer pending or running (`client` has the base URL and the
    key), long-polled with `?wait=`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = client.get(f"/v1/harvest/{job_id}", params={"wait": 20})
        assert answer.status_code == 200, answer.text
        if answer.json()["status"] not in ("pending", "running"):
            return answer.json()
    raise AssertionError(f"harvest {job_id} not ended after {timeout_s}s:\n{node_logs(nodes)}")
