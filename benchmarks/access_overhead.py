"""What auth + admission + settle add per /v1/completions request, on each counters backend.

In one run and interleaved (same machine noise): a stand-in for StrictValidation and vLLM's route
alone (baseline), then the same with AuthMiddleware (key check on SQLite) and AdmissionMiddleware
(slot, start, Hold on all five budgets, settle, usage row) on the embedded counters and on Redis.
Run: `python -m benchmarks.access_overhead` (Redis at VLLM_ACS_BENCH_REDIS_URL or 127.0.0.1:6379).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_acs.auth.key_auth import KeyAuthPlugin
from vllm_acs.contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from vllm_acs.middleware.admission import AdmissionMiddleware
from vllm_acs.middleware.auth import AuthMiddleware
from vllm_acs.plugins import build_plugin_manager
from vllm_acs.served_model import ServedModel
from vllm_acs.settings import Settings
from vllm_acs.storage import Storage, open_storage

ROUNDS = 1500
REDIS_URL = os.environ.get("VLLM_ACS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MODEL = ServedModel("tiny", "acs/tiny", 2048, 20, "cpu", 256)
ANSWER = json.dumps(
    {
        "choices": [{"index": 0, "text": " blue", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
    }
).encode()


async def engine_stand_in(scope: Any, receive: Any, send: Any) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def validation_stand_in(app: Any) -> Any:
    """Puts a ValidatedCompletion on the scope, as StrictValidation does (its cost is measured
    by benchmarks/validation_overhead.py, not here)."""

    async def validate(scope: Any, receive: Any, send: Any) -> None:
        scope.setdefault("state", {})[VALIDATED_COMPLETION_KEY] = ValidatedCompletion(
            model=MODEL,
            fields={},
            prompt_count=1,
            prompt_tokens=3,
            n=1,
            max_tokens=16,
            max_tokens_source="client",
            stream=False,
        )
        await app(scope, receive, send)

    return validate


async def _storage(home: Path, redis_prefix: str | None) -> tuple[Storage, str]:
    settings = Settings(
        home=home, redis_url=REDIS_URL if redis_prefix else None, redis_prefix=redis_prefix or "acs"
    )
    storage = await open_storage(settings)
    account = await storage.accounts.create("bench", approved=True, monthly_tokens=10**15)
    _, secret = await storage.keys.create(
        account.id,
        monthly_tokens=10**15,
        daily_tokens=10**15,
        monthly_input_tokens=10**15,
        monthly_output_tokens=10**15,
        starts_per_minute=10**9,
    )
    return storage, secret


def _stack(storage: Storage) -> Any:
    manager = build_plugin_manager(
        KeyAuthPlugin(storage.keys, storage.settings), load_entry_points=False
    )
    admission = AdmissionMiddleware(engine_stand_in, storage.counters, storage.ledger)
    return AuthMiddleware(validation_stand_in(admission), manager)


async def _call(app: Any, secret: str) -> tuple[float, float]:
    """(ms until the last body byte is sent, ms until the call returns, settle included)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "state": {},
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
    }
    last_byte = 0.0

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal last_byte
        if message["type"] == "http.response.body" and not message.get("more_body"):
            last_byte = time.perf_counter()

    started = time.perf_counter()
    await app(scope, receive, send)
    done = time.perf_counter()
    return (last_byte - started) * 1000, (done - started) * 1000


async def measure() -> dict[str, list[tuple[float, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        prefix = f"acs-bench-{secrets.token_hex(3)}"
        embedded, embedded_secret = await _storage(Path(tmp) / "embedded", None)
        redis, redis_secret = await _storage(Path(tmp) / "redis", prefix)
        variants = {
            "baseline (no auth, no admission)": (validation_stand_in(engine_stand_in), ""),
            "auth + admission, embedded": (_stack(embedded), embedded_secret),
            "auth + admission, redis": (_stack(redis), redis_secret),
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        try:
            for app, secret in variants.values():  # warm up
                for _ in range(50):
                    await _call(app, secret)
            for _ in range(ROUNDS):
                for name, (app, secret) in variants.items():
                    times[name].append(await _call(app, secret))
            await embedded.ledger.flush(60)
            await redis.ledger.flush(60)
        finally:
            await embedded.close()
            redis_client = redis.counters._redis  # type: ignore[attr-defined]
            keys = [k async for k in redis_client.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await redis_client.delete(*keys)
            await redis.close()
        return times


def _p(samples: list[float], q: int) -> float:
    return statistics.median(samples) if q == 50 else statistics.quantiles(samples, n=20)[-1]


def main() -> None:
    times = asyncio.run(measure())
    base = times["baseline (no auth, no admission)"]
    base_sent = statistics.median(t[0] for t in base)
    base_done = statistics.median(t[1] for t in base)
    print(f"{ROUNDS} sequential requests per variant, interleaved; milliseconds per request.")
    print("sent: the whole answer is sent (what the client waits for); done: settle finished too.")
    print(
        f"{'variant':<34} {'sent p50':>8} {'sent p95':>8} {'done p50':>8} {'done p95':>8}"
        f" {'added p50 (sent)':>16} {'added p50 (done)':>16}"
    )
    for name, samples in times.items():
        sent = [t[0] for t in samples]
        done = [t[1] for t in samples]
        print(
            f"{name:<34} {_p(sent, 50):8.3f} {_p(sent, 95):8.3f} {_p(done, 50):8.3f}"
            f" {_p(done, 95):8.3f} {_p(sent, 50) - base_sent:16.3f}"
            f" {_p(done, 50) - base_done:16.3f}"
        )
    print("target: added p50 under 1 ms")


if __name__ == "__main__":
    main()
