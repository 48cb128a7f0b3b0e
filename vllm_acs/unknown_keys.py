"""What the key check remembers of keys it refused: unknown prefixes for a few seconds, and when it
last logged a refusal. API server process (the built-in `acs_authenticate` plugin).

A flood of well-formed but unknown keys would otherwise cost one database round trip each (on
PostgreSQL, on the one connection every key check shares) and one log line each.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

# A prefix no key has is answered without the database for this long. A key whose prefix was
# presented before the key existed (only by someone holding its secret before it was made) is
# refused on every node until this passes: short enough not to matter to anyone.
UNKNOWN_PREFIX_TTL_S = 5.0
# Prefixes remembered at once (the oldest forgotten first): ~100 bytes each.
UNKNOWN_PREFIX_MAX = 10_000
# One log line for the first refusal, then at most one per this many seconds, with a count.
REFUSAL_LOG_EVERY_S = 60.0

Clock = Callable[[], float]


class UnknownPrefixes:
    """Prefixes that matched no key when last looked up, each for `ttl_s` seconds."""

    def __init__(
        self,
        ttl_s: float = UNKNOWN_PREFIX_TTL_S,
        max_entries: int = UNKNOWN_PREFIX_MAX,
        clock: Clock = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # prefix -> forgotten at

    def __contains__(self, prefix: str) -> bool:
        until = self._until.get(prefix)
        if until is None:
            return False
        if self.clock() >= until:
            del self._until[prefix]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)

    def add(self, prefix: str) -> None:
        self._until.pop(prefix, None)
        self._until[prefix] = self.clock() + self.ttl_s
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def forget(self, prefix: str) -> None:
        self._until.pop(prefix, None)


class RefusalLog:
    """Logs refused keys by sampling: the first at once, then one line per `every_s` at most,
    saying how many were refused since the last line."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = REFUSAL_LOG_EVERY_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self._last: float | None = None
        self._unlogged = 0

    def refused(self, prefix: str) -> None:
        now = self.clock()
        self._unlogged += 1
        if self._last is not None and now - self._last < self.every_s:
            return
        if self._last is None:
            self.logger.info("refused an unknown API key (prefix %s)", prefix)
        else:
            self.logger.info(
                "refused %d unknown API keys in the last %.0f s (the last: prefix %s)",
                self._unlogged,
                now - self._last,
                prefix,
            )
        self._last, self._unlogged = now, 0
