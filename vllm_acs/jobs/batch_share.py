"""Live requests first: batch work's engine priority and its bound beside live traffic.

API server process. Harvest prompts and completion jobs ("batch work") enter vLLM's engine with
`BATCH_PRIORITY` when the engine schedules by priority (lower is served first; live requests
keep vLLM's default 0), so a live request jumps every waiting batch request and a preemption
under KV pressure takes batch work first. The priority is set only by in-process code (the
harvest's `generate` call, a job replay's `principal.Replay.vllm_fields`): a client's body cannot
carry `priority` (strict validation), and `X-Acs-Workload` never changes scheduling.

vLLM's running requests share each step in arrival order whatever their priority, so batch work
is also bounded here: while live requests are in flight on this process (or ended within
`LIVE_QUIET_S`), each batch kind keeps at most `UNDER_LIVE_SHARE` of its engine requests in
flight (at least one: it is never starved); with no live traffic it runs at its full width.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable

# vLLM serves lower values first; live requests carry its default, 0.
LIVE_PRIORITY = 0
BATCH_PRIORITY = 1
# The share of a batch kind's width it keeps while live traffic runs (its stated minimum).
UNDER_LIVE_SHARE = 0.25
# A live request ended less than this long ago still counts as live traffic: a client sending
# requests back to back leaves gaps of a few milliseconds, which batch work must not fill.
LIVE_QUIET_S = 0.25


class LiveTraffic:
    """The live completions in flight on this API process (counted by the middleware)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self.last_ended = -math.inf
        self._changed = asyncio.Event()

    def started(self) -> None:
        self.in_flight += 1
        self._changed.set()

    def ended(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.last_ended = self.clock()
        self._changed.set()

    def active(self) -> bool:
        return self.in_flight > 0 or self.clock() - self.last_ended < LIVE_QUIET_S

    async def changed(self, timeout: float) -> None:
        """Returns when a live request starts or ends, or after `timeout` seconds."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class BatchGate:
    """One batch kind's engine requests in flight: `width` at most, `under_live` (at least one)
    while live traffic runs."""

    def __init__(self, live: LiveTraffic, width: int, share: float = UNDER_LIVE_SHARE) -> None:
        self.live = live
        self.width = max(1, width)
        self.under_live = max(1, math.ceil(self.width * share))
        self.in_flight = 0
        self._freed = asyncio.Event()

    def limit(self) -> int:
        return self.under_live if self.live.active() else self.width

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        while self.in_flight >= self.limit():
            self._freed.clear()
            waiter = asyncio.ensure_future(self._freed.wait())
            # Live traffic may go quiet without any batch request ending: look again then.
            quiet = asyncio.ensure_future(self.live.changed(LIVE_QUIET_S))
            try:
                await asyncio.wait({waiter, quiet}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                quiet.cancel()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._freed.set()


class BatchScheduling:
    """What this node's batch work needs: its engine priority (None when the engine schedules
    first come, first served, where vLLM refuses any priority but 0) and the live traffic."""

    def __init__(self, priority_policy: bool, live: LiveTraffic | None = None) -> None:
        self.priority = BATCH_PRIORITY if priority_policy else None
        self.live = live or LiveTraffic()

    def gate(self, width: int) -> BatchGate:
        return BatchGate(self.live, width)

    def vllm_fields(self) -> dict[str, int]:
        return {} if self.priority is None else {"priority": self.priority}
