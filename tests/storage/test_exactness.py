"""Exactness under concurrency: 200 admissions against a budget (or a slot limit) that fits K.

Embedded counters over SQLite in one process; Redis counters from two separate OS processes.
Neither admits more than K, and no more than the budget is ever committed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.services import REDIS_URL
from tests.storage.helpers import approved_key, principal, settings_for
from vllm_acs.storage import open_storage
from vllm_acs.storage.counters import AdmitRequest
from vllm_acs.storage.counters_redis import RedisCounters
from vllm_acs.storage.errors import StorageError

ROOT = Path(__file__).resolve().parents[2]
K = 37
# Every request holds 1 prompt + 9 output tokens: a budget of 10*K fits exactly K of them.
BUDGET = 10 * K


def _month() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m")


def test_embedded_budget_admits_exactly_k(sqlite_url: str):
    async def body() -> None:
        storage = await open_storage(settings_for(sqlite_url))
        try:
            key, _ = await approved_key(storage, monthly_tokens=BUDGET)
            who = principal(
                key.id, key.account_id, monthly_tokens=BUDGET, max_running=500, max_waiting=500
            )

            async def one() -> object:
                try:
                    return await storage.counters.admit(AdmitRequest(who, 1, 1, 9))
                except StorageError as refused:
                    return refused

            results = await asyncio.gather(*(one() for _ in range(200)))
            tickets = [r for r in results if not isinstance(r, StorageError)]
            assert len(tickets) == K
            assert {t.applied_max_tokens for t in tickets} == {9}
            counter = f"key:{key.id}:month:{_month()}"
            assert await storage.counters.committed(counter) == BUDGET
            for ticket in tickets:
                await storage.counters.settle(ticket, 1, 9)
            assert await storage.counters.committed(counter) == BUDGET
        finally:
            await storage.close()

    asyncio.run(body())


def test_embedded_running_slots_admit_exactly_k(sqlite_url: str):
    async def body() -> None:
        storage = await open_storage(settings_for(sqlite_url))
        try:
            who = principal(max_running=K, max_waiting=0)
            results = await asyncio.gather(
                *(storage.counters.admit(AdmitRequest(who, 1, 1, 9)) for _ in range(200)),
                return_exceptions=True,
            )
            tickets = [r for r in results if not isinstance(r, BaseException)]
            assert len(tickets) == K and all(t.running for t in tickets)
            assert await storage.counters.slots(who.key_id) == (K, 0)
        finally:
            await storage.close()

    asyncio.run(body())


def _two_processes(mode: str, prefix: str, limit: int) -> list[dict]:
    start_at = time.time() + 6.0  # both processes have imported by then (asserted below)
    command = [sys.executable, "-m", "tests.storage.admission_worker", mode, prefix, "100"]
    procs = [
        subprocess.Popen(
            [*command, str(start_at), str(limit)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [json.loads(proc.stdout.readline()) for proc in procs]  # type: ignore[union-attr]
        for proc in procs:
            proc.communicate("settle\n", timeout=60)
            assert proc.returncode == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not any(o["late"] for o in outputs), "a worker started after the common start time"
    return outputs


def _committed(prefix: str, counter: str) -> int:
    async def read() -> int:
        counters = RedisCounters.from_url(REDIS_URL, None, prefix=prefix, lease_ms=1000)  # type: ignore[arg-type]
        try:
            return await counters.committed(counter)
        finally:
            await counters.close()

    return asyncio.run(read())


def test_redis_budget_admits_exactly_k_across_two_processes(redis_prefix: str):
    outputs = _two_processes("budget", redis_prefix, BUDGET)
    assert sum(o["admitted"] for o in outputs) == K
    assert all(o["applied"] in ([], [9]) for o in outputs)
    assert {r for o in outputs for r in o["refused"]} == {"BudgetExhausted"}
    # Both processes settled every ticket at its full hold: exactly the budget, never more.
    assert _committed(redis_prefix, f"key:key_t:month:{_month()}") == BUDGET


def test_redis_running_slots_admit_exactly_k_across_two_processes(redis_prefix: str):
    outputs = _two_processes("slots", redis_prefix, K)
    assert sum(o["running"] for o in outputs) == sum(o["admitted"] for o in outputs) == K
    assert {r for o in outputs for r in o["refused"]} == {"QueueFull"}
