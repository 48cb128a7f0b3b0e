"""IdempotencyMiddleware on a stand-in app, over real IdempotencyRecords on SQLite.

What a client sees for each state of a key: the first answer replayed, a conflict, `running`
while the first is still in flight, `no_answer` after the first failed, nothing stored for a
refusal.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from vllm_acs.auth.principal import PRINCIPAL_STATE_KEY, Principal
from vllm_acs.middleware import idempotency
from vllm_acs.middleware.idempotency import IdempotencyMiddleware, fingerprint
from vllm_acs.settings import Settings
from vllm_acs.storage import open_storage

PATH = "/v1/completion-jobs"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class StandIn:
    """The route: counts its calls, answers `status`, may wait on `gate` or raise."""

    def __init__(self) -> None:
        self.calls = 0
        self.status = 202
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("the route crashed")
        payload = json.dumps({"n": self.calls}).encode()
        headers = [(b"content-type", b"application/json"), (b"location", b"/v1/x")]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _with_principal(app):
    async def authenticated(scope, receive, send):
        scope.setdefault("state", {})[PRINCIPAL_STATE_KEY] = Principal("key_1", "acs-bm-x", "a")
        await app(scope, receive, send)

    return authenticated


@pytest.fixture
def stack(tmp_path: Path):
    """(async client factory, stand-in route, clock list) over a fresh SQLite database."""

    async def build():
        url = f"sqlite+aiosqlite:///{tmp_path / 'acs.sqlite3'}"
        storage = await open_storage(Settings(database_url=url, home=tmp_path))
        route, clock = StandIn(), [NOW]
        app = IdempotencyMiddleware(
            route, storage.idempotency, {PATH: True}, clock=lambda: clock[0]
        )
        transport = httpx.ASGITransport(app=_with_principal(app), raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://t")
        return client, route, clock, storage

    return build


def _post(client, body, key="k1"):
    return client.post(PATH, json=body, headers={"Idempotency-Key": key})


def test_replay_conflict_and_required_key(stack):
    async def run():
        client, route, _clock, storage = await stack()
        first = await _post(client, {"a": 1, "b": 2})
        again = await _post(client, {"b": 2, "a": 1})
        assert (first.status_code, again.status_code, route.calls) == (202, 202, 1)
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["location"] == "/v1/x"
        conflict = await _post(client, {"a": 2})
        assert (conflict.status_code, conflict.json()["error"]["code"]) == (
            409,
            "idempotency_conflict",
        )
        missing = await client.post(PATH, json={"a": 1})
        assert (missing.status_code, missing.json()["error"]["param"]) == (400, "Idempotency-Key")
        await storage.close()

    asyncio.run(run())


def test_running_while_the_first_is_in_flight(stack):
    async def run():
        client, route, _clock, storage = await stack()
        route.gate = asyncio.Event()
        first = asyncio.create_task(_post(client, {"a": 1}))
        while route.calls == 0:
            await asyncio.sleep(0.01)
        second = await _post(client, {"a": 1})
        assert (second.status_code, second.json()["error"]["code"]) == (409, "running")
        assert second.headers["retry-after"] == "1"
        route.gate.set()
        assert (await first).status_code == 202
        assert (await _post(client, {"a": 1})).headers["idempotent-replayed"] == "true"
        await storage.close()

    asyncio.run(run())


def test_no_answer_after_a_crash_or_a_cut_request(stack):
    async def run():
        client, route, clock, storage = await stack()
        route.fail = True
        assert (await _post(client, {"a": 1})).status_code == 500
        route.fail = False
        after = await _post(client, {"a": 1})
        assert (after.status_code, after.json()["error"]["code"]) == (409, "no_answer")
        assert after.headers["x-should-retry"] == "false"
        # A request cut while its route runs leaves no answer either (a dead process's record
        # reads the same once its lease ends: tests/storage/test_idempotency.py).
        route.gate = asyncio.Event()
        stuck = asyncio.create_task(_post(client, {"b": 1}, key="k2"))
        while route.calls < 2:
            await asyncio.sleep(0.01)
        stuck.cancel()
        clock[0] = NOW + timedelta(minutes=5)
        late = await _post(client, {"b": 1}, key="k2")
        assert late.json()["error"]["code"] == "no_answer"
        await storage.close()

    asyncio.run(run())


def test_a_refusal_stores_nothing(stack):
    async def run():
        client, route, _clock, storage = await stack()
        route.status = 429
        assert (await _post(client, {"a": 1})).status_code == 429
        route.status = 202
        assert (await _post(client, {"a": 1})).status_code == 202
        assert route.calls == 2
        await storage.close()

    asyncio.run(run())


def test_a_small_body_is_known_by_its_json_and_a_large_one_by_its_bytes(monkeypatch):
    route = "/v1/harvest"
    assert fingerprint(route, b'{"a": 1, "b": 2}') == fingerprint(route, b'{"b":2,"a":1}')
    large = b'{"prompts": ["' + b"x" * idempotency.CANONICAL_LIMIT_BYTES + b'"]'  # never closes

    def no_parse(*args: object) -> None:
        raise AssertionError("a large body was parsed on the event loop")

    monkeypatch.setattr(idempotency.json, "loads", no_parse)
    assert fingerprint(route, large) == fingerprint(route, large)
    assert fingerprint(route, large) != fingerprint(route, large + b"}")
