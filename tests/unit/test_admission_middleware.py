"""AdmissionMiddleware in process: Hold, clamp, refusals with their headers, Settle, usage rows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from tests.unit.access_stack import (
    EngineControl,
    access_stack,
    occupy_the_slot_and_queue_one,
    until,
)
from vllm_acs.settings import Settings
from vllm_acs.storage import Storage, open_storage


@dataclass
class Env:
    storage: Storage
    control: EngineControl
    client: httpx.AsyncClient
    app: Any
    key: Any
    secret: str

    async def post(self, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
        sent = {"Authorization": f"Bearer {self.secret}", "X-Request-Id": "req-1"}
        sent.update(headers or {})
        return await self.client.post("/v1/completions", headers=sent, json=body)

    async def committed(self) -> int:
        month = datetime.now(timezone.utc).strftime("%Y-%m")
        return await self.storage.counters.committed(f"key:{self.key.id}:month:{month}")

    async def rows(self) -> list[dict[str, Any]]:
        await self.storage.ledger.flush(5)
        return await self.storage.usage.rows()


def _run(tmp_path: Path, body: Callable[[Env], Awaitable[None]], **limits: Any) -> None:
    async def main() -> None:
        storage = await open_storage(Settings(home=tmp_path))
        try:
            account = await storage.accounts.create("acct", approved=True)
            key, secret = await storage.keys.create(account.id, **limits)
            control = EngineControl()
            app = access_stack(storage, control)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await body(Env(storage, control, client, app, key, secret))
        finally:
            await storage.close()

    asyncio.run(main())


def test_success_settles_to_real_usage_and_writes_one_row(tmp_path: Path):
    async def body(env: Env) -> None:
        answer = await env.post(
            prompt="one two three", max_tokens=10, n=2, generate=4, workload="eval-7"
        )
        assert answer.status_code == 200 and "x-acs-max-tokens-clamped" not in answer.headers
        assert answer.json()["usage"]["completion_tokens"] == 8
        assert await env.committed() == 3 + 8
        assert await env.storage.counters.slots(env.key.id) == (0, 0)
        (row,) = await env.rows()
        assert (row["prompt_tokens"], row["completion_tokens"], row["status"]) == (3, 8, 200)
        assert (row["key_prefix"], row["request_id"], row["workload"]) == (
            env.key.prefix,
            "req-1",
            "eval-7",
        )
        assert row["model"] == "tiny" and row["route"] == "/v1/completions"
        assert env.secret not in json.dumps(row, default=str) and "one two" not in str(row)
        # The settled tokens are durable: a fresh process would start from them.
        month = datetime.now(timezone.utc).strftime("%Y-%m")
        settled = await env.storage.usage.read_settled([f"key:{env.key.id}:month:{month}"])
        assert settled == {f"key:{env.key.id}:month:{month}": 11}

    _run(tmp_path, body, monthly_tokens=1000)


def test_budget_clamps_max_tokens_and_says_so(tmp_path: Path):
    async def body(env: Env) -> None:
        answer = await env.post(prompt="a b", max_tokens=50)
        assert answer.status_code == 200
        assert answer.headers["x-acs-max-tokens-clamped"] == (
            "requested=50,applied=18,reason=budget,source=client"
        )
        assert env.control.seen_max_tokens == [18]
        answer = await env.post(prompt="a b")  # the default max_tokens is clamped too
        assert answer.status_code == 429

    _run(tmp_path, body, monthly_tokens=20)


def test_a_caller_that_refuses_the_clamp_gets_a_429_that_says_what_fits(tmp_path: Path):
    async def body(env: Env) -> None:
        refuse = {"X-Acs-Budget-Clamp": "refuse"}
        answer = await env.post(refuse, prompt="a b", max_tokens=50)
        assert answer.status_code == 429 and "x-acs-max-tokens-clamped" not in answer.headers
        error = answer.json()["error"]
        assert error["code"] == "budget_exceeded"
        assert error["message"].startswith(
            "This request asks for up to 50 tokens per choice; this API key's monthly token "
            "budget holds only 18 per choice."
        )
        assert answer.headers["x-should-retry"] == "false"
        # Refused before the engine: nothing held, nothing charged.
        assert env.control.entered == 0 and await env.committed() == 0
        # What fits in full runs unshortened; the budget then holds nothing, which says so.
        answer = await env.post(refuse, prompt="a b", max_tokens=18)
        assert answer.status_code == 200 and "x-acs-max-tokens-clamped" not in answer.headers
        assert env.control.seen_max_tokens == [18]
        answer = await env.post(refuse, prompt="a", max_tokens=1)
        exhausted = answer.json()["error"]["message"]
        assert exhausted == "Monthly token budget exhausted for this API key."

    _run(tmp_path, body, monthly_tokens=20)


def test_budget_exceeded_names_the_budget_and_is_not_retryable(tmp_path: Path):
    async def body(env: Env) -> None:
        answer = await env.post(prompt="a b c", max_tokens=5)
        assert answer.status_code == 429
        error = answer.json()["error"]
        assert error["code"] == "budget_exceeded"
        assert error["message"] == "Daily token budget exhausted for this API key."
        assert answer.headers["x-should-retry"] == "false"
        assert "retry-after" not in answer.headers and "retry-after-ms" not in answer.headers
        assert env.control.entered == 0
        (row,) = await env.rows()
        assert row["status"] == 429 and row["prompt_tokens"] == 0

    _run(tmp_path, body, daily_tokens=3)


def test_spend_cap_answers_429_with_an_hour_to_wait(tmp_path: Path):
    async def body(env: Env) -> None:
        await env.storage.accounts.set_spend_cap(env.key.account_id, True)
        answer = await env.post(prompt="a", max_tokens=1)
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "spend_cap"
        assert answer.headers["retry-after"] == "3600"
        await env.storage.accounts.set_spend_cap(env.key.account_id, False)
        assert (await env.post(prompt="a", max_tokens=1)).status_code == 200

    _run(tmp_path, body)


def test_starts_per_minute_answer_rate_limited_with_retry_headers(tmp_path: Path):
    async def body(env: Env) -> None:
        for _ in range(2):
            assert (await env.post(prompt="a", max_tokens=1)).status_code == 200
        answer = await env.post(prompt="a", max_tokens=1)
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "rate_limited"
        assert 59 <= int(answer.headers["retry-after"]) <= 60
        assert 58_000 < int(answer.headers["retry-after-ms"]) <= 60_001

    _run(tmp_path, body, starts_per_minute=2)


def test_slots_queue_fifo_and_refuse_queue_full(tmp_path: Path):
    async def body(env: Env) -> None:
        first, second = await occupy_the_slot_and_queue_one(
            env.storage,
            env.control,
            env.key.id,
            lambda: env.post(prompt="a", max_tokens=1, block=True),
            lambda: env.post(prompt="a", max_tokens=1),
        )
        full = await env.post(prompt="a", max_tokens=1)
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert full.headers["retry-after"] == "1" and full.headers["retry-after-ms"] == "1000"
        assert env.control.entered == 1  # the second waits for the slot
        env.control.release.set()
        assert (await first).status_code == 200 and (await second).status_code == 200
        assert await env.storage.counters.slots(env.key.id) == (0, 0)

    _run(tmp_path, body, max_running=1, max_waiting=1)


def test_stream_settles_from_the_usage_chunk_or_by_counting(tmp_path: Path):
    async def body(env: Env) -> None:
        answer = await env.post(
            prompt="a b", max_tokens=9, generate=3, n=2, stream=True, include_usage=True
        )
        assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        assert await env.committed() == 2 + 6
        answer = await env.post(prompt="a b", max_tokens=9, generate=4, stream=True)
        assert answer.status_code == 200
        assert await env.committed() == 8 + 2 + 4
        rows = await env.rows()
        assert sorted((r["prompt_tokens"], r["completion_tokens"]) for r in rows) == [
            (2, 4),
            (2, 6),
        ]

    _run(tmp_path, body, monthly_tokens=100)


def test_engine_error_settles_to_nothing(tmp_path: Path):
    async def body(env: Env) -> None:
        answer = await env.post(prompt="a b c", max_tokens=20, fail=True)
        assert answer.status_code == 500
        assert await env.committed() == 0
        (row,) = await env.rows()
        assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == (500, 0, 0)

    _run(tmp_path, body, monthly_tokens=100)


async def _call(app: Any, secret: str, body: dict, disconnect: asyncio.Event) -> list[dict]:
    """Calls the ASGI app directly; the client 'disconnects' when `disconnect` is set."""
    sent: list[dict] = []
    payload = json.dumps(body).encode()
    messages = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "root_path": "",
        "query_string": b"",
        "server": ("t", 80),
        "client": ("c", 1),
        "headers": [
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-type", b"application/json"),
        ],
    }
    await app(scope, receive, send)
    return sent


def test_client_disconnect_mid_stream_settles_at_what_was_delivered(tmp_path: Path):
    async def body(env: Env) -> None:
        gone = asyncio.Event()
        call = asyncio.create_task(
            _call(
                env.app,
                env.secret,
                {"prompt": "a b", "max_tokens": 50, "stream": True, "delay": 0.01},
                gone,
            )
        )

        async def held_and_streaming() -> bool:
            return await env.committed() == 52 and env.control.entered > 0

        await until(held_and_streaming, watch=call)
        await asyncio.sleep(0.05)
        gone.set()
        sent = await asyncio.wait_for(call, 5)
        chunks = sum(m.get("body", b"").count(b'"text"') for m in sent)
        assert 0 < chunks < 50
        assert await env.committed() == 2 + chunks
        (row,) = await env.rows()
        assert row["completion_tokens"] == chunks and row["status"] == 200

    _run(tmp_path, body, monthly_tokens=100)


def test_client_leaving_the_queue_frees_its_place(tmp_path: Path):
    async def body(env: Env) -> None:
        gone = asyncio.Event()
        first, waiting = await occupy_the_slot_and_queue_one(
            env.storage,
            env.control,
            env.key.id,
            lambda: env.post(prompt="a", max_tokens=1, block=True),
            lambda: _call(env.app, env.secret, {"prompt": "a", "max_tokens": 1}, gone),
        )
        gone.set()
        assert await asyncio.wait_for(waiting, 5) == []  # nothing is sent to a gone client
        assert await env.storage.counters.slots(env.key.id) == (1, 0)
        env.control.release.set()
        assert (await first).status_code == 200
        statuses = sorted(r["status"] for r in await env.rows())
        assert statuses == [200, 499]

    _run(tmp_path, body, max_running=1, max_waiting=1)


def test_the_activation_quota_refusal_is_its_own_code_and_not_retryable():
    from vllm_acs.auth.refusals import refusal
    from vllm_acs.storage.errors import BudgetExhausted
    from vllm_acs.storage.periods import ACTIVATION_QUOTA

    error = refusal(BudgetExhausted(ACTIVATION_QUOTA))
    assert (error.status, error.code, error.type) == (
        429,
        "activation_quota_exceeded",
        "rate_limit_error",
    )
    assert "start of next month, UTC" in error.message
    assert error.headers == {"x-should-retry": "false"}
    assert refusal(BudgetExhausted("key_monthly")).code == "budget_exceeded"
