"""jobs/batch_share.py: batch work's priority and its share of the engine beside live traffic;
a client cannot raise its own priority."""

from __future__ import annotations

import asyncio

import pytest

from vllm_acs.contract.completion_rules import validate_completion
from vllm_acs.errors import AcsError
from vllm_acs.jobs.batch_share import (
    BATCH_PRIORITY,
    LIVE_PRIORITY,
    LIVE_QUIET_S,
    BatchGate,
    BatchScheduling,
    LiveTraffic,
)
from vllm_acs.middleware.completion_rewrite import vllm_body

from .test_completion_rules import SETTINGS, _models


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_batch_work_is_served_after_live_requests_only_under_the_priority_policy():
    assert LIVE_PRIORITY < BATCH_PRIORITY  # vLLM serves lower values first
    assert BatchScheduling(priority_policy=True).vllm_fields() == {"priority": BATCH_PRIORITY}
    # fcfs: vLLM refuses any priority but 0, so none is sent.
    assert BatchScheduling(priority_policy=False).vllm_fields() == {}
    assert BatchScheduling(priority_policy=False).priority is None


def test_a_client_cannot_send_a_priority():
    """The strict contract refuses `priority` in a body, so a live request always has vLLM's
    default (0) and only in-process batch work sets one."""
    for priority in (-100, 0, 5):
        with pytest.raises(AcsError) as caught:
            validate_completion({"prompt": "hi", "priority": priority}, _models(), SETTINGS)
        assert caught.value.status == 400
        assert "priority" in caught.value.message


def test_a_replay_of_batch_work_carries_its_priority_to_vllm():
    validated = validate_completion({"prompt": "hi"}, _models(), SETTINGS)
    import json

    assert "priority" not in json.loads(vllm_body(validated))
    fields = BatchScheduling(priority_policy=True).vllm_fields()
    assert json.loads(vllm_body(validated, fields))["priority"] == BATCH_PRIORITY


def test_live_traffic_counts_until_a_quiet_spell():
    clock = Clock()
    live = LiveTraffic(clock)
    assert not live.active()
    live.started()
    assert live.active()
    live.ended()
    assert live.active()  # back-to-back clients leave short gaps
    clock.now += LIVE_QUIET_S
    assert not live.active()


def test_the_gate_keeps_a_share_beside_live_traffic_and_full_width_without():
    clock = Clock()
    live = LiveTraffic(clock)
    gate = BatchGate(live, 8)
    assert gate.limit() == 8
    live.started()
    assert gate.limit() == 2  # a quarter, never starved
    assert BatchGate(live, 1).limit() == 1
    assert BatchGate(live, 3).limit() == 1


def test_the_gate_narrows_and_widens_with_live_traffic():
    asyncio.run(_narrows_and_widens())


async def _narrows_and_widens() -> None:
    live = LiveTraffic()
    gate = BatchGate(live, 4)
    peak = 0
    running = 0
    release = asyncio.Event()

    async def batch_request() -> None:
        nonlocal peak, running
        async with gate.slot():
            running += 1
            peak = max(peak, running)
            await release.wait()
            running -= 1

    live.started()
    tasks = [asyncio.create_task(batch_request()) for _ in range(6)]
    await asyncio.sleep(0.05)
    assert running == 1  # a quarter of 4 while a live request runs
    live.ended()
    await asyncio.sleep(LIVE_QUIET_S + 0.3)
    assert running == 4  # quiet: full width, without waiting for a batch request to end
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 4
