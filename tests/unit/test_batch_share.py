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


def _enter(gate: BatchGate) -> None:
    """What `slot()` does once `may_start()` says yes (the unit tests drive the clock)."""
    assert gate.may_start()
    gate._started()


def test_beside_live_traffic_the_gate_runs_bursts_and_rests_for_its_share_of_the_time():
    clock = Clock()
    live = LiveTraffic(clock)
    gate = BatchGate(live, 4, share=0.25)
    live.started()
    # A burst: up to the full width at once...
    for _ in range(4):
        _enter(gate)
    assert not gate.may_start()
    clock.now += 0.1
    gate._ended()
    # ...not refilled as its requests end.
    assert not gate.may_start()
    for _ in range(3):
        gate._ended()
    # It took 0.1 s: it rests three times as long (a quarter of the time is its share).
    assert gate.resting_for() == pytest.approx(0.3)
    assert not gate.may_start()
    clock.now += 0.29
    assert not gate.may_start()
    clock.now += 0.02
    assert gate.may_start()
    # The next burst is measured on its own.
    _enter(gate)
    clock.now += 0.2
    gate._ended()
    assert gate.resting_for() == pytest.approx(0.6)


def test_without_live_traffic_the_gate_refills_to_its_width_and_a_rest_ends():
    clock = Clock()
    live = LiveTraffic(clock)
    gate = BatchGate(live, 2)
    for _ in range(2):
        _enter(gate)
    assert not gate.may_start()  # the width holds whatever the traffic
    gate._ended()
    assert gate.may_start()  # refilled at once on a quiet node
    _enter(gate)
    # Live traffic starts while the batch runs: it drains, then rests for its share.
    live.started()
    clock.now += 1.0
    gate._ended()
    gate._ended()
    assert gate.resting_for() > 0 and not gate.may_start()
    # The live traffic ends: the rest ends with it.
    live.ended()
    clock.now += LIVE_QUIET_S
    assert gate.may_start()
    with pytest.raises(ValueError, match="share"):
        BatchGate(live, 2, share=0)


def test_the_gate_follows_live_traffic_in_real_time():
    asyncio.run(_follows_live_traffic())


async def _follows_live_traffic() -> None:
    live = LiveTraffic()
    gate = BatchGate(live, 2, share=0.5)
    running = 0
    peak = 0
    starts: list[float] = []
    loop = asyncio.get_running_loop()

    async def batch_request(hold_s: float) -> None:
        nonlocal peak, running
        async with gate.slot():
            starts.append(loop.time())
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(hold_s)
            running -= 1

    live.started()
    # Two bursts of two beside live traffic: the second starts once the first has ended and
    # rested as long again (share 0.5).
    began = loop.time()
    await asyncio.gather(*(batch_request(0.2) for _ in range(4)))
    assert peak == 2
    assert starts[1] - starts[0] < 0.05  # a burst starts together
    assert starts[2] - began >= 0.2 + 0.2 - 0.02  # burst, then its rest
    # Live traffic ends: no rest, refilled as requests end.
    live.ended()
    await asyncio.sleep(LIVE_QUIET_S + 0.05)
    starts.clear()
    began = loop.time()
    await asyncio.gather(*(batch_request(0.05) for _ in range(4)))
    assert starts[2] - began < 0.15
