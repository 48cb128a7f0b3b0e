"""Domain errors of storage and the shared counters; callers map them to HTTP answers.

Any process that uses storage. Storage never raises HTTP errors itself.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error storage raises on purpose."""


class NotFoundError(StorageError):
    pass


class ConflictError(StorageError):
    pass


class SchemaNotReady(StorageError):
    """The database is not at the migration head; the message says what to run."""


class BudgetExhausted(StorageError):
    """The Hold does not fit `budget` (a name like `key_monthly`): not even one output token per
    choice (`fits` 0), or, for a request that may not be clamped, not its `asked` max_tokens
    (`fits` is then the max_tokens that budget would still hold)."""

    def __init__(self, budget: str, *, fits: int = 0, asked: int = 0) -> None:
        super().__init__(budget)
        self.budget = budget
        self.fits = fits
        self.asked = asked


class QueueFull(StorageError):
    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"queue full; retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class StartsExhausted(StorageError):
    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"starts per minute used up; retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class LeaseLost(StorageError):
    """A waiting ticket's lease expired before it got a slot (the process stalled too long)."""


class JobCapacityReached(StorageError):
    """The key has `limit` jobs not ended already (queued or running): no new one is accepted."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"at most {limit} jobs not ended per key")
        self.limit = limit


class IdempotencyRecordLost(ConflictError):
    """The idempotency record a write was to complete is no longer running (released, done)."""


class HarvestLimitReached(StorageError):
    """A harvest submit past one of its limits: `limit` is `concurrency` (the key's harvests not
    ended), `capacity` (the deployment's) or `quota` (the key's this UTC month)."""

    def __init__(self, limit: str, value: int) -> None:
        super().__init__(f"harvest {limit} limit {value} reached")
        self.limit = limit
        self.value = value


class LoomLimitReached(StorageError):
    """A Loom write past a limit: `limit` is `looms` (the key's Looms) or `nodes` (one Loom's)."""

    def __init__(self, limit: str, value: int) -> None:
        super().__init__(f"loom {limit} limit {value} reached")
        self.limit = limit
        self.value = value


class KeyCapacityReached(StorageError):
    """The account has `limit` live keys (active or paused) already: no new one is made."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"at most {limit} live keys per account")
        self.limit = limit


class PausedByOperator(StorageError):
    """A key that the operator paused: only the operator resumes it."""
