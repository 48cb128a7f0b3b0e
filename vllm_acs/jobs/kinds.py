"""What a kind of job is to the runner: something that runs one claimed job to an outcome.

API server process. The machinery knows nothing of what a kind does (completion now; harvest and
Loom branches next): a kind gets the job and an event that is set when the job must stop
(cancelled, or its lease lost), and returns how the job ended or that it should wait.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from ..states import JobStatus
from ..storage.jobs import Job


@dataclass(frozen=True)
class JobOutcome:
    """A terminal status and, for a completion, the answer to store (its status and body)."""

    status: JobStatus
    result_status: int | None = None
    result_body: str | None = None
    error_code: str | None = None


@dataclass(frozen=True)
class HandBack:
    """Not now: the job goes back to the queue, not before `delay_s` (e.g. the key's slots are
    full). It keeps its attempt: nothing failed."""

    delay_s: float


@dataclass(frozen=True)
class Stopped:
    """The job was stopped from outside (cancelled, or its lease lost): nothing to write."""


class JobKind(Protocol):
    """A kind may also have `result_ttl` (a timedelta: its results outlive the default 24 h) and
    `async def sweep(now)` (its retention outside the database), which the runner's sweep
    calls."""

    name: str

    async def run(self, job: Job, stop: asyncio.Event) -> JobOutcome | HandBack | Stopped:
        """Runs `job` until it ends or `stop` is set. Exceptions end the job failed."""
        ...
