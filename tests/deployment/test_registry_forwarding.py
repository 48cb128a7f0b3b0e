"""Two nodes of two models behind one database: each lists both models, answers the other's by
forwarding (non-streamed, streamed, with capture; admitted and charged once, on the node that
serves it; a Loom branch and its replay), and when the serving node is killed mid-stream: the
stream ends with an error frame, its model is not found at once and leaves the list, and its slot
and Hold expire with the lease.

Real nodes on PostgreSQL and Redis (tests/e2e/shared_nodes.py), a short heartbeat so that the
registry's changes show within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.shared_nodes import shared_nodes
from tests.harness import MODEL_ID, ServerProcess, group_members, wait_until
from vllm_acs.client import decode_residual_stream

pytestmark = pytest.mark.e2e

OTHER_ID = "tiny-other"
OTHER_CHECKPOINT = "vllm-acs/tiny-other"
HEARTBEAT_MS = 500
# A key per node's URL for the reads of /v1/models.
KEYS: dict[str, str] = {}
TTL_MS = 3000
# The Redis lease of a slot and a Hold: a dead node's expire this long after it died.
LEASE_MS = 4000


@pytest.fixture(scope="module")
def deployment(tiny_model_dir, tmp_path_factory) -> Iterator[tuple[list[ServerProcess], str]]:
    home = tmp_path_factory.mktemp("deployment-home")
    env = {
        "VLLM_ACS_REGISTRY_HEARTBEAT_MS": str(HEARTBEAT_MS),
        "VLLM_ACS_REGISTRY_NODE_TTL_MS": str(TTL_MS),
        "VLLM_ACS_LEASE_MS": str(LEASE_MS),
    }
    per_node = [
        ({}, []),
        ({"VLLM_ACS_MODEL_ID": OTHER_ID}, ["--served-model-name", OTHER_CHECKPOINT]),
    ]
    with shared_nodes(tiny_model_dir, home, env, per_node=per_node) as (nodes, url):
        yield nodes, url.replace("postgresql+asyncpg://", "postgresql://")


def _query(database_url: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    async def run() -> list[Any]:
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def _models(node: ServerProcess) -> list[dict]:
    """GET /v1/models (it needs a key, of any account)."""
    key = KEYS.get(node.base_url) or KEYS.setdefault(node.base_url, node.create_key("models"))
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{node.base_url}/v1/models", headers=headers, timeout=10).json()["data"]


def _ids(node: ServerProcess) -> list[str]:
    return [m["id"] for m in _models(node)]


def test_every_node_lists_every_live_model(deployment):
    nodes, _ = deployment
    for node in nodes:
        wait_until(lambda node=node: set(_ids(node)) == {MODEL_ID, OTHER_ID}, "both models listed")
    mine, theirs = _models(nodes[0])
    assert (mine["id"], mine["default"]) == (MODEL_ID, True)
    assert (theirs["id"], theirs["default"], theirs["served_model_name"]) == (
        OTHER_ID,
        False,
        OTHER_CHECKPOINT,
    )
    auth = {"Authorization": f"Bearer {KEYS[nodes[0].base_url]}"}
    card = httpx.get(f"{nodes[0].base_url}/v1/models/{OTHER_ID}", headers=auth)
    assert card.status_code == 200 and card.json()["capabilities"]["max_model_len"] == 2048


def test_another_nodes_model_is_answered_by_forwarding_once(deployment):
    (node_a, node_b), database_url = deployment
    key = node_a.create_key_record("deployment")
    auth = {"Authorization": f"Bearer {key['key']}"}
    wait_until(lambda: OTHER_ID in _ids(node_a), "the other model listed")
    with httpx.Client(base_url=node_a.base_url, headers=auth, timeout=120) as client:
        rid = uuid.uuid4().hex
        body = {"model": OTHER_ID, "prompt": "The sky is", "max_tokens": 4, "temperature": 0}
        plain = client.post("/v1/completions", json=body, headers={"X-Request-Id": rid})
        assert plain.status_code == 200, plain.text
        assert plain.json()["model"] == OTHER_CHECKPOINT
        assert plain.headers["x-request-id"] == rid
        direct = httpx.post(
            f"{node_b.base_url}/v1/completions", json=body, headers=auth, timeout=120
        )
        assert plain.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
        # Streamed, through the forwarder as it comes.
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            assert stream.status_code == 200
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        # With capture: the activations come back from the serving node's workers.
        capture = client.post(
            "/v1/completions", json={**body, "max_tokens": 1, "output_residual_stream": [1]}
        )
        assert capture.status_code == 200, capture.text
        rows = decode_residual_stream(capture.json())
        assert np.asarray(rows).size > 0
        # One usage row for the forwarded request: charged by the node that served it, once.
        usage = wait_until(
            lambda: _query(database_url, "SELECT model FROM usage_rows WHERE request_id = $1", rid),
            "the usage row of the forwarded request",
        )
        assert [row["model"] for row in usage] == [OTHER_ID]
        # A model nobody serves is still this node's 400.
        missing = client.post("/v1/completions", json={**body, "model": "nobody"})
        assert (missing.status_code, missing.json()["error"]["code"]) == (400, "model_not_found")
    assert node_a.metric("acs_forwarded_requests_total") >= 3


def test_a_loom_branch_and_its_replay_for_another_nodes_model_are_answered_there(deployment):
    """A replay names no model: the forwarder finds the one its Node recorded."""
    (node_a, _), _ = deployment
    auth = {"Authorization": f"Bearer {node_a.create_key('deployment-loom')}"}
    wait_until(lambda: OTHER_ID in _ids(node_a), "the other model listed")
    with httpx.Client(base_url=node_a.base_url, headers=auth, timeout=120) as client:
        loom = client.post("/v1/looms", json={"prompt": "The sky is"})
        assert loom.status_code == 201, loom.text
        nodes = f"/v1/looms/{loom.json()['id']}/nodes"
        root = loom.json()["nodes"][0]["id"]
        body = {"model": OTHER_ID, "max_tokens": 4, "n": 1, "seed": 7, "temperature": 1.0}
        branched = client.post(f"{nodes}/{root}/branch", json=body)
        assert branched.status_code == 201, branched.text
        (child,) = branched.json()["nodes"]
        assert child["generation"]["model"] == OTHER_ID
        forwarded = node_a.metric("acs_forwarded_requests_total")
        replay = client.post(f"{nodes}/{child['id']}/replay")
        assert replay.status_code == 200, replay.text  # here: 400 model_not_found
        assert replay.json()["identical"] is True and replay.json()["text"] == child["text"]
        assert node_a.metric("acs_forwarded_requests_total") == forwarded + 1


def test_a_node_killed_mid_stream_cuts_the_stream_leaks_no_slot_and_leaves_the_list(deployment):
    (node_a, node_b), _ = deployment
    key = node_a.create_key("deployment-dead", "--max-running", "1", "--max-waiting", "0")
    auth = {"Authorization": f"Bearer {key}"}
    wait_until(lambda: OTHER_ID in _ids(node_a), "the other model listed")
    body = {"model": OTHER_ID, "prompt": "Once", "max_tokens": 2000, "stream": True}
    pgid = node_b.process.pid
    with httpx.Client(base_url=node_a.base_url, headers=auth, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"choices"' in first  # B is generating, through A
            os.killpg(pgid, signal.SIGKILL)
            rest = []
            with contextlib.suppress(httpx.HTTPError):  # or the connection is cut
                rest = list(lines)
        # The stream ended without its [DONE]: an error frame (or a cut connection).
        assert "data: [DONE]" not in rest
        assert any('"error"' in line for line in rest) or not rest
    wait_until(lambda: not group_members(pgid), "the killed node's processes gone", 15)
    # At once (the connection fails: that node is ejected, not waited for).
    started = time.monotonic()
    one = {"model": OTHER_ID, "prompt": "x", "max_tokens": 1}
    refused = httpx.post(f"{node_a.base_url}/v1/completions", json=one, headers=auth)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "model_not_found")
    assert time.monotonic() - started < TTL_MS / 1000
    # It leaves the list once its heartbeat is older than the TTL.
    wait_until(lambda: _ids(node_a) == [MODEL_ID], "the dead node's model left the list", 15)
    # The dead node's slot of this key (max_running 1) and its Hold expire with their lease:
    # the key runs again on the live node, nothing leaked.
    own = {"model": MODEL_ID, "prompt": "x", "max_tokens": 1}
    wait_until(
        lambda: (
            httpx.post(f"{node_a.base_url}/v1/completions", json=own, headers=auth).status_code
            == 200
        ),
        "the key's slot is free again after the dead node's lease",
        LEASE_MS / 1000 + 20,
    )
