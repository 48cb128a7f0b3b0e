"""Concurrent request bursts for the access tests: many clients at once, answers tallied."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx


async def _burst(
    urls: list[str], key: str, body: dict[str, Any], count: int
) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(limits=limits, timeout=300, headers=headers) as client:
        return await asyncio.gather(
            *(client.post(f"{urls[i % len(urls)]}/v1/completions", json=body) for i in range(count))
        )


def burst(urls: list[str], key: str, body: dict[str, Any], count: int) -> list[httpx.Response]:
    """`count` requests sent at once, spread over the servers at `urls` in turn."""
    return asyncio.run(_burst(urls, key, body, count))


def tally(responses: list[httpx.Response]) -> Counter:
    """How many answers of each kind: 200, or the error code."""
    return Counter("200" if r.status_code == 200 else r.json()["error"]["code"] for r in responses)


def spent(responses: list[httpx.Response]) -> int:
    return sum(r.json()["usage"]["total_tokens"] for r in responses if r.status_code == 200)


async def _hold_burst(urls: list[str], key: str, body: dict[str, Any], count: int) -> Counter:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {key}"}
    outcomes: Counter = Counter()
    everyone_answered = asyncio.Event()

    async def one(client: httpx.AsyncClient, url: str) -> None:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code == 200:
                outcomes["200"] += 1
            else:
                outcomes[(await response.aread()) and response.json()["error"]["code"]] += 1
            if sum(outcomes.values()) == count:
                everyone_answered.set()
            if response.status_code == 200:
                # Keep the slot until every other request has its answer, then leave: the
                # server cancels the stream and gives the slot back.
                await everyone_answered.wait()

    async with httpx.AsyncClient(limits=limits, timeout=300, headers=headers) as client:
        await asyncio.gather(*(one(client, urls[i % len(urls)]) for i in range(count)))
    return outcomes


def hold_burst(urls: list[str], key: str, body: dict[str, Any], count: int) -> Counter:
    """`count` streaming requests at once; the admitted ones stay open until all are answered,
    so the running slots are never freed during the burst. Returns the tally of answers."""
    return asyncio.run(_hold_burst(urls, key, {**body, "stream": True}, count))


BODY = {"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 2}  # 4 prompt tokens
COST = 4 + 2
# 16 samples of 1900 tokens: it runs far longer than a burst of 200 requests takes to answer.
LONG_BODY = {**BODY, "max_tokens": 1900, "n": 16, "temperature": 1}


def assert_budget_is_exact(servers: list[Any], account: str, admitted: int = 37) -> None:
    """200 requests at once against a budget that fits exactly `admitted` of them."""
    key = servers[0].create_key(
        account,
        *("--monthly-tokens", str(admitted * COST), "--max-running", "250"),
        *("--max-waiting", "250", "--starts-per-minute", "1000"),
    )
    responses = burst([s.base_url for s in servers], key, BODY, 200)
    counted = tally(responses)
    assert counted == {"200": admitted, "budget_exceeded": 200 - admitted}, counted
    assert spent(responses) == admitted * COST


def assert_running_slots_are_exact(servers: list[Any], account: str, slots: int = 5) -> None:
    """200 requests at once against `slots` running slots and no waiting room."""
    key = servers[-1].create_key(
        account,
        *("--max-running", str(slots), "--max-waiting", "0", "--starts-per-minute", "1000"),
    )
    outcomes = hold_burst([s.base_url for s in servers], key, LONG_BODY, 200)
    assert outcomes == {"200": slots, "queue_full": 200 - slots}, outcomes
