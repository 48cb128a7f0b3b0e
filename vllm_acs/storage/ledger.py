"""`UsageLedger`: takes usage rows off the response path and writes them in batches.

API server process. `record()` never waits on the database; one writer task inserts batches and
keeps a failed batch to retry it (with backoff) until the database takes it, so a slow or briefly
unavailable database delays rows but never loses them. `close()` drains what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from .usage import UsageRepository, UsageRow

logger = logging.getLogger(__name__)
_BATCH = 500
# Rows arriving within this window share one transaction: a row costs far less in a batch.
_LINGER_S = 0.05
_BACKOFF_S = (0.05, 5.0)


class UsageLedger:
    def __init__(
        self,
        usage: UsageRepository,
        *,
        on_written: Callable[[UsageRow], None] | None = None,
    ) -> None:
        """`on_written` runs once a row is in the database; a public attribute, so the server
        can connect it after building its plugins."""
        self._usage = usage
        self.on_written = on_written
        self._queue: asyncio.Queue[UsageRow] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def record(self, row: UsageRow) -> None:
        """Queues one row; returns at once."""
        self._idle.clear()
        self._queue.put_nowait(row)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_forever())

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    @staticmethod
    def _call(callback: Callable[[UsageRow], None], row: UsageRow) -> None:
        try:
            callback(row)
        except Exception:  # an operator's export must not break accounting
            logger.exception("a usage-row callback failed for request %s", row.request_id)

    async def _write_forever(self) -> None:
        delay = _BACKOFF_S[0]
        batch: list[UsageRow] = []
        while True:
            if not batch:
                if self._queue.empty():
                    self._idle.set()
                batch.append(await self._queue.get())
                if self._queue.qsize() < _BATCH:
                    await asyncio.sleep(_LINGER_S)
                while len(batch) < _BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
            try:
                await self._usage.insert(batch)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.warning(
                    "writing %d usage rows failed (%s); retrying in %.2fs",
                    len(batch), type(error).__name__, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_S[1])
                continue
            delay = _BACKOFF_S[0]
            if self.on_written is not None:
                for row in batch:
                    self._call(self.on_written, row)
            batch = []

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued row is in the database."""
        await asyncio.wait_for(self._idle.wait(), timeout)

    async def close(self, timeout: float = 30.0) -> None:
        try:
            await self.flush(timeout)
        except asyncio.TimeoutError:
            logger.error("closing with %d usage rows not written", self.pending)
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
