"""RequestWindowMiddleware on a virtual clock: pass-through, keepalive then the body (or an error
body), the window before and after the commit (the inner app sees a disconnect), gzip, and the
hold settled at the window by the real AdmissionMiddleware."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.middleware.gzip import GZipMiddleware

from vllm_acs.auth.principal import REPLAY_SCOPE_KEY
from vllm_acs.contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from vllm_acs.errors import REQUEST_ID_STATE_KEY, UpstreamDeadline
from vllm_acs.middleware.error_envelope import ErrorEnvelopeMiddleware
from vllm_acs.middleware.request_window import WINDOW_ENDED_STATE_KEY, RequestWindowMiddleware
from vllm_acs.served_model import ServedModel
from vllm_acs.settings import Settings, SettingsError

MODEL = ServedModel("m", "org/m", 2048, 100, "cpu-test", 256)
COMPLETION = {
    "object": "text_completion",
    "choices": [{"index": 0, "text": "x" * 600, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
}
VLLM_500 = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}


class VirtualClock:
    """`sleep` that only returns when the test's driver moves time past it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), future))
        await future

    def wake_next(self) -> bool:
        """Moves time to the earliest live sleeper and wakes it; False when none is left."""
        while self._sleepers:
            at, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                self.now = max(self.now, at)
                future.set_result(None)
                return True
        return False


async def _idle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


class Client:
    """The ASGI client side: what was sent (with the virtual time), and a disconnect to give."""

    def __init__(self, clock: VirtualClock, disconnect_at: float | None = None) -> None:
        self.clock = clock
        self.disconnect_at = disconnect_at
        self.sent: list[tuple[float, dict[str, Any]]] = []

    async def receive(self) -> dict[str, Any]:
        if self.disconnect_at is None:
            await asyncio.get_running_loop().create_future()  # never
        await self.clock.sleep(self.disconnect_at - self.clock.now)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append((self.clock.now, message))

    @property
    def start(self) -> dict[str, Any]:
        (start,) = [m for _, m in self.sent if m["type"] == "http.response.start"]
        return start

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.start["headers"]}

    @property
    def bodies(self) -> list[tuple[float, bytes]]:
        return [(t, m.get("body", b"")) for t, m in self.sent if m["type"] == "http.response.body"]

    @property
    def body(self) -> bytes:
        assert not self.sent[-1][1].get("more_body", False), "the answer never ended"
        return b"".join(b for _, b in self.bodies)


class Engine:
    """Stands in for Admission + vLLM: works `seconds`, then answers; stops on a disconnect,
    as vLLM's `with_cancellation` does, and then answers what FastAPI makes of its None."""

    def __init__(
        self,
        clock: VirtualClock,
        seconds: float,
        status: int = 200,
        body: Any = COMPLETION,
        *,
        deaf: bool = False,
        raises: bool = False,
    ) -> None:
        self.clock, self.seconds, self.status, self.body = clock, seconds, status, body
        self.deaf, self.raises = deaf, raises
        self.disconnected_at: float | None = None
        self.scope: dict[str, Any] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scope = scope
        work = asyncio.ensure_future(self.clock.sleep(self.seconds))
        listen = asyncio.ensure_future(self._listen(receive))
        await asyncio.wait({work, listen}, return_when=asyncio.FIRST_COMPLETED)
        if listen.done():
            work.cancel()
            await self._answer(send, 200, None)
            return
        listen.cancel()
        if self.raises:
            raise RuntimeError("secret internal detail")
        await self._answer(send, self.status, self.body)

    async def _listen(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected_at = self.clock.now
        if self.deaf:
            await asyncio.get_running_loop().create_future()

    async def _answer(self, send: Any, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"x-acs-upstream-model", b"org/m"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _validated(stream: bool = False) -> ValidatedCompletion:
    return ValidatedCompletion(MODEL, {"prompt": "x"}, 1, 3, 1, 7, "client", stream=stream)


def _scope(validated: ValidatedCompletion | None, headers: list[tuple[bytes, bytes]]) -> dict:
    state: dict[str, Any] = {REQUEST_ID_STATE_KEY: "req-1"}
    if validated is not None:
        state[VALIDATED_COMPLETION_KEY] = validated
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": headers,
        "state": state,
    }


def _call(
    inner: Callable[[Any, Any, Any], Awaitable[None]],
    clock: VirtualClock,
    client: Client,
    *,
    after: float = 1.0,
    every: float = 0.5,
    window: float = 3.0,
    validated: ValidatedCompletion | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    replay: bool = False,
    wrap: Callable[[Any], Any] = lambda app: app,
) -> dict[str, Any]:
    """Runs one request to its end on the virtual clock; returns its scope."""
    app = wrap(
        RequestWindowMiddleware(
            inner,
            window_s=window,
            keepalive_after_s=after,
            keepalive_every_s=every,
            sleep=clock.sleep,
            stop_grace_s=2.0,
        )
    )
    scope = _scope(validated or _validated(), headers or [])
    if replay:
        scope[REPLAY_SCOPE_KEY] = object()

    async def main() -> None:
        call = asyncio.ensure_future(app(scope, client.receive, client.send))
        while True:
            await _idle()
            if call.done():
                break
            assert clock.wake_next(), "the request waits on nothing"
            assert clock.now < 100, "the request did not end"
        await call

    asyncio.run(main())
    return scope


def test_an_answer_before_the_keepalive_passes_untouched():
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 0.7)
    _call(engine, clock, client)
    assert [t for t, _ in client.sent] == [0.7, 0.7]
    assert client.start["status"] == 200
    assert client.headers["content-length"] == str(len(json.dumps(COMPLETION)))
    assert json.loads(client.body) == COMPLETION
    assert engine.disconnected_at is None


def test_a_long_answer_gets_keepalive_bytes_then_its_body():
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 2.2)
    _call(engine, clock, client)
    assert client.start["status"] == 200
    headers = client.headers
    assert headers["content-type"] == "application/json"
    assert "content-length" not in headers and "content-encoding" not in headers
    assert (headers["x-acs-upstream-model"], headers["x-acs-upstream-gpu"]) == ("org/m", "cpu-test")
    assert client.bodies[:3] == [(1.0, b" "), (1.5, b" "), (2.0, b" ")]
    assert client.bodies[3][0] == 2.2
    assert client.body.startswith(b"   {") and json.loads(client.body) == COMPLETION
    assert engine.disconnected_at is None


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (500, VLLM_500, "upstream_server_error"),  # vLLM's own error, put in the envelope
        (429, {"error": {"code": "queue_full", "message": "m"}, "request_id": "req-1"}, None),
    ],
)
def test_an_error_after_the_keepalive_is_the_json_body_of_the_200(status, body, code):
    clock = VirtualClock()
    client = Client(clock)
    scope = _call(Engine(clock, 1.2, status, body), clock, client)
    assert client.start["status"] == 200
    answer = json.loads(client.body)
    if code is None:
        assert answer == body  # the plugin's own envelope, as it was
    else:
        assert set(answer) == {"error", "request_id"} and answer["request_id"] == "req-1"
        assert answer["error"]["code"] == code and answer["error"]["upstream_status"] == 500
        assert scope["state"]["acs_error_code"] == code


def test_an_exception_after_the_keepalive_is_an_internal_error_body():
    clock = VirtualClock()
    client = Client(clock)
    _call(Engine(clock, 1.2, raises=True), clock, client)
    answer = json.loads(client.body)
    assert (client.start["status"], answer["error"]["code"]) == (200, "internal_error")
    assert "secret" not in client.body.decode()


def test_an_exception_before_the_keepalive_is_left_to_the_error_envelope():
    clock = VirtualClock()
    client = Client(clock)
    _call(Engine(clock, 0.2, raises=True), clock, client, wrap=ErrorEnvelopeMiddleware)
    assert client.start["status"] == 500
    assert json.loads(client.body)["error"]["code"] == "internal_error"


def test_the_window_before_any_keepalive_is_a_504_and_the_request_is_stopped():
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 60)
    scope = _call(engine, clock, client, after=5, window=3)  # keepalive would start too late
    assert engine.disconnected_at == 3.0  # as a client disconnect: vLLM aborts, the hold settles
    assert scope["state"][WINDOW_ENDED_STATE_KEY] is True
    assert client.start["status"] == 504
    headers = client.headers
    assert headers["x-should-retry"] == "false"
    assert "retry-after" not in headers and "retry-after-ms" not in headers
    assert headers["x-acs-upstream-error-kind"] == "upstream_deadline"
    assert headers["x-acs-upstream-model"] == "org/m"
    answer = json.loads(client.body)  # vLLM's answer on being stopped ("null") never shows
    assert answer["error"]["code"] == "upstream_deadline"
    assert answer["error"]["type"] == UpstreamDeadline.type == "upstream_error"
    assert "max_tokens" in answer["error"]["message"] and "stream" in answer["error"]["message"]
    assert answer["request_id"] == "req-1"
    assert [t for t, _ in client.sent] == [3.0, 3.0]


def test_the_window_after_the_keepalive_ends_the_200_with_the_504_envelope():
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 60)
    scope = _call(engine, clock, client)
    assert engine.disconnected_at == 3.0
    assert client.start["status"] == 200
    keepalives = [t for t, b in client.bodies if b == b" "]
    assert keepalives == [1.0, 1.5, 2.0, 2.5]  # and none at 3.0: the window wins the tie
    answer = json.loads(client.body)
    assert answer["error"]["code"] == "upstream_deadline" and answer["request_id"] == "req-1"
    assert scope["state"]["acs_error_code"] == "upstream_deadline"
    assert client.bodies[-1][0] == 3.0


def test_a_request_that_ignores_the_stop_is_cancelled_after_the_grace():
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 60, deaf=True)
    _call(engine, clock, client, after=5, window=3)
    assert engine.disconnected_at == 3.0
    assert client.sent[0] == (5.0, client.start) and client.start["status"] == 504


def test_the_client_leaving_during_the_keepalive_reaches_the_request():
    clock = VirtualClock()
    client, engine = Client(clock, disconnect_at=1.7), Engine(clock, 60)
    scope = _call(engine, clock, client)
    assert engine.disconnected_at == 1.7
    assert WINDOW_ENDED_STATE_KEY not in scope["state"]


@pytest.mark.parametrize("case", ["stream", "replay", "off"])
def test_streams_replays_and_a_node_without_window_pass_untouched(case):
    clock = VirtualClock()
    client, engine = Client(clock), Engine(clock, 5)
    _call(
        engine,
        clock,
        client,
        validated=_validated(stream=True) if case == "stream" else None,
        replay=case == "replay",
        **({"after": 0, "window": 0} if case == "off" else {}),
    )
    assert [t for t, _ in client.sent] == [5.0, 5.0]
    assert client.start["status"] == 200 and json.loads(client.body) == COMPLETION


def test_gzip_keepalive_bytes_are_flushed_one_by_one_through_gzip_middleware():
    clock = VirtualClock()
    client = Client(clock)
    _call(
        Engine(clock, 2.2),
        clock,
        client,
        headers=[(b"accept-encoding", b"gzip, deflate")],
        wrap=lambda app: GZipMiddleware(app, minimum_size=500),
    )
    headers = client.headers
    assert headers["content-encoding"] == "gzip" and headers["vary"] == "Accept-Encoding"
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    seen = [(t, decoder.decompress(chunk)) for t, chunk in client.bodies]
    # Each keepalive byte is readable by the client when it is sent, not at the end.
    assert seen[:3] == [(1.0, b" "), (1.5, b" "), (2.0, b" ")]
    assert decoder.eof and json.loads(b"".join(b for _, b in seen)) == COMPLETION


def test_without_gzip_the_keepalive_is_plain_through_gzip_middleware():
    clock = VirtualClock()
    client = Client(clock)
    _call(
        Engine(clock, 1.2),
        clock,
        client,
        headers=[(b"accept-encoding", b"identity")],
        wrap=lambda app: GZipMiddleware(app, minimum_size=500),
    )
    assert "content-encoding" not in client.headers
    assert client.bodies[0] == (1.0, b" ") and json.loads(client.body) == COMPLETION


def test_the_settings_and_their_defaults():
    settings = Settings.load(environ={})
    assert (settings.request_window_s, settings.keepalive_after_s, settings.keepalive_every_s) == (
        840.0,
        20.0,
        10.0,
    )
    env = {"VLLM_ACS_REQUEST_WINDOW_S": "3", "VLLM_ACS_KEEPALIVE_EVERY_S": "0.5"}
    loaded = Settings.load(environ=env)
    assert (loaded.request_window_s, loaded.keepalive_every_s) == (3.0, 0.5)
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(SettingsError, match="REQUEST_WINDOW_S"):
            Settings.load(environ={"VLLM_ACS_REQUEST_WINDOW_S": bad})
    with pytest.raises(SettingsError, match="KEEPALIVE_EVERY_S"):
        Settings.load(environ={"VLLM_ACS_KEEPALIVE_EVERY_S": "0"})
    assert Settings.load(environ={"VLLM_ACS_KEEPALIVE_AFTER_S": "0"}).keepalive_after_s == 0


def test_the_window_settles_the_hold_in_the_real_admission(tmp_path: Path):
    """Real time, a fifth of a second: the row is a 504 that costs nothing, the slot is free."""
    from tests.unit.access_stack import FakeValidation
    from vllm_acs.auth.key_auth import KeyAuthPlugin
    from vllm_acs.middleware.admission import AdmissionMiddleware
    from vllm_acs.middleware.auth import AuthMiddleware
    from vllm_acs.plugins import build_plugin_manager
    from vllm_acs.storage import open_storage

    class RealTimeEngine(Engine):
        def __init__(self) -> None:
            super().__init__(clock, 30)

    clock = VirtualClock()
    clock.sleep = asyncio.sleep  # type: ignore[method-assign]

    async def main() -> None:
        storage = await open_storage(Settings(home=tmp_path))
        try:
            account = await storage.accounts.create("acct", approved=True)
            key, secret = await storage.keys.create(account.id, max_running=1)
            engine = RealTimeEngine()
            admission = AdmissionMiddleware(engine, storage.counters, storage.ledger)
            window = RequestWindowMiddleware(
                admission, window_s=0.2, keepalive_after_s=0.1, keepalive_every_s=0.05
            )
            manager = build_plugin_manager(
                KeyAuthPlugin(storage.keys, storage.settings), load_entry_points=False
            )
            app = AuthMiddleware(FakeValidation(window), manager)
            sent: list[dict[str, Any]] = []
            body = json.dumps({"prompt": "a b c", "max_tokens": 7}).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await asyncio.get_running_loop().create_future()
                return {}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = _scope(None, [(b"authorization", f"Bearer {secret}".encode())])
            await asyncio.wait_for(app(scope, receive, send), 5)
            assert sent[0]["status"] == 200
            answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
            assert answer["error"]["code"] == "upstream_deadline"
            assert engine.disconnected_at is not None
            assert await storage.counters.slots(key.id) == (0, 0)
            await storage.ledger.flush(5)
            (row,) = await storage.usage.rows()
            assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == (504, 0, 0)
        finally:
            await storage.close()

    asyncio.run(main())


def test_an_inner_app_that_ends_without_an_answer_after_the_commit_ends_the_body():
    clock = VirtualClock()
    client = Client(clock)

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await clock.sleep(1.3)  # e.g. Admission's queue, left by a client that went away

    _call(silent, clock, client)
    assert client.start["status"] == 200
    assert json.loads(client.body)["error"]["code"] == "internal_error"
