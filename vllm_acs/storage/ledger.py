"""`UsageLedger`: takes usage rows off the response path and writes them in batches.

API server process. `record()` never waits on the database; one writer task inserts batches. A
batch the database cannot take for now (an outage) is kept and retried with backoff until it
can, so a slow or down database delays rows but never loses them. A batch it refuses for good
(a data error: a value too long for its column, a NULL, a number out of range) is split in
halves until the refused rows stand alone: the others are written, a refused row is tried once
more with its text cut to the columns, then dropped. The queue is bounded
(`usage_queue_max_rows`); a row that finds it full, one refused for good and one still waiting
at shutdown are each logged at ERROR with the row's metadata and counted in
`acs_usage_rows_dropped_total{reason}`: never lost silently. `close()` drains what it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

import sqlalchemy.exc
from sqlalchemy import String

from ..metrics import USAGE_ROWS_DROPPED, USAGE_ROWS_PENDING
from .outages import outage_of
from .tables import usage_rows
from .usage import UsageRepository, UsageRow, recorded_workload

logger = logging.getLogger(__name__)
_BATCH = 500
# Rows arriving within this window share one transaction: a row costs far less in a batch.
_LINGER_S = 0.05
_BACKOFF_S = (0.05, 5.0)
DEFAULT_MAX_PENDING = 50_000
# SQLSTATE classes of a statement the database refuses whatever its state: 22 data exception
# (too long, out of range, bad input), 23 integrity constraint violation (NOT NULL, ...).
_REFUSED_SQLSTATES = ("22", "23")
# The text columns of a usage row and their lengths, for the one retry of a refused row.
_TEXT_LENGTHS = {
    c.name: c.type.length
    for c in usage_rows.columns
    if isinstance(c.type, String) and c.type.length is not None
}


def refused_for_good(error: BaseException) -> bool:
    """True when the database refused the rows themselves (a data error, the same on every
    retry); False for an outage or anything unknown, which are retried."""
    if outage_of(error) is not None:
        return False
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (sqlalchemy.exc.DataError, sqlalchemy.exc.IntegrityError)):
            return True
        if isinstance(current, sqlalchemy.exc.StatementError) and not isinstance(
            current, sqlalchemy.exc.DBAPIError
        ):
            return True  # a value SQLAlchemy could not bind
        if str(getattr(current, "sqlstate", None) or "")[:2] in _REFUSED_SQLSTATES:
            return True
        current = current.__cause__ or current.__context__
    return False


def fitted(row: UsageRow) -> UsageRow:
    """The row with an unknown workload as none and every text cut to its column."""
    changes: dict[str, object] = {}
    for name, length in _TEXT_LENGTHS.items():
        value = getattr(row, name, None)
        if isinstance(value, str) and len(value) > length:
            changes[name] = value[:length]
    changes["workload"] = recorded_workload(row.workload)
    return dataclasses.replace(row, **changes)  # type: ignore[arg-type]


def _described(row: UsageRow) -> str:
    """A row's metadata for an ERROR line (no prompt, no secret; text fields shortened), so the
    operator can account for it by hand."""
    return (
        f"request_id={str(row.request_id)[:64]} key_id={str(row.key_id)[:40]} "
        f"account_id={str(row.account_id)[:40]} model={str(row.model)[:200]} "
        f"route={str(row.route)[:120]} status={row.status} prompt_tokens={row.prompt_tokens} "
        f"completion_tokens={row.completion_tokens} "
        f"activation_requests={row.activation_requests} created_at={row.created_at}"
    )


class UsageLedger:
    def __init__(
        self,
        usage: UsageRepository,
        *,
        on_written: Callable[[UsageRow], None] | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        """`on_written` runs once a row is in the database; a public attribute, so the server
        can connect it after building its plugins. `max_pending`: rows the queue holds."""
        self._usage = usage
        self.on_written = on_written
        self._queue: asyncio.Queue[UsageRow] = asyncio.Queue(maxsize=max(1, max_pending))
        # The batch taken from the queue and not written yet, split where the database refused
        # a row; kept across retries so that a half written before an outage is not written twice.
        self._chunks: list[list[UsageRow]] = []
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def record(self, row: UsageRow) -> None:
        """Queues one row; returns at once. A full queue drops the row, logged and counted."""
        try:
            self._queue.put_nowait(row)
        except asyncio.QueueFull:
            self._drop(row, "queue_full")
            return
        self._idle.clear()
        USAGE_ROWS_PENDING.inc()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_forever())

    @property
    def pending(self) -> int:
        """Rows not written yet: queued, and taken for the batch being written."""
        return self._queue.qsize() + sum(len(chunk) for chunk in self._chunks)

    @staticmethod
    def _call(callback: Callable[[UsageRow], None], row: UsageRow) -> None:
        try:
            callback(row)
        except Exception:  # an operator's export must not break accounting
            logger.exception("a usage-row callback failed for request %s", row.request_id)

    @staticmethod
    def _drop(row: UsageRow, reason: str, error: BaseException | None = None) -> None:
        USAGE_ROWS_DROPPED.labels(reason).inc()
        logger.error(
            "usage row not written (%s%s): %s",
            reason,
            "" if error is None else f", {type(error).__name__}",
            _described(row),
        )

    def _take_batch(self, first: UsageRow) -> None:
        batch = [first]
        while len(batch) < _BATCH and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        self._chunks = [batch]

    async def _write_forever(self) -> None:
        delay = _BACKOFF_S[0]
        while True:
            if not self._chunks:
                if self._queue.empty():
                    self._idle.set()
                first = await self._queue.get()
                if self._queue.qsize() < _BATCH:
                    await asyncio.sleep(_LINGER_S)
                self._take_batch(first)
            try:
                await self._write_chunks()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.warning(
                    "writing %d usage rows failed (%s); retrying in %.2fs",
                    self.pending - self._queue.qsize(), type(error).__name__, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_S[1])
                continue
            delay = _BACKOFF_S[0]

    async def _write_chunks(self) -> None:
        """Writes the taken batch, splitting what the database refuses; raises on anything else
        (an outage), leaving the unwritten chunks for the retry."""
        chunks = self._chunks
        while chunks:
            chunk = chunks[-1]
            try:
                await self._usage.insert(chunk)
            except Exception as error:
                if not refused_for_good(error):
                    raise
                chunks.pop()
                if len(chunk) > 1:
                    middle = len(chunk) // 2
                    chunks.extend([chunk[middle:], chunk[:middle]])  # the first half first
                    continue
                (row,) = chunk
                repaired = fitted(row)
                if repaired != row:
                    logger.warning(
                        "the database refused the usage row of request %s (%s); writing it "
                        "with its text cut to the columns",
                        str(row.request_id)[:64], type(error).__name__,
                    )  # fmt: skip
                    chunks.append([repaired])
                else:
                    USAGE_ROWS_PENDING.dec()
                    self._drop(row, "refused", error)
                continue
            chunks.pop()
            USAGE_ROWS_PENDING.dec(len(chunk))
            if self.on_written is not None:
                for row in chunk:
                    self._call(self.on_written, row)

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued row is in the database (or dropped, logged and counted)."""
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
        left = [row for chunk in self._chunks for row in chunk]
        self._chunks = []
        while not self._queue.empty():
            left.append(self._queue.get_nowait())
        for row in left:
            USAGE_ROWS_PENDING.dec()
            self._drop(row, "shutdown")
