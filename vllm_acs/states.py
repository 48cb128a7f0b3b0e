"""Job states and their legal transitions: the one table the job storage, runner and routes obey.

A leaf module (pure, imports nothing of the project); used in the API server process and the CLI.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    def __str__(self) -> str:
        return self.value


ACTIVE: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})
TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
)

TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.EXPIRED}),
    # Back to queued when the lease is lost (the reaper) or the runner hands the job back.
    JobStatus.RUNNING: frozenset(
        {JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    **{status: frozenset() for status in TERMINAL},
}


class IllegalTransition(ValueError):
    def __init__(self, current: JobStatus | str, target: JobStatus | str) -> None:
        super().__init__(f"a job cannot go from {current} to {target}")
        self.current = JobStatus(current)
        self.target = JobStatus(target)


def can_move(current: JobStatus | str, target: JobStatus | str) -> bool:
    return JobStatus(target) in TRANSITIONS[JobStatus(current)]


def check_move(current: JobStatus | str, target: JobStatus | str) -> None:
    if not can_move(current, target):
        raise IllegalTransition(current, target)
