"""The job state table: every legal move, every illegal one refused, the active and terminal
sets."""

from __future__ import annotations

import itertools

import pytest

from vllm_acs.states import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobStatus,
    can_move,
    check_move,
)

S = JobStatus
LEGAL = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.EXPIRED),
    (S.RUNNING, S.QUEUED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
}


def test_values_are_the_spec_words():
    assert [s.value for s in JobStatus] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "expired",
    ]
    assert JobStatus("running") is S.RUNNING and S.RUNNING == "running"
    assert f"{S.EXPIRED}" == "expired"


def test_active_and_terminal_split_every_status():
    assert {S.QUEUED, S.RUNNING} == ACTIVE
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.EXPIRED} == TERMINAL
    assert set(JobStatus) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(JobStatus, repeat=2)))
def test_each_move_is_legal_exactly_when_the_table_says(current: JobStatus, target: JobStatus):
    legal = (current, target) in LEGAL
    assert can_move(current, target) is legal
    assert can_move(current.value, target.value) is legal
    if legal:
        check_move(current, target)
    else:
        with pytest.raises(IllegalTransition) as refused:
            check_move(current, target)
        assert refused.value.current is current and refused.value.target is target
        assert isinstance(refused.value, ValueError)


def test_terminal_states_lead_nowhere():
    assert all(not TRANSITIONS[status] for status in TERMINAL)


def test_an_unknown_status_is_a_value_error():
    with pytest.raises(ValueError):
        can_move("queued", "paused")
