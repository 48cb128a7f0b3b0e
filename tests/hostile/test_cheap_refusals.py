"""Cheap refusals come first (issue 31, findings 6 and 7): a request that a limit refuses costs no
parse, tokenizing or database round trip that the refusal does not need.

- Unknown keys: the built-in key check on real SQLite, its clock the test's. A flood of one
  unknown key makes one lookup per TTL (concurrent or not), a key made afterwards works once the
  TTL passed, and the refusals are logged by sampling.
- A second harvest of one key, against the session's real node: refused (429) before its body is
  parsed. Its 30 MB body ends in broken JSON, so a node that parsed first would answer 400.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import MODEL_ID
from vllm_acs.auth.key_auth import KeyAuthPlugin
from vllm_acs.errors import Unauthorized
from vllm_acs.settings import Settings
from vllm_acs.storage import api_keys as api_keys_module
from vllm_acs.storage import open_storage
from vllm_acs.storage.api_key_secret import new_secret, visible_prefix
from vllm_acs.unknown_keys import UNKNOWN_PREFIX_TTL_S, RefusalLog, UnknownPrefixes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def _code(plugin: KeyAuthPlugin, secret: str) -> str:
    try:
        principal = await plugin.acs_authenticate(_bearer(secret))
    except Unauthorized as refused:
        return refused.code
    assert principal is not None
    return "ok"


class _Counted:
    """The storage's key lookups, counted by prefix; each a round trip of a few ms."""

    def __init__(self, lookup: Any) -> None:
        self.lookup = lookup
        self.prefixes: list[str] = []

    async def __call__(self, prefix: str) -> Any:
        self.prefixes.append(prefix)
        await asyncio.sleep(0.005)
        return await self.lookup(prefix)


def _counted_plugin(storage: Any) -> tuple[Clock, _Counted, KeyAuthPlugin]:
    """The built-in key check on `storage`, on the test's clock, its lookups counted."""
    clock = Clock()
    counted = _Counted(storage.keys.lookup)
    storage.keys.lookup = counted
    plugin = KeyAuthPlugin(storage.keys, storage.settings, unknown=UnknownPrefixes(clock=clock))
    return clock, counted, plugin


def test_a_flood_of_unknown_keys_makes_one_lookup_per_prefix_per_ttl(tmp_path: Path):
    async def run() -> None:
        storage = await open_storage(Settings(home=tmp_path))
        try:
            clock, counted, plugin = _counted_plugin(storage)
            account = await storage.accounts.create("flood", approved=True)
            _, real = await storage.keys.create(account.id)
            unknown = new_secret()

            # Concurrent, then one after another: one lookup for the unknown prefix.
            codes = await asyncio.gather(*(_code(plugin, unknown) for _ in range(200)))
            assert set(codes) == {"invalid_api_key"}
            for _ in range(300):
                assert await _code(plugin, unknown) == "invalid_api_key"
            assert counted.prefixes == [visible_prefix(unknown)]

            # A real key is looked up on every request (a revoke counts at once).
            assert [await _code(plugin, real) for _ in range(3)] == ["ok"] * 3
            assert counted.prefixes.count(visible_prefix(real)) == 3

            # Many unknown prefixes: at most one lookup each.
            many = [new_secret() for _ in range(50)]
            for _ in range(3):
                for secret in many:
                    assert await _code(plugin, secret) == "invalid_api_key"
            assert len(counted.prefixes) == 1 + 3 + 50

            # Past the TTL each prefix is looked up again, once.
            clock.now += UNKNOWN_PREFIX_TTL_S
            for _ in range(20):
                assert await _code(plugin, unknown) == "invalid_api_key"
            assert counted.prefixes.count(visible_prefix(unknown)) == 2
        finally:
            await storage.close()

    asyncio.run(run())


def test_a_key_made_after_its_prefix_was_refused_works_once_the_ttl_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    async def run() -> None:
        storage = await open_storage(Settings(home=tmp_path))
        try:
            clock, counted, plugin = _counted_plugin(storage)
            secret = new_secret()
            assert await _code(plugin, secret) == "invalid_api_key"
            # The key is made now (on this node or another: the same database), with that secret.
            monkeypatch.setattr(api_keys_module, "new_secret", lambda: secret)
            account = await storage.accounts.create("later", approved=True)
            await storage.keys.create(account.id)
            clock.now += UNKNOWN_PREFIX_TTL_S - 0.5
            assert await _code(plugin, secret) == "invalid_api_key"  # still remembered
            assert len(counted.prefixes) == 1
            clock.now += 0.5
            assert await _code(plugin, secret) == "ok"
            assert await _code(plugin, secret) == "ok"
            assert len(counted.prefixes) == 3
        finally:
            await storage.close()

    asyncio.run(run())


def test_the_unknown_prefixes_are_bounded_oldest_forgotten_first():
    clock = Clock()
    unknown = UnknownPrefixes(ttl_s=5, max_entries=3, clock=clock)
    for prefix in ("a", "b", "c", "d"):
        unknown.add(prefix)
        clock.now += 1
    assert len(unknown) == 3
    assert "a" not in unknown and {"b", "c", "d"} == {p for p in "abcd" if p in unknown}
    clock.now += 2  # b was added 5 s ago
    assert "b" not in unknown and "c" in unknown
    unknown.forget("c")
    assert "c" not in unknown and len(unknown) == 1


def test_refusals_are_logged_by_sampling(caplog: pytest.LogCaptureFixture):
    clock = Clock()
    logger = logging.getLogger("tests.hostile.refusals")
    log = RefusalLog(logger, every_s=60, clock=clock)
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(1000):
            log.refused("acs-bm-AAAAAAAA")
            clock.now += 0.01  # 10 s in all
        assert len(caplog.records) == 1
        clock.now = 1061.0
        log.refused("acs-bm-BBBBBBBB")
    first, second = (r.getMessage() for r in caplog.records)
    assert first == "refused an unknown API key (prefix acs-bm-AAAAAAAA)"
    assert (
        second
        == "refused 1000 unknown API keys in the last 61 s (the last: prefix acs-bm-BBBBBBBB)"
    )


# --- a second harvest, on the session's node --------------------------------------------------

BODY = {"model": MODEL_ID, "prompts": ["The sky is", "Grass is"], "layers": [1]}
# ~30 MB of prompts whose JSON never ends: a parse would refuse it (400), after seconds.
PROMPT = b'"The sky is blue and the grass is green today.",'
LARGE = (
    b'{"model": "'
    + MODEL_ID.encode()
    + b'", "layers": [1], "prompts": ['
    + PROMPT * (30_000_000 // len(PROMPT))
    + b'"not closed'
)


@pytest.mark.e2e
def test_a_second_harvest_is_refused_before_its_body_is_parsed(acs_server):
    # No running slot but one queue place: the harvest stays `running` (tests/e2e/test_harvest.py).
    key = acs_server.create_key("hostile-harvest", "--max-running", "0", "--max-waiting", "1")
    client = httpx.Client(
        base_url=acs_server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    with client:
        submitted = client.post("/v1/harvest", json=BODY)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        try:
            deadline = time.monotonic() + 60
            while client.get(f"/v1/harvest/{job_id}").json()["status"] != "running":
                assert time.monotonic() < deadline, acs_server.log_tail()
                time.sleep(0.2)

            headers = {"content-type": "application/json"}
            started = time.monotonic()
            refused = client.post("/v1/harvest", content=LARGE, headers=headers)
            took = time.monotonic() - started
            # A 400 would mean the body was parsed before the limit was looked at.
            assert refused.status_code == 429, refused.text[:500]
            assert refused.json()["error"]["code"] == "harvest_concurrency_exceeded"
            print(f"a {len(LARGE) / 1e6:.0f} MB second harvest refused in {took:.2f} s")
            # Seconds of parsing and tokenizing before; now the time to send the bytes.
            assert took < 5, took
        finally:
            client.delete(f"/v1/harvest/{job_id}")


# --- a completion job's submit ------------------------------------------------------------------


class _Jobs:
    def __init__(self, unfinished: int) -> None:
        self.unfinished = unfinished

    async def count_unfinished(self, key_id: str) -> int:
        return self.unfinished


def test_a_job_submit_past_the_keys_capacity_is_refused_before_its_body_is_read():
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vllm_acs.auth.principal import PRINCIPAL_STATE_KEY, KeyLimits, Principal
    from vllm_acs.routes.jobs.api_router import build_router
    from vllm_acs.routes.jobs.service import JobService
    from vllm_acs.served_model import NodeModels
    from vllm_acs.storage.idempotency import (
        IDEMPOTENCY_STATE_KEY,
        IdempotencyClaim,
        IdempotencyTarget,
    )

    service = JobService(
        NodeModels(), Settings(max_jobs_per_key=3), lambda: datetime.now(timezone.utc)
    )
    jobs = _Jobs(unfinished=3)
    service.storage = SimpleNamespace(jobs=jobs)  # type: ignore[assignment]
    principal = Principal("key_1", "acs-bm-x", "acct", frozenset({"jobs"}), KeyLimits(), "key")
    read: list[bytes] = []
    app = FastAPI()
    app.include_router(build_router(service))

    async def stack(scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                read.append(message.get("body", b""))
            return message

        state = scope.setdefault("state", {})
        state[PRINCIPAL_STATE_KEY] = principal
        state[IDEMPOTENCY_STATE_KEY] = IdempotencyClaim(IdempotencyTarget("key_1", "k"))
        await app(scope, counted, send)

    with TestClient(stack) as client:
        refused = client.post("/v1/completion-jobs", content=b'{"not": "json')
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "job_capacity"
        assert read == []  # not a byte of the body was asked for
        jobs.unfinished = 2
        # Below the capacity the body is read, and its JSON refused.
        answer = client.post("/v1/completion-jobs", content=b'{"not": "json')
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "bad_json")
        assert read != []
