"""A deployment behind nginx behaves as one node, whichever node each request lands on: keys,
budgets, limits, completion jobs, harvests (spread in parts over both nodes of their model, the
same files as a one-node harvest, fetched from SeaweedFS by presigned URLs) and Looms; each
model's status counts its live nodes; the other model's requests are forwarded (streamed, with
capture, charged once by the serving node); a node killed mid-part leaves its part to the other
node of its model, which resumes it after the part's last complete shard; the
single node of a model killed mid-stream cuts the stream, takes its model out of the list at once
for requests and within its TTL for the list (its status: not warm), and leaks no slot of the
key.

Three real nodes on one private PostgreSQL database and Redis prefix (tests/e2e/shared_nodes.py)
with the SeaweedFS store: two of `tiny-llama`, one of `tiny-other`; nginx round-robin over all
three (tests/nginx.py). Clients talk to nginx with the openai SDK where it can send the request,
httpx elsewhere. Which node answered is read from each node's `acs_requests_total`: nginx hands
consecutive requests of one client to the nodes in turn, so a request sent once per node lands
on every node. The two kills come last (each takes a node away).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI
from safetensors.torch import load

from tests.e2e.access_load import BODY, COST, burst, spent, tally
from tests.e2e.jobs_client import submit_job, wait_harvest_ended, wait_jobs_ended
from tests.e2e.shared_nodes import Cluster, node_logs, shared_nodes
from tests.harness import (
    CHECKPOINT,
    MODEL_ID,
    ServerProcess,
    frozen_groups,
    group_members,
    sigkill_group,
    wait_until,
)
from tests.nginx import Nginx, running_nginx
from tests.reference import assert_rows_close
from tests.slot_holder import holding_stream, wait_for_the_slot
from vllm_acs.client import decode_residual_stream, download_harvest
from vllm_acs.harvest.stats import LayerStats

pytestmark = pytest.mark.e2e

OTHER_ID = "tiny-other"
OTHER_CHECKPOINT = "vllm-acs/tiny-other"
HEARTBEAT_MS = 500
# A silent node leaves the list after this; long enough that a stall of three nodes on two
# cores does not drop a live one.
TTL_MS = 5000
# Slots and Holds (Redis): renewed every third; nothing here waits for one to expire.
LEASE_MS = 10000
# Jobs: a dead node's harvest is taken back within seconds (the runner renews every third; below
# 4 s a loaded machine's stall loses healthy jobs, tests/e2e/test_jobs_shared.py).
JOB_LEASE_MS = 5000
HIDDEN = 128  # the tiny model's
# The harvest killed mid-way: 60 shards of 4 prompts, 2 prompts in the engine at a time. The
# kill is chosen with both nodes frozen, so the pace of the shards does not matter.
KILL_PROMPTS, KILL_SHARD_SIZE, KILL_PROMPT_TOKENS = 240, 4, 60
KILL_SHARDS = KILL_PROMPTS // KILL_SHARD_SIZE
# Harvests run in parts of 4 shards, one part at a time per node: both nodes of a model take
# parts of one harvest.
PART_SHARDS = 4


@dataclass
class Deployment:
    cluster: Cluster
    proxy: Nginx
    store_settings: Any  # Settings of the nodes' S3 store, to read the bucket
    s3_endpoint: str

    @property
    def nodes(self) -> list[ServerProcess]:
        return self.cluster.nodes

    @property
    def url(self) -> str:
        """nginx's base URL."""
        return self.proxy.base_url

    @property
    def other(self) -> ServerProcess:
        return self.nodes[2]

    def logs(self) -> str:
        return node_logs(self.nodes)


@pytest.fixture(scope="module")
def deployment(seaweedfs, tiny_model_dir, tmp_path_factory) -> Iterator[Deployment]:
    home = tmp_path_factory.mktemp("behind-nginx-home")
    prefix = seaweedfs.prefix("nginx")
    env = {
        # One secret for every node, as docs/deployment.md says.
        "VLLM_ACS_URL_SECRET": secrets.token_urlsafe(32),
        "VLLM_ACS_REGISTRY_HEARTBEAT_MS": str(HEARTBEAT_MS),
        "VLLM_ACS_REGISTRY_NODE_TTL_MS": str(TTL_MS),
        "VLLM_ACS_LEASE_MS": str(LEASE_MS),
        "VLLM_ACS_JOB_LEASE_MS": str(JOB_LEASE_MS),
        # The harvest killed mid-way takes seconds: the kill lands inside it.
        "VLLM_ACS_HARVEST_PROMPTS_IN_FLIGHT": "2",
        "VLLM_ACS_HARVEST_PART_SHARDS": str(PART_SHARDS),
        "VLLM_ACS_HARVEST_PARTS_PER_NODE": "1",
        # A request without `model` means the single node's model, whichever node it reaches.
        "VLLM_ACS_DEFAULT_MODEL": OTHER_ID,
        **seaweedfs.env(prefix),
    }
    other = ({"VLLM_ACS_MODEL_ID": OTHER_ID}, ["--served-model-name", OTHER_CHECKPOINT])
    per_node = [({}, []), ({}, []), other]
    with shared_nodes(tiny_model_dir, home, env, per_node=per_node) as (nodes, database_url):
        urls = [n.base_url for n in nodes]
        with running_nginx(urls, home / "nginx", read_timeout_s=120) as proxy:
            deployment = Deployment(
                Cluster.of(nodes, database_url),
                proxy,
                seaweedfs.settings(prefix),
                seaweedfs.endpoint,
            )
            # Every node has seen every other's heartbeat before the tests start.
            key = nodes[0].create_key("nginx-registry")
            for node in nodes:
                wait_until(
                    lambda node=node: _model_ids(node.base_url, key) == {MODEL_ID, OTHER_ID},
                    f"both models listed on {node.base_url}",
                )
            yield deployment


def _sdk(base_url: str, key: str) -> OpenAI:
    """The official SDK; no retries (a retried 429 would hide what the server answered)."""
    return OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=120)


def _model_ids(base_url: str, key: str) -> set[str]:
    return {model.id for model in _sdk(base_url, key).models.list()}


def _answered(nodes: list[ServerProcess], **labels: str) -> list[float]:
    """How many answers each node has counted (`acs_requests_total` with these labels)."""
    return [node.metric("acs_requests_total", **labels) for node in nodes]


def _every_node_answered(before: list[float], after: list[float], what: str) -> None:
    assert all(b > a for a, b in zip(before, after, strict=True)), (what, before, after)


def _envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The spec's error envelope, with the request id of the answer's header."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "request_id"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    assert body["error"]["code"] == code, body
    assert body["request_id"] == response.headers["x-request-id"]
    return body["error"]


def _rows_when(
    read: Callable[[], list[dict[str, Any]]],
    enough: Callable[[list[dict[str, Any]]], bool],
    what: str,
) -> list[dict[str, Any]]:
    """`read()`'s rows once `enough` of them are there (the ledger writes off the response
    path, a moment after the answer)."""
    return wait_until(lambda: rows if enough(rows := read()) else None, what)


def _bucket(deployment: Deployment, call: str, name: str) -> Any:
    """`S3FileStore.<call>(name)` on the nodes' store."""
    from vllm_acs.storage.files_s3 import S3FileStore

    store = S3FileStore.from_settings(deployment.store_settings)
    return asyncio.run(getattr(store, call)(name))


def test_models_through_nginx_lists_both_models_on_every_node(deployment):
    key = deployment.nodes[0].create_key("nginx-models")
    before = _answered(deployment.nodes, route="/v1/models", status="200")
    for _ in deployment.nodes:
        assert _model_ids(deployment.url, key) == {MODEL_ID, OTHER_ID}
    after = _answered(deployment.nodes, route="/v1/models", status="200")
    _every_node_answered(before, after, "each node answered /v1/models")


def test_model_status_counts_the_live_nodes_of_each_model_on_every_node(deployment):
    key = deployment.nodes[0].create_key("nginx-model-status")
    auth = {"Authorization": f"Bearer {key}"}
    for base_url in [*(node.base_url for node in deployment.nodes), deployment.url]:
        for model, count in ((MODEL_ID, 2), (OTHER_ID, 1)):
            status = httpx.get(f"{base_url}/v1/models/{model}/status", headers=auth, timeout=60)
            assert status.status_code == 200, (base_url, status.text)
            assert status.json() == {"id": model, "warm": True, "nodes": count}, base_url
        unknown = httpx.get(f"{base_url}/v1/models/tiny-none/status", headers=auth, timeout=60)
        _envelope(unknown, 404, "model_not_found")


def test_a_request_without_model_means_the_deployments_default_on_every_node(deployment):
    key = deployment.nodes[0].create_key("nginx-default")
    auth = {"Authorization": f"Bearer {key}"}
    for node in deployment.nodes:
        cards = httpx.get(f"{node.base_url}/v1/models", headers=auth, timeout=60).json()["data"]
        assert {card["id"]: card["default"] for card in cards} == {MODEL_ID: False, OTHER_ID: True}
    forwarders = deployment.nodes[:2]
    before = [node.metric("acs_forwarded_requests_total") for node in forwarders]
    for _ in deployment.nodes:
        answer = httpx.post(
            f"{deployment.url}/v1/completions",
            json={"prompt": "The sky is", "max_tokens": 2},
            headers=auth,
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == OTHER_CHECKPOINT
        job = httpx.post(
            f"{deployment.url}/v1/completion-jobs",
            json={"prompt": "The sky is", "max_tokens": 1},
            headers={**auth, "Idempotency-Key": f"default-{secrets.token_hex(8)}"},
            timeout=60,
        )
        assert (job.status_code, job.json()["model"]) == (202, OTHER_ID), job.text
    # The nodes of the other model forwarded what reached them to the default's node.
    after = [node.metric("acs_forwarded_requests_total") for node in forwarders]
    assert all(b > a for a, b in zip(before, after, strict=True)), (before, after)


def test_keys_behave_as_on_one_node_whichever_node_answers(deployment):
    nodes, url = deployment.nodes, deployment.url
    bad = _sdk(url, "acs-bm-" + "x" * 43)
    before = _answered(nodes, status="401")
    for _ in nodes:
        with pytest.raises(openai.AuthenticationError) as refused:
            bad.completions.create(model=MODEL_ID, prompt="x", max_tokens=1)
        error = _envelope(refused.value.response, 401, "invalid_api_key")
        assert error["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError) as refused:
            bad.models.list()
        _envelope(refused.value.response, 401, "invalid_api_key")
        for method, path, body in [
            ("GET", "/v1/looms", None),
            ("POST", "/v1/harvest", {"model": MODEL_ID, "prompts": ["x"], "layers": [0]}),
            ("POST", "/v1/completions", {"model": OTHER_ID, "prompt": "x", "max_tokens": 1}),
        ]:
            answer = httpx.request(method, url + path, json=body, timeout=60)
            _envelope(answer, 401, "missing_authorization")
    _every_node_answered(before, _answered(nodes, status="401"), "each node answered 401s")

    # A key made with the CLI works at once, on every node; revoked, it is refused at once.
    record = nodes[0].create_key_record("nginx-keys")
    good = _sdk(url, record["key"])
    before = _answered(nodes, route="/v1/completions", status="200")
    for _ in nodes:
        answer = good.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=2)
        assert answer.model == CHECKPOINT and len(answer.choices) == 1
    after = _answered(nodes, route="/v1/completions", status="200")
    _every_node_answered(before, after, "each node answered the new key")
    nodes[2].cli("keys", "revoke", record["prefix"])
    for _ in nodes:
        with pytest.raises(openai.AuthenticationError) as refused:
            good.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=2)
        _envelope(refused.value.response, 401, "key_revoked")


def test_the_other_model_sent_to_a_default_model_node_is_forwarded(deployment):
    node_a, other, cluster = deployment.nodes[0], deployment.other, deployment.cluster
    key = node_a.create_key("nginx-forwarded")
    forwarder, serving = _sdk(node_a.base_url, key), _sdk(other.base_url, key)
    card = httpx.get(
        f"{node_a.base_url}/v1/models/{OTHER_ID}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert card.status_code == 200, card.text
    assert card.json()["served_model_name"] == OTHER_CHECKPOINT
    assert card.json()["capabilities"]["max_model_len"] == 2048  # the serving node's
    forwarded_before = node_a.metric("acs_forwarded_requests_total")
    ask = {"model": OTHER_ID, "prompt": "The sky is", "max_tokens": 6, "temperature": 0}
    rid = f"nginx-forwarded-{secrets.token_hex(8)}"
    plain = forwarder.completions.with_raw_response.create(
        **ask, extra_headers={"X-Request-Id": rid}
    )
    assert plain.headers["x-request-id"] == rid  # the client's id, kept across the hop
    plain = plain.parse()
    assert plain.model == OTHER_CHECKPOINT
    assert plain.choices[0].text == serving.completions.create(**ask).choices[0].text
    chunks = list(forwarder.completions.create(**ask, stream=True))
    assert {chunk.model for chunk in chunks} == {OTHER_CHECKPOINT}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    captured = forwarder.completions.create(
        **{**ask, "max_tokens": 1}, extra_body={"output_residual_stream": [1]}
    )
    rows = decode_residual_stream(captured)
    assert rows.shape == (1, 4, HIDDEN)  # 4 prompt tokens, one layer, from the serving node
    assert node_a.metric("acs_forwarded_requests_total") >= forwarded_before + 3
    # Charged once, by the node that served it.
    usage = _rows_when(
        lambda: cluster.query("SELECT model FROM usage_rows WHERE request_id = $1", rid),
        lambda rows: len(rows) >= 1,
        "the usage row of the forwarded request",
    )
    assert [row["model"] for row in usage] == [OTHER_ID]
    # A model no node serves is still this node's own 400.
    with pytest.raises(openai.BadRequestError) as refused:
        forwarder.completions.create(**{**ask, "model": "nobody"})
    _envelope(refused.value.response, 400, "model_not_found")


def test_a_budget_holds_exactly_across_the_nodes(deployment):
    nodes, cluster = deployment.nodes, deployment.cluster
    admitted, count = 8, 30
    record = nodes[0].create_key_record(
        "nginx-budget",
        *("--monthly-tokens", str(admitted * COST), "--max-running", "64"),
        *("--max-waiting", "64", "--starts-per-minute", "1000"),
    )
    answered_before = _answered(nodes, route="/v1/completions")
    settled_before = [n.metric("acs_tokens_settled_total") for n in nodes]
    forwarded_before = deployment.other.metric("acs_forwarded_requests_total")
    responses = burst([deployment.url], record["key"], BODY, count)
    assert tally(responses) == {"200": admitted, "budget_exceeded": count - admitted}
    assert spent(responses) == admitted * COST
    for refused in (r for r in responses if r.status_code != 200):
        error = _envelope(refused, 429, "budget_exceeded")
        assert "monthly" in error["message"].lower()
        assert refused.headers["x-should-retry"] == "false"
    # Landed on every node; the node of the other model forwarded its share and charged none.
    after = _answered(nodes, route="/v1/completions")
    _every_node_answered(answered_before, after, "each node took part of the burst")
    assert deployment.other.metric("acs_forwarded_requests_total") > forwarded_before
    settled = [
        n.metric("acs_tokens_settled_total") - b for n, b in zip(nodes, settled_before, strict=True)
    ]
    assert settled[2] == 0 and sum(settled) == admitted * COST, settled
    # The ledger and the durable counter agree with the answers.
    rows = _rows_when(
        lambda: cluster.query(
            "SELECT status, prompt_tokens, completion_tokens FROM usage_rows WHERE key_id = $1",
            record["id"],
        ),
        lambda rows: len([r for r in rows if r["status"] == 200]) >= admitted,
        "a usage row per admitted request",
    )
    ok = [r for r in rows if r["status"] == 200]
    assert len(ok) == admitted
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == admitted * COST
    (counter,) = cluster.query(
        "SELECT coalesce(sum(used), 0) AS used FROM budget_counters WHERE counter LIKE $1",
        f"key:{record['id']}:month:%",
    )
    assert counter["used"] == admitted * COST


def test_a_running_limit_holds_across_the_nodes(deployment):
    nodes, url = deployment.nodes, deployment.url
    key = nodes[0].create_key("nginx-limits", "--max-running", "1", "--max-waiting", "0")
    sdk = _sdk(url, key)
    auth = {"Authorization": f"Bearer {key}"}
    # The only slot, however fast the engine (tests/slot_holder.py; counting on the engine's speed
    # failed on a faster machine: 8,000 plain tokens were over before the refusals).
    with holding_stream(url, auth, {"model": MODEL_ID, "prompt": "Once"}):
        before = _answered(nodes, status="429")
        for _ in nodes:
            with pytest.raises(openai.RateLimitError) as refused:
                sdk.completions.create(model=MODEL_ID, prompt="x", max_tokens=1)
            _envelope(refused.value.response, 429, "queue_full")
            assert int(refused.value.response.headers["retry-after"]) >= 1
        _every_node_answered(before, _answered(nodes, status="429"), "each node refused")
    # The client left mid-stream: its slot is given back, whichever node held it.
    wait_for_the_slot(url, auth, MODEL_ID)


def test_completion_jobs_run_once_and_replay_whichever_node(deployment):
    nodes, url, cluster = deployment.nodes, deployment.url, deployment.cluster
    record = nodes[0].create_key_record("nginx-jobs")
    auth = {"Authorization": f"Bearer {record['key']}"}
    bodies = [
        {"model": model, "prompt": f"Job {i} says", "max_tokens": 3, "temperature": 0}
        for i, model in enumerate([MODEL_ID] * 4 + [OTHER_ID] * 2)
    ]
    with httpx.Client(headers=auth, timeout=120) as client:
        ids = [submit_job(client, url, body, f"nginx-job-{i}") for i, body in enumerate(bodies)]
        assert len(set(ids)) == len(ids)
        # Each submit sent again once per node: the first answer, replayed wherever it lands.
        before = _answered(nodes, route="/v1/completion-jobs", status="202")
        for i, body in enumerate(bodies):
            for _ in nodes:
                again = client.post(
                    f"{url}/v1/completion-jobs",
                    json=body,
                    headers={"Idempotency-Key": f"nginx-job-{i}"},
                )
                assert again.status_code == 202, again.text
                assert again.headers["idempotent-replayed"] == "true"
                assert again.json()["id"] == ids[i]
        after = _answered(nodes, route="/v1/completion-jobs", status="202")
        _every_node_answered(before, after, "each node replayed submits")
        ended = wait_jobs_ended(client, [url], ids, 180, nodes)
        assert Counter(job["status"] for job in ended.values()) == {"succeeded": len(ids)}
        usage: dict[str, dict[str, int]] = {}
        for job_id, body in zip(ids, bodies, strict=True):
            result = client.get(f"{url}/v1/completion-jobs/{job_id}/result")
            assert result.status_code == 200, result.text
            wanted = CHECKPOINT if body["model"] == MODEL_ID else OTHER_CHECKPOINT
            assert result.json()["model"] == wanted
            usage[job_id] = result.json()["usage"]
    # Each ran once: one usage row each, on its first attempt, by a node of its model.
    rows = cluster.usage_rows(record["id"], len(ids))
    assert Counter(r["request_id"] for r in rows) == Counter(ids)
    for row in rows:
        assert row["status"] == 200
        assert row["completion_tokens"] == usage[row["request_id"]]["completion_tokens"]
    jobs = {
        row["id"]: row
        for row in cluster.query(
            "SELECT id, model, owner, attempt FROM jobs WHERE id = ANY($1)", ids
        )
    }
    for job_id in ids:
        job = jobs[job_id]
        assert job["attempt"] == 0
        owner = cluster.owner_node(job["owner"])
        assert (owner is deployment.other) == (job["model"] == OTHER_ID), (job, owner.base_url)


def _prompts(count: int, sizes: tuple[int, int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        [int(t) for t in rng.integers(3, 1000, size=int(rng.integers(*sizes)))]
        for _ in range(count)
    ]


def _harvested(client: httpx.Client, body: dict[str, Any], nodes: list[ServerProcess]) -> dict:
    submitted = client.post("/v1/harvest", json=body)
    assert submitted.status_code == 202, submitted.text
    return wait_harvest_ended(client, submitted.json()["job_id"], nodes, 240)


def test_a_harvest_runs_in_parts_on_both_nodes_and_reads_as_a_one_node_harvest(
    deployment, tmp_path
):
    nodes, url, cluster = deployment.nodes, deployment.url, deployment.cluster
    key = nodes[0].create_key("nginx-harvest")
    auth = {"Authorization": f"Bearer {key}"}
    prompts = _prompts(96, (2, 20), seed=13)
    body = {"model": MODEL_ID, "prompts": prompts, "layers": [0, 2], "shard_size": 4}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as client:
        job = _harvested(client, body, nodes)
        assert job["status"] == "done", (job, deployment.logs())
        # The same prompts on the one node of the other model (the same weights): a one-node
        # harvest of the same input.
        one_node = _harvested(client, {**body, "model": OTHER_ID}, nodes)
        assert one_node["status"] == "done", (one_node, deployment.logs())
    job_id, result = job["job_id"], job["result"]
    n_shards = 96 // 4
    assert result["n_shards"] == n_shards
    assert job["progress"] | {"eta_s": None} == {
        "prompts_done": 96,
        "n_prompts": 96,
        "shards_done": n_shards,
        "n_shards": n_shards,
        "rows_done": sum(map(len, prompts)),
        "n_rows": sum(map(len, prompts)),
        "parts": n_shards // PART_SHARDS,
        "parts_done": n_shards // PART_SHARDS,
        "parts_running": 0,
        "nodes": 0,
        "eta_s": None,
    }
    # Both nodes of the model took parts; the other model's node none.
    owners = cluster.query("SELECT owner FROM jobs WHERE parent_id = $1", job_id)
    ran_parts = Counter(cluster.owner_node(row["owner"]).base_url for row in owners)
    assert set(ran_parts) == {nodes[0].base_url, nodes[1].base_url}, ran_parts
    assert result["timings"]["parts"] == n_shards // PART_SHARDS
    assert result["timings"]["nodes"] == 2
    # The store's presigned GETs, not the node's /downloads: downloads never pass a node.
    for file_url in [result["manifest_url"], result["stats_url"], *result["shard_urls"]]:
        parts = urlsplit(file_url)
        assert f"{parts.scheme}://{parts.netloc}" == deployment.s3_endpoint, file_url
        assert not parts.path.startswith("/downloads")
        query = parse_qs(parts.query)
        assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Signature"]
    files = download_harvest(job, tmp_path / "parts")
    reference = download_harvest(one_node, tmp_path / "one-node")
    # The same layout: shard names, which prompts each holds, the manifest's fields.
    assert [p.name for p in files.shard_paths] == [p.name for p in reference.shard_paths]
    assert [p.name for p in files.shard_paths] == [
        f"shard_{n:05d}.safetensors" for n in range(n_shards)
    ]
    differ = {"job_id", "model", "checkpoint", "tokenizer"}
    assert {k: v for k, v in files.manifest.items() if k not in differ} == {
        k: v for k, v in reference.manifest.items() if k not in differ
    }
    assert files.manifest["complete"] is True
    # Rows in the same order, the tokens exact; the activations as one node computes them
    # (within a bf16 step: which prompts share a step differs between the runs).
    seen = {}
    ours = {index: (rows, tokens) for index, rows, tokens in files.prompts()}
    for index, rows, tokens in reference.prompts():
        seen[index] = ours[index][1].tolist()
        assert ours[index][1].tolist() == tokens.tolist()
        assert tuple(ours[index][0].shape) == (2, len(prompts[index]), HIDDEN)
        got, want = ours[index][0].float().numpy(), rows.float().numpy()
        assert_rows_close(got, want, f"prompt {index}")
    assert seen == dict(enumerate(prompts))
    # The merged statistics equal those of every shard's rows taken in order, within float
    # rounding (the parts were merged with Chan's formula, not added row by row).
    direct = LayerStats(2, HIDDEN)
    for _index, rows, tokens in files.prompts():
        exact = rows.float().numpy()
        if int(tokens[0]) == files.manifest["bos_token_id"]:
            direct.add(exact[:, 1:], exact[:, :1])
        else:
            direct.add(exact)
    merged = load((tmp_path / "parts" / "stats.safetensors").read_bytes())
    for name, want in direct.final().items():
        np.testing.assert_allclose(merged[name].numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)
    # Every node reads the same harvest.
    for node in nodes:
        read = httpx.get(f"{node.base_url}/v1/harvest/{job_id}", headers=auth, timeout=60)
        assert read.status_code == 200, read.text
        assert read.json()["status"] == "done"
        names = [urlsplit(u).path.rsplit("/", 1)[-1] for u in read.json()["result"]["shard_urls"]]
        assert names == [f"shard_{n:05d}.safetensors" for n in range(n_shards)]


def test_a_loom_grows_and_reads_the_same_on_every_node(deployment):
    nodes, url = deployment.nodes, deployment.url
    node_a = nodes[0]
    key = node_a.create_key("nginx-looms")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as client:
        made = client.post("/v1/looms", json={"prompt": "The sky is", "title": "behind nginx"})
        assert made.status_code == 201, made.text
        loom_id, root = made.json()["id"], made.json()["nodes"][0]["id"]
        branch_path = f"/v1/looms/{loom_id}/nodes/{root}/branch"
        own = client.post(branch_path, json={"model": MODEL_ID, "max_tokens": 4, "n": 2})
        assert own.status_code == 201, own.text
        # The other model's branch sent to a node of the default model: forwarded.
        forwarded_before = node_a.metric("acs_forwarded_requests_total")
        theirs = httpx.post(
            node_a.base_url + branch_path,
            json={"model": OTHER_ID, "max_tokens": 4, "n": 1},
            headers=auth,
            timeout=120,
        )
        assert theirs.status_code == 201, theirs.text
        assert node_a.metric("acs_forwarded_requests_total") > forwarded_before
        made_nodes = [*own.json()["nodes"], *theirs.json()["nodes"]]
        models = [n["generation"]["model"] for n in made_nodes]
        assert models == [MODEL_ID, MODEL_ID, OTHER_ID]
        made_ids = [n["id"] for n in made_nodes]
        # Read back from every node, and through nginx.
        for base in [n.base_url for n in nodes] + [url]:
            read = httpx.get(f"{base}/v1/looms/{loom_id}", headers=auth, timeout=60)
            assert read.status_code == 200, read.text
            tree = {n["id"]: n for n in read.json()["nodes"]}
            assert tree[root]["children"] == made_ids
            for made_node in made_nodes:
                stored = tree[made_node["id"]]
                assert (stored["status"], stored["text"]) == ("ready", made_node["text"])
        # Each child reproduces from what it recorded, whichever node replays it.
        for child in made_nodes:
            for _ in nodes:
                replay = client.post(f"/v1/looms/{loom_id}/nodes/{child['id']}/replay")
                assert replay.status_code == 200, replay.text
                assert replay.json()["identical"] is True, replay.json()
            text = client.get(f"/v1/looms/{loom_id}/nodes/{child['id']}/text")
            assert text.text == "The sky is" + child["text"]


def test_a_node_killed_mid_part_leaves_it_to_the_other_node_of_its_model(deployment):
    # Near the end: the killed node stays down.
    nodes, url, cluster = deployment.nodes, deployment.url, deployment.cluster
    record = nodes[0].create_key_record("nginx-harvest-kill")
    auth = {"Authorization": f"Bearer {record['key']}"}
    rng = np.random.default_rng(11)
    prompts = [
        [int(t) for t in rng.integers(3, 1000, size=KILL_PROMPT_TOKENS)]
        for _ in range(KILL_PROMPTS)
    ]
    body = {"model": MODEL_ID, "prompts": prompts, "layers": [1, 3], "shard_size": KILL_SHARD_SIZE}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as client:
        submitted = client.post("/v1/harvest", json=body)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        prefix = f"harvests/{job_id}"

        def running_parts() -> list[dict[str, Any]]:
            return cluster.query(
                "SELECT id, owner FROM jobs WHERE parent_id = $1 AND status = "
                "'running' ORDER BY id",
                job_id,
            )

        def part_manifest(part_id: str) -> dict[str, Any] | None:
            part = int(part_id.rsplit("-p", 1)[1])
            try:
                raw = _bucket(deployment, "read", f"{prefix}/_parts/part_{part:04d}.json")
            except FileNotFoundError:
                return None  # no shard of it written yet
            return json.loads(raw)

        def cut_short() -> tuple[dict[str, Any], dict[str, Any], ServerProcess] | None:
            """Both nodes frozen (SIGSTOP) while a part runs on each: a running part whose
            manifest lists a shard or two and not the part's last two (one write of the frozen
            node may still land), and the manifest; else both nodes go on and None.

            Looked at frozen, not from the part's progress row: on a fast machine a part's
            shards land every few milliseconds, and two landed between a look and the kill."""
            if len({row["owner"] for row in running_parts()}) < 2:
                return None
            with frozen_groups([node.process.pid for node in nodes[:2]]):
                for row in running_parts():
                    manifest = part_manifest(row["id"])
                    if manifest is None or manifest["complete"]:
                        continue
                    if 1 <= len(manifest["shards"]) <= PART_SHARDS - 2:
                        owner = cluster.owner_node(row["owner"])
                        sigkill_group(owner.process.pid)
                        return row, manifest, owner
            return None

        # The part's row and manifest as seen frozen; its node killed before it could go on.
        victim_part, at_kill, victim = wait_until(cut_short, "a part cut short", 120, 0.05)
        assert victim in nodes[:2]
        (survivor,) = [n for n in nodes[:2] if n is not victim]

        # Killed mid-part: the part's manifest lists some of its shards, not all.
        part = int(victim_part["id"].rsplit("-p", 1)[1])
        listed = [int(shard["file"][6:11]) for shard in at_kill["shards"]]
        first_written = _bucket(
            deployment, "modified_at", f"{prefix}/shard_{listed[0]:05d}.safetensors"
        )
        assert first_written is not None

        # Through nginx still (the dead node is skipped): the survivor takes the part back.
        job = wait_harvest_ended(client, job_id, [survivor], 300)
    assert job["status"] == "done", (job, survivor.log_tail())
    assert job["result"]["n_shards"] == KILL_SHARDS
    log = survivor.log_path.read_text()
    # After the shards listed at the kill, or later: a shard whose upload was on its way when the
    # node died may land in the store after the kill (seen once: listed 2, resumed after 3).
    resumed = re.search(rf"harvest {job_id} part {part} resumes after shard (\d+)", log)
    assert resumed, survivor.log_tail()
    last_done = int(resumed.group(1))
    part_end = (part + 1) * PART_SHARDS - 1
    assert listed[-1] <= last_done < part_end, resumed.group(0)
    assert f"harvest {job_id} wrote shard_{last_done + 1:05d}.safetensors" in log
    assert f"harvest {job_id} wrote shard_{listed[0]:05d}.safetensors" not in log
    # The killed node's shards are not rewritten.
    name = f"{prefix}/shard_{listed[0]:05d}.safetensors"
    assert _bucket(deployment, "modified_at", name) == first_written
    (part_row,) = cluster.query("SELECT owner, attempt FROM jobs WHERE id = $1", victim_part["id"])
    assert part_row["attempt"] == 1
    assert cluster.owner_node(part_row["owner"]) is survivor
    # Every shard charged once: one usage row each, the prompts' tokens in all.
    rows = _rows_when(
        lambda: cluster.query(
            "SELECT request_id, prompt_tokens FROM usage_rows WHERE request_id LIKE $1",
            f"{job_id}-shard-%",
        ),
        lambda rows: len(rows) >= KILL_SHARDS,
        "a usage row per shard",
    )
    assert sorted(r["request_id"] for r in rows) == [
        f"{job_id}-shard-{n:05d}" for n in range(KILL_SHARDS)
    ]
    assert sum(r["prompt_tokens"] for r in rows) == KILL_PROMPTS * KILL_PROMPT_TOKENS


def test_the_single_node_of_a_model_killed_mid_stream_takes_its_model_out(deployment):
    # Last: the only node of `tiny-other` goes, while a node of the default model relays its
    # stream, for a key that may run one request at a time.
    url, other = deployment.url, deployment.other
    live = next(node for node in deployment.nodes[:2] if group_members(node.process.pid))
    key = deployment.nodes[0].create_key(
        "nginx-model-gone", "--max-running", "1", "--max-waiting", "0"
    )
    auth = {"Authorization": f"Bearer {key}"}
    sdk = _sdk(url, key)
    assert _model_ids(url, key) == {MODEL_ID, OTHER_ID}
    body = {"model": OTHER_ID, "prompt": "Once", "max_tokens": 2000, "stream": True}
    with httpx.Client(base_url=live.base_url, headers=auth, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"choices"' in first  # the other node generates, through the live one
            sigkill_group(other.process.pid)
            rest = []
            with contextlib.suppress(httpx.HTTPError):  # or the connection is cut
                rest = list(lines)
        # The stream ended without its [DONE]: with an error frame (or a cut connection).
        assert "data: [DONE]" not in rest
        assert any('"error"' in line for line in rest) or not rest
        # Its model's requests answer model_not_found at once: the failed connection ejects
        # the node, no request waits out its heartbeat's TTL.
        started = time.monotonic()
        refused = client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 1})
        _envelope(refused, 400, "model_not_found")
        assert time.monotonic() - started < TTL_MS / 1000
    # ... and its model leaves the list once its heartbeat is older than the TTL.
    wait_until(
        lambda: _model_ids(url, key) == {MODEL_ID},
        "the dead node's model left the list",
        TTL_MS / 1000 + 10,
    )
    # Its row outlives its lease (until the registry forgets it): the model's status says it
    # is not warm; the other model counts its nodes still alive (one when the node killed
    # mid-harvest is gone), once the dead one's heartbeat is older than the TTL. (The model list
    # can drop the other model sooner: its failed connection ejected it.)
    alive = sum(1 for node in deployment.nodes[:2] if group_members(node.process.pid))
    for model, count in ((OTHER_ID, 0), (MODEL_ID, alive)):
        expected = {"id": model, "warm": count > 0, "nodes": count}
        wait_until(
            lambda model=model, expected=expected: (
                httpx.get(
                    f"{live.base_url}/v1/models/{model}/status", headers=auth, timeout=60
                ).json()
                == expected
            ),
            f"{model}'s status counts its live nodes",
            TTL_MS / 1000 + 10,
        )
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.completions.create(model=OTHER_ID, prompt="x", max_tokens=1, stream=stream)
        _envelope(refused.value.response, 400, "model_not_found")
    # The dead node's slot of this key (max_running 1) and its Hold expire with their lease:
    # the key runs again, on the model still served; nothing leaked.
    wait_until(
        lambda: _answers_200(sdk, model=MODEL_ID, prompt="x", max_tokens=1),
        "the key's slot free again after the dead node's lease",
        LEASE_MS / 1000 + 20,
    )


def _answers_200(sdk: OpenAI, **ask: Any) -> bool:
    """True once the request is answered; False while the key's slot is held (429)."""
    try:
        return bool(sdk.completions.create(**ask).choices)
    except openai.RateLimitError as refused:
        _envelope(refused.response, 429, "queue_full")
        return False
