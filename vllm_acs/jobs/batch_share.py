"""Live requests first: batch work's engine priority and its bound beside live traffic.

API server process. Harvest prompts and completion jobs ("batch work") enter vLLM's engine with
`BATCH_PRIORITY` when the engine schedules by priority (lower is served first; live requests
keep vLLM's default 0), so a live request jumps every waiting batch request and a preemption
under KV pressure takes batch work first. The priority is set only by in-process code (the
harvest's `generate` call, a job replay's `principal.Replay.vllm_fields`): a client's body cannot
carry `priority` (strict validation), and `X-Acs-Workload` never changes scheduling.

vLLM's running requests share each step in arrival order whatever their priority, so batch work
is also bounded here, in time: while live requests are in flight on this process (or ended within
`LIVE_QUIET_S`), each batch kind runs in bursts. Up to its full width of engine requests start
together; once they have all ended it rests `(1 - LIVE_TIME_SHARE) / LIVE_TIME_SHARE` times as
long as the burst took. So it keeps that share of the time (its stated minimum: never starved),
and most live requests never share a step with it, which a bound on the batch's width alone
cannot give (each live request then meets a few batch prefills in its steps). With no live
traffic it runs at its full width, refilled as requests end.
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
# The share of the time a batch kind keeps while live traffic runs (its stated minimum).
LIVE_TIME_SHARE = 0.3
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
    """One batch kind's engine requests in flight: `width` at most; in bursts while live traffic
    runs, resting between them so that it keeps `share` of the time."""

    def __init__(self, live: LiveTraffic, width: int, share: float = LIVE_TIME_SHARE) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.live = live
        self.width = max(1, width)
        self.share = share
        self.in_flight = 0
        # The burst: when its first request started, how many started since. A quiet node's
        # refills are not a burst: each start begins one again.
        self._burst_started: float | None = None
        self._burst_admitted = 0
        self._rest_until = -math.inf
        self._changed = asyncio.Event()

    def may_start(self) -> bool:
        if self.in_flight >= self.width:
            return False
        if not self.live.active():
            return True
        if self.in_flight == 0:
            return self.live.clock() >= self._rest_until
        # A burst fills up to the width once; it is not refilled as its requests end.
        return self._burst_admitted < self.width

    def resting_for(self) -> float:
        """Seconds until a rest beside live traffic ends (0 when not resting)."""
        return max(0.0, self._rest_until - self.live.clock())

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        while not self.may_start():
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            # Live traffic may go quiet, or a rest end, without any batch request ending: look
            # again then.
            wait_s = min(LIVE_QUIET_S, self.resting_for() or LIVE_QUIET_S)
            quiet = asyncio.ensure_future(self.live.changed(max(0.001, wait_s)))
            try:
                await asyncio.wait({waiter, quiet}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                quiet.cancel()
        self._started()
        try:
            yield
        finally:
            self._ended()

    def _started(self) -> None:
        if self.in_flight == 0 or not self.live.active():
            self._burst_started = self.live.clock()
            self._burst_admitted = 0
        self.in_flight += 1
        self._burst_admitted += 1
        self._changed.set()  # the rest of a burst waiting behind its first request may start

    def _ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            now = self.live.clock()
            if self.live.active() and self._burst_started is not None:
                busy = now - self._burst_started
                self._rest_until = now + busy * (1 - self.share) / self.share
            self._burst_started = None
            self._burst_admitted = 0
        self._changed.set()


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
