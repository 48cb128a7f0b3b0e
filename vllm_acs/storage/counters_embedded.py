"""`EmbeddedCounters`: slots, starts and Holds in this process's memory (one API process only).

API server process. asyncio runs one coroutine at a time, so the check-and-reserve section, which
never awaits, is atomic (in admit and in take_start alike). Budget counters start from the settled
tokens in the database (SQLite); a crash loses only in-memory holds, never settled usage.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..auth.principal import Principal
from .counters import (
    AdmitRequest,
    Counters,
    CounterState,
    SettledReader,
    Ticket,
    TrafficInUse,
    charge,
    engine_prompt,
)
from .errors import BudgetExhausted, QueueFull, StartsExhausted
from .periods import BudgetLine, counter_with_period, hold, max_tokens_that_fit

logger = logging.getLogger(__name__)
_WINDOW_S = 60.0
# A full queue drains at the speed of the running requests; a second is a fair first guess.
_QUEUE_RETRY_MS = 1000


@dataclass
class _KeyTraffic:
    running: int = 0
    waiters: collections.deque[tuple[Ticket, asyncio.Future[None]]] = field(
        default_factory=collections.deque
    )
    starts: collections.deque[float] = field(default_factory=collections.deque)

    def check_start(self, starts_per_minute: int, clock: float) -> None:
        """Forgets starts older than the window; raises StartsExhausted while it is full."""
        while self.starts and self.starts[0] <= clock - _WINDOW_S:
            self.starts.popleft()
        if len(self.starts) >= starts_per_minute:
            wait_ms = int((self.starts[0] + _WINDOW_S - clock) * 1000) + 1
            raise StartsExhausted(wait_ms)


def _first_short(
    held: list[tuple[BudgetLine, int]], request: AdmitRequest
) -> BudgetExhausted | None:
    """The refusal by the first budget (in naming order) that cannot hold the full max_tokens,
    or None: what a request that may not be clamped (a job) is refused by. Same order as
    admit.lua's."""
    for line, committed in held:
        fits, refused_by = max_tokens_that_fit(
            [(line, committed)], request.prompt_tokens, request.choices, request.max_tokens
        )
        if refused_by is not None or fits < request.max_tokens:
            return BudgetExhausted(line.name, fits=fits, asked=request.max_tokens)
    return None


class EmbeddedCounters(Counters):
    name = "embedded"

    def __init__(self, read_settled: SettledReader) -> None:
        self._read_settled = read_settled
        self._committed: dict[str, int] = {}
        # The part of each counter held by requests in flight (for GET /v1/usage).
        self._held: dict[str, int] = collections.defaultdict(int)
        self._traffic: dict[str, _KeyTraffic] = collections.defaultdict(_KeyTraffic)
        self._load_lock = asyncio.Lock()

    async def _load(self, counters: list[str]) -> None:
        missing = [c for c in counters if c not in self._committed]
        if not missing:
            return
        async with self._load_lock:
            missing = [c for c in counters if c not in self._committed]
            if missing:
                settled = await self._read_settled(missing)
                for counter in missing:
                    self._committed.setdefault(counter, settled.get(counter, 0))

    async def admit(self, request: AdmitRequest) -> Ticket:
        now = datetime.now(timezone.utc)
        lines = [
            (line, counter_with_period(line.counter, line.granularity, now))
            for line in request.lines
        ]
        await self._load([counter for _, counter in lines])
        # From here to the return nothing awaits: the decision and the reservation are one step.
        held = [(line, self._committed[counter]) for line, counter in lines]
        applied, refused_by = max_tokens_that_fit(
            held, request.prompt_tokens, request.choices, request.max_tokens
        )
        if not request.allow_clamp:  # a job refuses instead of clamping
            short = _first_short(held, request)
            if short is not None:
                raise short
        if refused_by is not None:
            raise BudgetExhausted(refused_by, asked=request.max_tokens)
        limits = request.principal.limits
        traffic = self._traffic[request.principal.key_id]
        clock = time.monotonic()
        if request.count_start:
            traffic.check_start(limits.starts_per_minute, clock)
        runs_now = traffic.running < limits.max_running and not traffic.waiters
        if not runs_now and len(traffic.waiters) >= limits.max_waiting:
            raise QueueFull(_QUEUE_RETRY_MS)
        ticket = Ticket(
            key_id=request.principal.key_id, applied_max_tokens=applied, running=runs_now
        )
        output = request.choices * applied
        for line, counter in lines:
            amount = hold(line.kind, request.prompt_tokens, output)
            ticket.reserved[counter] = (amount, line.kind)
            self._committed[counter] += amount
            self._held[counter] += amount
        if request.count_start:
            traffic.starts.append(clock)
        if runs_now:
            traffic.running += 1
        else:
            traffic.waiters.append((ticket, asyncio.get_running_loop().create_future()))
        return ticket

    async def take_start(self, principal: Principal) -> None:
        traffic = self._traffic[principal.key_id]
        clock = time.monotonic()
        # No await between the check and the append: one atomic step, as in admit.
        traffic.check_start(principal.limits.starts_per_minute, clock)
        traffic.starts.append(clock)

    async def wait_for_slot(self, ticket: Ticket) -> None:
        if ticket.running:
            return
        traffic = self._traffic[ticket.key_id]
        future = next(f for t, f in traffic.waiters if t is ticket)
        # A cancel leaves the ticket as it is: settle() gives back the queue place or the slot.
        await asyncio.shield(future)

    def _release_slot(self, ticket: Ticket) -> None:
        traffic = self._traffic[ticket.key_id]
        if not ticket.running:
            for index, (waiting, future) in enumerate(traffic.waiters):
                if waiting is ticket:
                    del traffic.waiters[index]
                    future.cancel()
                    return
            return
        # Hand the slot to the first waiter (FIFO); the running count stays the same.
        if traffic.waiters:
            waiting, future = traffic.waiters.popleft()
            waiting.running = True
            future.set_result(None)
            return
        traffic.running -= 1

    async def settle(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        if ticket.settled:
            return
        ticket.settled = True
        self._release_slot(ticket)
        for counter, (amount, kind) in ticket.reserved.items():
            prompt = engine_prompt(ticket, prompt_tokens) if kind == "requests" else prompt_tokens
            self._committed[counter] -= amount - charge(kind, amount, prompt, completion_tokens)
            self._held[counter] -= amount

    async def committed(self, counter: str) -> int:
        await self._load([counter])
        return self._committed[counter]

    async def budget_state(self, counters: list[str]) -> dict[str, CounterState]:
        await self._load(counters)
        return {c: CounterState(self._committed[c], self._held.get(c, 0)) for c in counters}

    async def traffic(self, key_id: str) -> TrafficInUse:
        running, waiting = await self.slots(key_id)
        traffic = self._traffic.get(key_id)
        clock = time.monotonic()
        starts = 0 if traffic is None else sum(1 for s in traffic.starts if s > clock - _WINDOW_S)
        return TrafficInUse(running, waiting, starts)

    async def slots(self, key_id: str) -> tuple[int, int]:
        traffic = self._traffic.get(key_id)
        if traffic is None:
            return 0, 0
        return traffic.running, sum(1 for _, f in traffic.waiters if not f.done())
