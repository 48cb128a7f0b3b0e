"""AdmissionMiddleware on the Redis counters: clamp, FIFO queue across polling, settle, rows."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

import httpx

from tests.services import REDIS_URL
from tests.unit.access_stack import EngineControl, access_stack, occupy_the_slot_and_queue_one
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage


def test_admission_with_redis_counters(tmp_path: Path, redis_prefix: str):
    async def body() -> None:
        settings = Settings(home=tmp_path, redis_url=REDIS_URL, redis_prefix=redis_prefix)
        storage = await open_storage(settings)
        try:
            assert storage.counters.name == "redis"
            account = await storage.accounts.create("acct", approved=True)
            key, secret = await storage.keys.create(
                account.id, monthly_tokens=30, max_running=1, max_waiting=1
            )
            control = EngineControl()
            transport = httpx.ASGITransport(app=access_stack(storage, control))
            headers = {"Authorization": f"Bearer {secret}"}
            month = datetime.now(timezone.utc).strftime("%Y-%m")
            counter = f"key:{key.id}:month:{month}"
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

                async def post(**json: object) -> httpx.Response:
                    return await client.post("/v1/completions", headers=headers, json=json)

                first, second = await occupy_the_slot_and_queue_one(
                    storage,
                    control,
                    key.id,
                    lambda: post(prompt="a b", max_tokens=5, block=True),
                    lambda: post(prompt="a b", max_tokens=50),
                )
                # 30 - 7 held by the first - 2 prompt: the waiting one is clamped to 21.
                assert await storage.counters.committed(counter) == 7 + 2 + 21
                # The budget is all held now; that refusal comes before the full queue's.
                full = await post(prompt="a", max_tokens=1)
                assert full.status_code == 429
                assert full.json()["error"]["code"] == "budget_exceeded"
                control.release.set()
                answers = [await first, await second]
                assert [a.status_code for a in answers] == [200, 200]
                assert answers[1].headers["x-acs-max-tokens-clamped"] == (
                    "requested=50,applied=21,reason=budget,source=client"
                )
                assert await storage.counters.committed(counter) == 30
                assert await storage.counters.slots(key.id) == (0, 0)
                exhausted = await post(prompt="a", max_tokens=1)
                assert exhausted.json()["error"]["message"] == (
                    "Monthly token budget exhausted for this API key."
                )
            await storage.ledger.flush(5)
            rows = await storage.usage.rows()
            spent = sorted((r["status"], r["prompt_tokens"] + r["completion_tokens"]) for r in rows)
            assert spent == [(200, 7), (200, 23), (429, 0), (429, 0)]
            settled = await storage.usage.read_settled([counter])
            assert settled == {counter: 30}
        finally:
            await storage.close()

    asyncio.run(body())
