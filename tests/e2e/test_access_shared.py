"""Two server processes sharing PostgreSQL and Redis: limits hold across them, and a killed
process gives its slot and hold back once its lease expires."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.access_load import BODY, assert_budget_is_exact, assert_running_slots_are_exact
from tests.e2e.account_client import budgets, client_for, settled_usage, usage_matching_ledger
from tests.e2e.jobs_client import submit_job, wait_harvest_ended, wait_jobs_ended
from tests.e2e.shared_nodes import shared_nodes
from tests.harness import ServerProcess, group_members
from tests.slot_holder import held_tokens, holding_stream

pytestmark = pytest.mark.e2e

# Short enough for the kill test to wait it out, long enough that renewals survive the event-loop
# stalls of two servers and two busy engines on two cores: at 2 s, and once at 8 s, slots were
# lost under that load (the lapsed-lease gap issue 13 closes; the server logs "expired before
# renewal").
LEASE_MS = 20000


@pytest.fixture(scope="module")
def nodes(tiny_model_dir, tmp_path_factory) -> Iterator[list[ServerProcess]]:
    home = tmp_path_factory.mktemp("shared-home")
    with shared_nodes(tiny_model_dir, home, {"VLLM_ACS_LEASE_MS": str(LEASE_MS)}) as (servers, _):
        yield servers


def _urls(nodes: list[ServerProcess]) -> list[str]:
    return [n.base_url for n in nodes]


def test_budget_is_exact_across_two_processes(nodes):
    assert_budget_is_exact(nodes, "shared-budget")


def test_running_slots_are_exact_across_two_processes(nodes):
    assert_running_slots_are_exact(nodes, "shared-slots")


def test_usage_and_keys_agree_across_two_processes(nodes):
    """GET /v1/usage answers the same on both nodes after completions, a job, a Loom branch and
    a harvest, with the other node's Hold in flight and, once settled, exactly the ledger; a key
    made on one node and paused on the other is refused on the first at its next request.
    (Before the kill test: it needs both nodes.)"""
    first, second = nodes
    record = first.create_key_record(
        "shared-usage",
        "--monthly-tokens",
        "100000",
        "--scopes",
        "completions,jobs,harvest,looms,keys",
    )
    clients = [client_for(node, record["key"]) for node in nodes]
    for client in clients:
        assert client.post("/v1/completions", json=BODY).status_code == 200
    job = submit_job(clients[1], second.base_url, BODY, "shared-usage-job")
    loom = clients[0].post("/v1/looms", json={"prompt": "Once upon a time"}).json()
    branch = clients[1].post(
        f"/v1/looms/{loom['id']}/nodes/{loom['nodes'][0]['id']}/branch",
        json={"n": 2, "max_tokens": 3, "seed": 1},
    )
    assert branch.status_code == 201, branch.text
    harvest = clients[1].post(
        "/v1/harvest", json={"model": BODY["model"], "prompts": ["a b c"], "layers": [0]}
    )
    assert harvest.status_code == 202, harvest.text
    wait_jobs_ended(clients[0], _urls(nodes), [job], 120, nodes)
    ended = wait_harvest_ended(clients[1], harvest.json()["job_id"], nodes)
    assert ended["status"] == "done", ended

    with holding_stream(second.base_url, {"Authorization": f"Bearer {record['key']}"}, BODY):
        usage = clients[0].get("/v1/usage").json()  # the Hold lives on the other node
        assert budgets(usage)["key_monthly"]["held"] == held_tokens(4)
        assert usage["traffic"]["running"] == 1
    usage, ledger = usage_matching_ledger(first, clients[0], record["prefix"])
    spent = ledger["prompt_tokens"] + ledger["completion_tokens"]
    assert budgets(usage)["key_monthly"]["spent"] == spent > 3 * (4 + 2)
    other = settled_usage(clients[1])
    assert (budgets(other), other["days"]) == (budgets(usage), usage["days"])

    made = clients[0].post("/v1/keys", json={"name": "shared", "scopes": ["completions"]})
    assert made.status_code == 201, made.text
    made_client = client_for(first, made.json()["key"])
    assert made_client.post("/v1/completions", json=BODY).status_code == 200
    paused = clients[1].patch(f"/v1/keys/{made.json()['id']}", json={"state": "paused"})
    assert paused.status_code == 200
    refused = made_client.post("/v1/completions", json=BODY)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "key_disabled")


def test_a_killed_process_leaks_no_slot_and_no_hold(nodes):
    survivor, victim = nodes
    key = survivor.create_key(
        "killed", "--max-running", "1", "--max-waiting", "0", "--monthly-tokens", "2000"
    )
    auth = {"Authorization": f"Bearer {key}"}
    stream = httpx.stream(
        "POST",
        f"{victim.base_url}/v1/completions",
        json={**BODY, "max_tokens": 1500, "stream": True},
        headers=auth,
        timeout=60,
    )
    with stream as running:
        assert running.status_code == 200
        # Keep the iterator: a discarded `iter_lines()` generator closes the response at once,
        # and the victim would give the slot back before it is killed.
        lines = running.iter_lines()
        next(lines)  # it runs, holding the slot and 4 + 1500 tokens
        pgid = victim.process.pid
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed_at = time.monotonic()

    refused = httpx.post(f"{survivor.base_url}/v1/completions", json=BODY, headers=auth)
    assert refused.status_code == 429  # the dead process's lease still holds the slot
    assert refused.json()["error"]["code"] == "queue_full"

    time.sleep(max(0.0, LEASE_MS / 1000 + 1.0 - (time.monotonic() - killed_at)))
    # A leaked hold of 1504 would leave 496 - 4 = 492 output tokens: max_tokens 600 would be
    # clamped. Settled at what was used so far, the budget still has room for it.
    after = httpx.post(
        f"{survivor.base_url}/v1/completions",
        json={**BODY, "max_tokens": 600},
        headers=auth,
        timeout=120,
    )
    assert after.status_code == 200, after.text
    assert "x-acs-max-tokens-clamped" not in after.headers
