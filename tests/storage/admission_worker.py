"""A separate OS process that admits requests on the Redis counters (for the exactness tests).

Run as `python -m tests.storage.admission_worker MODE PREFIX COUNT START_AT [LIMIT]`: it waits
until START_AT (epoch seconds), fires COUNT concurrent admissions and prints one JSON line.
MODE `budget` and `slots` settle everything once stdin gives a line; `hold` takes one ticket,
reports usage so far, prints `ready` and sleeps until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable

from tests.services import REDIS_URL
from tests.storage.helpers import principal
from vllm_acs.storage.counters import AdmitRequest
from vllm_acs.storage.counters_redis import RedisCounters
from vllm_acs.storage.errors import StorageError


async def _nothing_settled(counters: Iterable[str]) -> dict[str, int]:
    return {}


async def main(mode: str, prefix: str, count: int, start_at: float, limit: int) -> None:
    lease_ms = 1000 if mode == "hold" else 10_000
    counters = RedisCounters.from_url(REDIS_URL, _nothing_settled, prefix=prefix, lease_ms=lease_ms)
    if mode == "budget":
        who = principal(monthly_tokens=limit, max_running=1000, max_waiting=1000)
    elif mode == "slots":
        who = principal(max_running=limit, max_waiting=0)
    else:
        who = principal(monthly_tokens=limit)
    late = time.time() > start_at
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one() -> object:
        try:
            return await counters.admit(AdmitRequest(who, prompt_tokens=1, choices=1, max_tokens=9))
        except StorageError as refused:
            return type(refused).__name__

    results = await asyncio.gather(*(one() for _ in range(count)))
    tickets = [r for r in results if not isinstance(r, str)]
    if mode == "hold":
        counters.report_progress(tickets[0], 5, 3)
        await asyncio.sleep(0.6)  # one renewal (every lease/3) carries the progress to Redis
        print("ready", flush=True)
        await asyncio.sleep(3600)
    print(
        json.dumps(
            {
                "admitted": len(tickets),
                "running": sum(t.running for t in tickets),
                "applied": sorted({t.applied_max_tokens for t in tickets}),
                "refused": sorted({r for r in results if isinstance(r, str)}),
                "late": late,
            }
        ),
        flush=True,
    )
    # Hold everything until the parent has both answers, then settle.
    await asyncio.to_thread(sys.stdin.readline)
    for ticket in tickets:
        await counters.settle(ticket, 1, 9)
    await counters.close()


if __name__ == "__main__":
    mode, prefix, count, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    asyncio.run(main(mode, prefix, count, start_at, int(sys.argv[5])))
