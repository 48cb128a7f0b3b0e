"""The shared-counters interface: a slot, a start and the Hold on every budget in one atomic step.

API server process. Two backends implement it: `EmbeddedCounters` (one process: memory, with
settled usage from SQLite) and `RedisCounters` (many processes: Lua scripts, leases). A completion
job takes its start alone at submit (`take_start`) and is admitted later without one and without
clamping (`AdmitRequest.count_start`, `allow_clamp`).
"""

from __future__ import annotations

import abc
import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from ..auth.principal import Principal
from .periods import BudgetKind, BudgetLine, budget_lines, reservation

# Reads the settled tokens of counters (full names, with period) from the database.
SettledReader = Callable[[Iterable[str]], Awaitable[dict[str, int]]]


@dataclass
class AdmitRequest:
    principal: Principal
    prompt_tokens: int
    choices: int
    max_tokens: int
    # A capture or steering request: it also takes a unit of the key's monthly activation quota.
    activation: bool = False
    # False for a completion job's run: the job took its start when it was submitted.
    count_start: bool = True
    # False for a job: a Hold short of the full max_tokens refuses (BudgetExhausted), never clamps.
    allow_clamp: bool = True

    @property
    def lines(self) -> list[BudgetLine]:
        return budget_lines(self.principal, activation=self.activation)


@dataclass
class Ticket:
    """One admitted request: its slot (running or waiting) and its Hold, until settled."""

    key_id: str
    applied_max_tokens: int
    running: bool
    # Full counter name -> (tokens reserved, kind of budget): the embedded backend's record
    # (the Redis backend keeps it in the ticket's hash in Redis).
    reserved: dict[str, tuple[int, BudgetKind]] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Usage so far, reported while the request runs: an expired lease settles at this.
    progress_prompt: int = 0
    progress_output: int = 0
    settled: bool = False
    # The key's limit when it was admitted: a waiter keeps the value it came with.
    max_running: int = 1
    # Set when the shared counters no longer hold this ticket (its lease lapsed while the
    # process stalled, or Redis restarted empty): the request is stopped, since it runs without
    # a slot or a Hold that anyone else can see.
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)


def charge(kind: BudgetKind, reserved: int, prompt_tokens: int, completion_tokens: int) -> int:
    """What a settled request costs one budget: its real usage, never more than was held."""
    return min(reserved, reservation(kind, prompt_tokens, completion_tokens))


def engine_prompt(ticket: Ticket, prompt_tokens: int) -> int:
    """The prompt an activation unit settles at: an error answer reports no usage, but once the
    engine worked on the prompt (reported progress) the unit stays used."""
    return max(prompt_tokens, ticket.progress_prompt)


def activation_units(ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> int:
    """The activation units an activation request's usage row records (0 or 1)."""
    return reservation("requests", engine_prompt(ticket, prompt_tokens), completion_tokens)


@dataclass(frozen=True)
class CounterState:
    """One budget counter as admission sees it: `committed` (settled plus held) is what the limit
    is compared with; `held` is the part reserved by requests in flight."""

    committed: int
    held: int

    @property
    def settled(self) -> int:
        return self.committed - self.held


@dataclass(frozen=True)
class TrafficInUse:
    """A key's traffic now, across every process sharing the counters."""

    running: int
    waiting: int
    starts_last_minute: int


class Counters(abc.ABC):
    """Slots (running + waiting, FIFO), starts per minute and Holds, per key."""

    name: str

    @abc.abstractmethod
    async def admit(self, request: AdmitRequest) -> Ticket:
        """Takes the Hold, a start and a slot (running or a place in the queue) atomically.

        Raises BudgetExhausted, StartsExhausted or QueueFull (storage.errors), holding nothing.
        The ticket's `applied_max_tokens` may be lower than asked: what fits every budget; with
        `allow_clamp=False` a budget that cannot hold the full `max_tokens` raises BudgetExhausted
        (naming the first such budget) instead. With `count_start=False` the starts per minute are
        neither checked nor taken.
        """

    @abc.abstractmethod
    async def take_start(self, principal: Principal) -> None:
        """Takes one start of the key's starts-per-minute window atomically (a job's submit).

        Raises StartsExhausted, as admit does, taking nothing. No slot, no Hold.
        """

    @abc.abstractmethod
    async def wait_for_slot(self, ticket: Ticket) -> None:
        """Returns once a waiting ticket runs. Cancelling it gives the queue place back."""

    def report_progress(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        ticket.progress_prompt = prompt_tokens
        ticket.progress_output = completion_tokens

    @abc.abstractmethod
    async def settle(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        """Charges the real usage, frees the rest of the Hold and the slot. Idempotent."""

    @abc.abstractmethod
    async def committed(self, counter: str) -> int:
        """Settled plus held tokens of one full counter name (for tests and the CLI)."""

    @abc.abstractmethod
    async def slots(self, key_id: str) -> tuple[int, int]:
        """(running, waiting) of a key, across every process sharing the counters."""

    @abc.abstractmethod
    async def budget_state(self, counters: list[str]) -> dict[str, CounterState]:
        """Committed and held tokens of full counter names (with period), as admission sees them
        now; a counter never used is settled from the database (zero held)."""

    @abc.abstractmethod
    async def traffic(self, key_id: str) -> TrafficInUse:
        """Running and waiting requests and starts of the last 60 s of a key."""

    async def close(self) -> None:  # noqa: B027  # optional for backends without resources
        pass
