"""A process killed mid-request leaves no slot and no Hold behind once its lease expires."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.services import REDIS_URL
from tests.storage.helpers import principal
from vllm_acs.storage.counters import AdmitRequest
from vllm_acs.storage.counters_redis import RedisCounters

ROOT = Path(__file__).resolve().parents[2]


async def _nothing_settled(counters: object) -> dict[str, int]:
    return {}


def test_killed_holder_frees_its_slot_and_settles_its_hold_at_reported_usage(redis_prefix: str):
    counter = f"key:key_t:month:{datetime.now(timezone.utc).strftime('%Y-%m')}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.storage.admission_worker",
            "hold",
            redis_prefix,
            "1",
            str(time.time()),
            "1000",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

        async def check() -> None:
            counters = RedisCounters.from_url(
                REDIS_URL, _nothing_settled, prefix=redis_prefix, lease_ms=1000
            )
            try:
                assert await counters.slots("key_t") == (1, 0)
                assert await counters.committed(counter) == 10  # 1 prompt + 9 output held
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                await asyncio.sleep(1.3)  # past the 1 s lease the dead process can't renew
                # The next admission reaps the expired lease and Hold, then takes its own.
                who = principal(monthly_tokens=1000, max_running=1, max_waiting=0)
                ticket = await counters.admit(AdmitRequest(who, 1, 1, 9))
                assert ticket.running
                # The dead hold settled at what it had reported: 5 prompt + 3 output.
                assert await counters.committed(counter) == 8 + 10
                await counters.settle(ticket, 0, 0)
                assert await counters.committed(counter) == 8
                assert await counters.slots("key_t") == (0, 0)
            finally:
                await counters.close()

        asyncio.run(check())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
