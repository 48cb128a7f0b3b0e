"""EndWriter: the ends of jobs written in batches, one transaction for the ends that arrive
together.

API server process, one per job runner. A busy runner ends many jobs a second; each end alone
would be a write transaction of its own (on SQLite the one write lock, taken in turn). Ends that
arrive while a batch is being written go together in the next one; each stays fenced on its own
(job, attempt, owner), so each caller learns whether its own end was written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime

from ..storage.jobs import JobEnd, JobRepository

# The most ends one transaction writes.
MAX_BATCH = 64


class EndWriter:
    def __init__(self, repository: JobRepository, clock: Callable[[], datetime]) -> None:
        self.repository = repository
        self.clock = clock
        self._waiting: list[tuple[JobEnd, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def write(self, end: JobEnd) -> bool:
        """Writes `end` (with the others waiting); False when it was fenced out."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((end, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting(), name="acs-jobs-ends")
        return await future

    async def _write_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                written = await self.repository.finish_many([end for end, _ in batch], self.clock())
            except Exception as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), ok in zip(batch, written, strict=True):
                if not future.done():  # its caller may have been cancelled (a closing server)
                    future.set_result(ok)

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
