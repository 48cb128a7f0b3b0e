"""JobWatch: long-poll reads (`?wait=`) wait here until a job ends.

API server process, one per job runner. A job this process ends (its runner writes the end, or a
cancel here) wakes its waiters at once; a job that another node ends, or that the reaper fails,
is seen by one shared check of every awaited job per step (one query, however many wait), so a
thousand waiting clients cost the database what one polling client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection

from ..metrics import WAITING_JOB_READS

logger = logging.getLogger(__name__)

# How often the shared check asks the database which awaited jobs have ended.
CHECK_EVERY_S = 0.5

EndedAmong = Callable[[Collection[str]], Awaitable[Collection[str]]]


class JobWatch:
    def __init__(self, ended_among: EndedAmong, *, check_every_s: float = CHECK_EVERY_S) -> None:
        self._ended_among = ended_among
        self._check_every_s = check_every_s
        self._waiters: dict[str, tuple[asyncio.Event, int]] = {}
        self._checker: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Clients waiting now (several may wait for one job)."""
        return sum(count for _, count in self._waiters.values())

    def ended(self, job_id: str) -> None:
        """This process ended `job_id`: its waiters answer now."""
        entry = self._waiters.get(job_id)
        if entry is not None:
            entry[0].set()

    async def wait_ended(self, job_id: str, timeout_s: float) -> bool:
        """Until `job_id` ends or `timeout_s` passes; True when it was seen ending."""
        event, count = self._waiters.get(job_id, (asyncio.Event(), 0))
        self._waiters[job_id] = (event, count + 1)
        self._ensure_checker()
        WAITING_JOB_READS.inc()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
            return event.is_set()
        finally:
            WAITING_JOB_READS.dec()
            event, count = self._waiters[job_id]
            if count <= 1:
                del self._waiters[job_id]
            else:
                self._waiters[job_id] = (event, count - 1)

    def _ensure_checker(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_loop(), name="acs-jobs-watch")

    async def _check_loop(self) -> None:
        """Runs while anyone waits: one query a step for every awaited job."""
        while self._waiters:
            await asyncio.sleep(self._check_every_s)
            awaited = [job_id for job_id, (event, _) in self._waiters.items() if not event.is_set()]
            if not awaited:
                continue
            try:
                ended = await self._ended_among(awaited)
            except Exception:
                # A database outage: the waiters time out and answer the status they read.
                logger.warning("checking which awaited jobs ended failed", exc_info=True)
                continue
            for job_id in ended:
                self.ended(job_id)

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
