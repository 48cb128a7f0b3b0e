"""`RedisCounters`: slots, starts and Holds shared by every process and node, as Lua scripts.

API server process. Each script is one atomic step on Redis's clock. Slots and Holds are leases the
holder renews in the background; when a process dies its leases expire, the slot frees and the Hold
settles at the usage last reported. A budget counter Redis does not hold is started from the
settled tokens in the database first, so a Redis restart does not reset anyone's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from ..auth.principal import Principal
from ..metrics import LEASES_LOST
from .counters import (
    AdmitRequest,
    Counters,
    CounterState,
    SettledReader,
    Ticket,
    TrafficInUse,
    engine_prompt,
)
from .errors import BudgetExhausted, LeaseLost, QueueFull, StartsExhausted, StorageError

logger = logging.getLogger(__name__)
_POLL_S = (0.005, 0.05)
# Each budget counter's part held by requests in flight lives beside it (admit.lua, settle.lua).
HELD_SUFFIX = "|held"


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("redis_scripts", f"{name}.lua").read_text()


class RedisCounters(Counters):
    name = "redis"

    def __init__(
        self, redis: Redis, read_settled: SettledReader, *, prefix: str, lease_ms: int
    ) -> None:
        self._redis = redis
        self._read_settled = read_settled
        self._prefix = prefix
        self._lease_ms = lease_ms
        self._admit = redis.register_script(_script("admit"))
        self._take_start = redis.register_script(_script("take_start"))
        self._wait_turn = redis.register_script(_script("wait_turn"))
        self._renew = redis.register_script(_script("renew"))
        self._settle = redis.register_script(_script("settle"))
        self._in_flight: dict[str, Ticket] = {}
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    def from_url(
        cls, url: str, read_settled: SettledReader, *, prefix: str, lease_ms: int
    ) -> RedisCounters:
        # Bounded waits: a Redis that does not answer is an outage (503), not a request that
        # hangs. redis-py's own default retries a dropped connection with backoffs of 1, 2, 4 s.
        redis = Redis.from_url(
            url,
            socket_connect_timeout=2,
            socket_timeout=5,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 2),
        )
        return cls(redis, read_settled, prefix=prefix, lease_ms=lease_ms)

    def _k(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    def _slot_keys(self, key_id: str) -> list[str]:
        return [self._k("run", key_id), self._k("wait", key_id), self._k("waitlease", key_id)]

    async def _seed(self, redis_keys: list[str]) -> None:
        """Starts counters Redis does not hold (first use in a period, or Redis lost them) from
        the settled tokens in the database; NX, so a counter another process started is kept."""
        bud = self._k("bud", "")
        counters = [key[len(bud) :] for key in redis_keys]
        settled = await self._read_settled(counters)
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, counter in zip(redis_keys, counters, strict=True):
                ttl_days = 3 if ":day:" in counter else 62
                pipe.set(key, settled.get(counter, 0), nx=True, px=ttl_days * 86400000)
            await pipe.execute()

    async def admit(self, request: AdmitRequest) -> Ticket:
        principal, limits = request.principal, request.principal.limits
        lines = request.lines
        ticket = Ticket(
            key_id=principal.key_id,
            applied_max_tokens=0,
            running=False,
            max_running=limits.max_running,
        )
        args: list[Any] = [
            ticket.id, self._lease_ms, limits.max_running, limits.max_waiting,
            limits.starts_per_minute, request.prompt_tokens, request.choices,
            request.max_tokens, self._k("hold", ""), len(lines),
            int(request.count_start), int(request.allow_clamp),
        ]  # fmt: skip
        for line in lines:
            args += [
                self._k("bud", line.counter),
                line.granularity,
                line.kind,
                line.limit,
                line.name,
            ]
        keys = [
            *self._slot_keys(principal.key_id),
            self._k("starts", principal.key_id),
            self._k("seq", principal.key_id),
            self._k("holds"),
            self._k("hold", ticket.id),
        ]
        for _attempt in range(3):
            answer = await self._admit(keys, args)
            result = [x.decode() if isinstance(x, bytes) else x for x in answer]
            if result[0] != "seed":
                break
            await self._seed(result[1:])
        else:
            raise StorageError(
                "Redis dropped the budget counters just started from the database, three times "
                "in a row: is Redis evicting keys? (set maxmemory-policy noeviction)"
            )
        if result[0] == "budget":
            raise BudgetExhausted(result[1], fits=int(result[2]), asked=request.max_tokens)
        if result[0] == "rate":
            raise StartsExhausted(int(result[1]))
        if result[0] == "full":
            raise QueueFull(int(result[1]))
        ticket.applied_max_tokens = int(result[1])
        ticket.running = result[2] == "run"
        # What the ticket holds lives in its Redis hash (settle.lua reads it there), not here.
        self._in_flight[ticket.id] = ticket
        self._ensure_renewer()
        return ticket

    async def take_start(self, principal: Principal) -> None:
        # A start id of its own: the window's members are ids, and a ticket's id is not made yet.
        args = [uuid.uuid4().hex, principal.limits.starts_per_minute]
        answer = await self._take_start([self._k("starts", principal.key_id)], args)
        result = [x.decode() if isinstance(x, bytes) else x for x in answer]
        if result[0] == "rate":
            raise StartsExhausted(int(result[1]))

    async def wait_for_slot(self, ticket: Ticket) -> None:
        delay = _POLL_S[0]
        keys = [*self._slot_keys(ticket.key_id), self._k("holds")]
        while not ticket.running:
            answer = await self._wait_turn(keys, [ticket.id, self._lease_ms, ticket.max_running])
            state = answer[0].decode()
            if state == "run":
                ticket.running = True
            elif state == "lost":
                logger.warning(
                    "waiting request %s lost its place: its lease was not renewed within %d ms "
                    "(a stalled event loop?); it is answered queue_full",
                    ticket.id,
                    self._lease_ms,
                )
                raise LeaseLost(ticket.id)
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _POLL_S[1])

    async def settle(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        if ticket.settled:
            return
        ticket.settled = True
        self._in_flight.pop(ticket.id, None)
        keys = [*self._slot_keys(ticket.key_id), self._k("holds"), self._k("hold", ticket.id)]
        args = [ticket.id, prompt_tokens, completion_tokens, engine_prompt(ticket, prompt_tokens)]
        settled = await self._settle(keys, args)
        if not settled:
            logger.warning(
                "hold %s had expired before it settled; charged its last progress", ticket.id
            )

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while self._in_flight:
            await asyncio.sleep(self._lease_ms / 3000)
            tickets = list(self._in_flight.values())
            if not tickets:
                break
            args: list[Any] = [self._lease_ms, self._k("hold", "")]
            for t in tickets:
                run_key = self._slot_keys(t.key_id)[0] if t.running else ""
                args += [t.id, run_key, t.progress_prompt, t.progress_output]
            try:
                lost = await self._renew([self._k("holds")], args)
            except Exception:  # a brief Redis outage must not kill the renewer
                logger.exception("renewing %d leases failed; retrying", len(tickets))
                continue
            for raw in lost:
                self._lost(raw.decode() if isinstance(raw, bytes) else str(raw))

    def _lost(self, ticket_id: str) -> None:
        """Redis no longer holds this ticket: another process's admit settled its expired Hold
        and freed its slot (this process stalled past its lease), or Redis restarted empty.
        The process stops counting the slot as its own and the request is stopped."""
        ticket = self._in_flight.pop(ticket_id, None)
        if ticket is None or ticket.lease_lost.is_set():
            return
        logger.warning(
            "the Redis lease of request %s had lapsed when it was renewed (a stall longer than "
            "%d ms, or Redis restarted): its slot and Hold are gone, so it is stopped",
            ticket_id,
            self._lease_ms,
        )
        LEASES_LOST.inc()
        ticket.lease_lost.set()

    async def committed(self, counter: str) -> int:
        return int(await self._redis.get(self._k("bud", counter)) or 0)

    async def budget_state(self, counters: list[str]) -> dict[str, CounterState]:
        """One MGET of each counter and its held part (`<counter>|held`, kept by the scripts);
        a counter Redis does not hold has no Hold and is read from the database."""
        if not counters:
            return {}
        names = [self._k("bud", c) for c in counters]
        values = await self._redis.mget([n for name in names for n in (name, name + HELD_SUFFIX)])
        missing = [c for i, c in enumerate(counters) if values[2 * i] is None]
        settled = await self._read_settled(missing) if missing else {}
        state: dict[str, CounterState] = {}
        for i, counter in enumerate(counters):
            committed, held = values[2 * i], values[2 * i + 1]
            if committed is None:
                state[counter] = CounterState(settled.get(counter, 0), 0)
            else:
                # Never below zero: a held part Redis evicted alone must not inflate `settled`.
                held_now = min(max(0, int(held or 0)), int(committed))
                state[counter] = CounterState(int(committed), held_now)
        return state

    async def traffic(self, key_id: str) -> TrafficInUse:
        """Leases and starts still valid on Redis's clock (expired entries are removed only by
        the next admit, so they are counted by score here)."""
        seconds, micros = await self._redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        run, _, wait_lease = self._slot_keys(key_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcount(run, f"({now_ms}", "+inf")
            pipe.zcount(wait_lease, f"({now_ms}", "+inf")
            pipe.zcount(self._k("starts", key_id), f"({now_ms - 60000}", "+inf")
            running, waiting, starts = await pipe.execute()
        return TrafficInUse(int(running), int(waiting), int(starts))

    async def slots(self, key_id: str) -> tuple[int, int]:
        run, wait, _ = self._slot_keys(key_id)
        return int(await self._redis.zcard(run)), int(await self._redis.zcard(wait))

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self._redis.aclose()
