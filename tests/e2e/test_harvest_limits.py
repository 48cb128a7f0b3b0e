"""The harvest limits an operator sets, on a node of its own: the deployment's capacity
(`429 harvest_capacity_exceeded`), a key's monthly quota (`429 harvest_quota_exceeded`), and the
node's number of waiting long-polls (answered at once, `X-Acs-Longpoll: declined`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import MODEL_ID, ServerProcess, running_server

pytestmark = pytest.mark.e2e

BODY = {"model": MODEL_ID, "prompts": ["The sky is", "Grass is"], "layers": [1]}


@pytest.fixture(scope="module")
def node(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    env = {
        "VLLM_ACS_HARVEST_CAPACITY": "1",
        "VLLM_ACS_HARVEST_MONTHLY_QUOTA": "2",
        "VLLM_ACS_HARVEST_LONG_POLLS": "0",
    }
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("harvest-limits"), env=env) as s:
        yield s


def _client(node: ServerProcess, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=node.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def _until(client: httpx.Client, job_id: str, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (job := client.get(f"/v1/harvest/{job_id}").json())["status"] not in wanted:
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job


def test_capacity_quota_and_declined_long_polls(node):
    # Key A's harvest stays running: no running slot, one queue place (it waits to write).
    held = _client(node, node.create_key("limits-a", "--max-running", "0", "--max-waiting", "1"))
    other = _client(node, node.create_key("limits-b"))
    submitted = held.post("/v1/harvest", json=BODY)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    _until(held, job_id, {"running"})

    # Past the node's waiting reads (0 here) a long-poll answers at once.
    started = time.monotonic()
    read = held.get(f"/v1/harvest/{job_id}", params={"wait": 30})
    assert time.monotonic() - started < 5
    assert read.status_code == 200 and read.json()["status"] == "running"
    assert read.headers["x-acs-longpoll"] == "declined" and read.headers["retry-after"] == "3"

    # The deployment takes one harvest at a time here: another key waits for it.
    refused = other.post("/v1/harvest", json=BODY)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "harvest_capacity_exceeded"
    assert int(refused.headers["retry-after"]) > 0

    assert held.delete(f"/v1/harvest/{job_id}").json()["status"] == "cancelled"

    # Key B's two harvests this month run; the third is refused until next month.
    # (A cancelled harvest has ended: it no longer counts.)
    for _ in range(2):
        accepted = other.post("/v1/harvest", json=BODY)
        assert accepted.status_code == 202, accepted.text
        assert _until(other, accepted.json()["job_id"], {"done", "failed"})["status"] == "done"
    third = other.post("/v1/harvest", json=BODY)
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "harvest_quota_exceeded"
    assert third.headers["x-should-retry"] == "false"
