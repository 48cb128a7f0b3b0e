"""metrics.py: the slot gauges follow one request from admission to settle."""

from __future__ import annotations

from vllm_acs.metrics import RUNNING, TOKENS_HELD, WAITING, SlotGauges, method_label


def _now() -> tuple[float, float, float]:
    return RUNNING._value.get(), WAITING._value.get(), TOKENS_HELD._value.get()


def test_a_queued_request_moves_from_waiting_to_running_and_leaves():
    running, waiting, held = _now()
    gauges = SlotGauges(running=False, held_tokens=40)
    assert _now() == (running, waiting + 1, held + 40)
    gauges.start_running()
    assert _now() == (running + 1, waiting, held + 40)
    gauges.release()
    gauges.release()  # settled twice (a cancelled request): counted once
    assert _now() == (running, waiting, held)


def test_a_request_that_leaves_while_waiting():
    running, waiting, held = _now()
    gauges = SlotGauges(running=False, held_tokens=7)
    gauges.release()
    gauges.start_running()  # too late: nothing moves
    assert _now() == (running, waiting, held)


def test_unknown_methods_share_one_label():
    assert method_label("POST") == "POST"
    assert method_label("BREW") == "OTHER"
