"""Completion jobs on two nodes sharing PostgreSQL and Redis: each job runs exactly once whichever
node claims it, is readable from either node, and a node killed mid-job leaves its job to the
other, which runs it again (attempt 1) and charges it once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.jobs_client import submit_job, wait_jobs_ended
from tests.e2e.shared_nodes import Cluster, node_logs, shared_nodes
from tests.harness import ServerProcess, sigkill_group

pytestmark = pytest.mark.e2e

# A few seconds, so the survivor takes a dead node's job back quickly, but not below 4 s: the
# runner renews every third of it, and two servers with two engines on two cores stall event
# loops for a second or more (a renewal that comes too late loses a healthy job to the reaper).
JOB_LEASE_MS = 5000
# The slots' and holds' lease (as in test_access_shared): a dead node's slot comes back soon.
LEASE_MS = 8000
ONE_TOKEN = {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 1, "temperature": 0}
SOME_TOKENS = {**ONE_TOKEN, "max_tokens": 64}
# A key whose requests wait in its queue and never run until `keys set --max-running 1`.
HELD_AT_ADMISSION = ("--max-running", "0", "--max-waiting", "4")
BULK_JOBS = 100


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("jobs-shared-home")
    env = {"VLLM_ACS_LEASE_MS": str(LEASE_MS), "VLLM_ACS_JOB_LEASE_MS": str(JOB_LEASE_MS)}
    with shared_nodes(tiny_model_dir, home, env) as (servers, database_url):
        yield Cluster.of(servers, database_url)


def _charged(node: ServerProcess, prefix: str) -> dict[str, int]:
    """What `vllm-acs usage` charges the key, over every model and month."""
    rows = [r for r in node.cli("usage")["per_key_model_month"] if r["key_prefix"] == prefix]
    fields = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
    return {f: sum(r[f] for r in rows) for f in fields}


def test_many_jobs_over_two_nodes_each_run_once(cluster):
    nodes = cluster.nodes
    urls = [n.base_url for n in nodes]
    record = nodes[0].create_key_record("jobs-bulk")
    auth = {"Authorization": f"Bearer {record['key']}"}
    with httpx.Client(headers=auth, timeout=60) as client:
        # A few client threads, the jobs alternating between the nodes: both runners claim from
        # the one table at once, which is what could run a job twice.
        with ThreadPoolExecutor(max_workers=4) as pool:
            job_ids = list(
                pool.map(
                    lambda i: submit_job(client, urls[i % 2], ONE_TOKEN, f"bulk-{i}"),
                    range(BULK_JOBS),
                )
            )
        assert len(set(job_ids)) == BULK_JOBS
        ended = wait_jobs_ended(client, urls, job_ids, 300, nodes)
        statuses = Counter(job["status"] for job in ended.values())
        assert statuses == {"succeeded": BULK_JOBS}, (statuses, node_logs(nodes))

        results: dict[str, dict[str, Any]] = {}
        for job_id in job_ids:
            answers = [client.get(f"{url}/v1/completion-jobs/{job_id}/result") for url in urls]
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            # Both nodes read the one stored answer, byte for byte.
            assert answers[0].content == answers[1].content
            results[job_id] = answers[0].json()

    rows = cluster.usage_rows(record["id"], BULK_JOBS)
    per_job = Counter(row["request_id"] for row in rows)
    assert set(per_job) == set(job_ids)
    assert set(per_job.values()) == {1}, [j for j, n in per_job.items() if n != 1]
    assert {row["status"] for row in rows} == {200}
    for row in rows:
        usage = results[row["request_id"]]["usage"]
        assert (row["prompt_tokens"], row["completion_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
    charged = _charged(nodes[1], record["prefix"])
    assert charged["requests"] == BULK_JOBS
    assert charged["total_tokens"] == sum(r["usage"]["total_tokens"] for r in results.values())


def test_a_job_submitted_to_one_node_is_readable_from_the_other_at_once(cluster):
    node_a, node_b = cluster.nodes
    key = node_a.create_key("jobs-read")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(headers=auth, timeout=60) as client:
        job_id = submit_job(client, node_a.base_url, ONE_TOKEN, "read-1")
        # Right away: the job is in the shared table when the submit answers.
        read = client.get(f"{node_b.base_url}/v1/completion-jobs/{job_id}")
        assert read.status_code == 200, read.text
        assert read.json()["id"] == job_id
        assert read.json()["model"] == "tiny-llama"
        ended = wait_jobs_ended(client, [node_b.base_url], [job_id], 120, cluster.nodes)
        assert ended[job_id]["status"] == "succeeded"
        result = client.get(f"{node_b.base_url}/v1/completion-jobs/{job_id}/result")
        assert result.status_code == 200, result.text


def test_a_loom_made_on_one_node_grows_on_both(cluster):
    """Looms live in the shared database: made on one node, branched from both at once, read,
    edited and exported on either."""
    node_a, node_b = cluster.nodes
    key = node_a.create_key("looms-shared")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(headers=auth, timeout=120) as client:
        made = client.post(f"{node_a.base_url}/v1/looms", json={"prompt": "Shared"})
        assert made.status_code == 201, made.text
        loom_id, root = made.json()["id"], made.json()["nodes"][0]["id"]
        path = f"/v1/looms/{loom_id}/nodes/{root}/branch"
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda url=url: answers.append(
                    client.post(url + path, json={"n": 2, "max_tokens": 4})
                )
            )
            for url in (node_a.base_url, node_b.base_url)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
        made_ids = {n["id"] for a in answers for n in a.json()["nodes"]}
        for url in (node_a.base_url, node_b.base_url):
            nodes = {n["id"]: n for n in client.get(f"{url}/v1/looms/{loom_id}").json()["nodes"]}
            assert set(nodes[root]["children"]) == made_ids
        child = sorted(made_ids)[0]
        edited = client.patch(
            f"{node_b.base_url}/v1/looms/{loom_id}/nodes/{child}", json={"text": " edited"}
        )
        assert edited.status_code == 200, edited.text
        text = client.get(f"{node_a.base_url}/v1/looms/{loom_id}/nodes/{child}/text").text
        assert text == "Shared edited"


def test_a_node_killed_mid_job_leaves_the_job_to_the_other(cluster):
    # Last in the module: the killed node stays down.
    nodes = cluster.nodes
    # No running slot but a queue place: the claimed job's run waits for a slot for as long as the
    # node lives, so the kill lands mid-job however fast this machine generates.
    record = nodes[0].create_key_record("jobs-kill", *HELD_AT_ADMISSION)
    auth = {"Authorization": f"Bearer {record['key']}"}
    with httpx.Client(headers=auth, timeout=60) as client:
        job_id = submit_job(client, nodes[0].base_url, SOME_TOKENS, "kill-1")
        # Either runner may claim it (the submitting node is woken, the other polls): rather than
        # steer the claim, wait until it is running and read its owner from the shared table,
        # then kill that node, whichever it is.
        deadline = time.monotonic() + 60
        while True:
            (job,) = cluster.query("SELECT status, owner, attempt FROM jobs WHERE id = $1", job_id)
            if job["status"] == "running" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert job["status"] == "running", (job, node_logs(nodes))
        assert job["attempt"] == 0
        victim = cluster.owner_node(job["owner"])
        (survivor,) = [n for n in nodes if n is not victim]

        # Let the key run from now on. The waiting run keeps the limits it was admitted under, so
        # it stays queued until the kill; the survivor's run will be admitted under the new ones
        # (set now, not after the kill: the survivor may claim the job within seconds of it).
        survivor.cli("keys", "set", record["prefix"], "--max-running", "1")
        victim.wait_for_metric("acs_waiting_requests", 1)
        (job,) = cluster.query("SELECT status, attempt FROM jobs WHERE id = $1", job_id)
        assert (job["status"], job["attempt"]) == ("running", 0)

        sigkill_group(victim.process.pid)

        # Killed mid-job: still the victim's claim, nothing charged (else this proves nothing).
        (job,) = cluster.query("SELECT status, owner, attempt FROM jobs WHERE id = $1", job_id)
        assert (job["status"], job["attempt"]) == ("running", 0)
        assert cluster.query("SELECT id FROM usage_rows WHERE request_id = $1", job_id) == []

        # The lease runs out (5 s), the survivor's reaper (every 5 s) hands the job back, its
        # runner claims it and, the key now having a slot, runs it.
        ended = wait_jobs_ended(client, [survivor.base_url], [job_id], 180, [survivor])
        assert ended[job_id]["status"] == "succeeded", (ended, survivor.log_tail())
        result = client.get(f"{survivor.base_url}/v1/completion-jobs/{job_id}/result")
        assert result.status_code == 200, result.text
        usage = result.json()["usage"]

    (job,) = cluster.query("SELECT status, owner, attempt FROM jobs WHERE id = $1", job_id)
    assert job["attempt"] == 1
    assert cluster.owner_node(job["owner"]) is survivor
    rows = cluster.usage_rows(record["id"], 1)
    assert [(r["request_id"], r["status"]) for r in rows] == [(job_id, 200)]
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    charged = _charged(survivor, record["prefix"])
    assert charged == {
        "requests": 1,
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
    }
