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
from tests.e2e.shared_nodes import shared_nodes
from tests.harness import ServerProcess, group_members

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
