"""ErrorEnvelopeMiddleware: every /v1 failure leaves in the spec's envelope, whoever raised it.

API server process, just inside RequestId. It rewrites vLLM's and the framework's error bodies,
turns an unhandled exception into `500 internal_error` (nothing internal leaks), and inside an
open stream sends one SSE error frame and then ends the stream.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..errors import (
    AcsError,
    CountersUnavailable,
    DatabaseUnavailable,
    HarvestUnavailable,
    InternalError,
    error_body,
)
from ..metrics import OUTAGES
from ..storage.outages import outage_of
from .asgi import ASGIApp, Message, Receive, Scope, Send, note_error_code, request_id, send_error
from .sse import SseEventBuffer
from .upstream_errors import engine_error, foreign_message, framework_error, is_acs_envelope

logger = logging.getLogger(__name__)
_NAMES = {
    "database": "database",
    "counters": "shared counters (Redis)",
    "files": "object store of the job files",
}


def _unavailable(outage: str) -> AcsError:
    if outage == "database":
        return DatabaseUnavailable(
            "The database is not reachable right now; try again in a moment."
        )
    if outage == "files":
        return HarvestUnavailable(
            "The store of the harvest files is not reachable right now; try again in a moment."
        )
    return CountersUnavailable(
        "The shared counters (Redis) are not reachable right now, so nothing is admitted; try "
        "again in a moment."
    )


ENGINE_PATHS = frozenset({"/v1/completions"})
# Headers of the original error answer that the rewritten one keeps.
_KEPT_HEADERS = {
    b"allow",
    b"retry-after",
    b"retry-after-ms",
    b"x-acs-upstream-model",
    b"x-acs-upstream-gpu",
    b"x-acs-max-tokens-clamped",
}


def _content_type(message: Message) -> bytes:
    for key, value in message.get("headers", ()):
        if key.lower() == b"content-type":
            return value.split(b";")[0].strip().lower()
    return b""


def sse_error_frame(scope: Scope, error: AcsError) -> bytes:
    """The SSE frame that ends a stream with `error` (the stream's status stays 200)."""
    note_error_code(scope, error.code)
    return b"data: " + json.dumps(error_body(error, request_id(scope))).encode() + b"\n\n"


class _Responder:
    """Per-request state: what has been sent, and any error body being held back."""

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope = scope
        self.send_downstream = send
        self.started = False
        self.finished = False
        self.streaming = False
        self.stream_failed = False
        self.held_start: Message | None = None
        self.held_body: list[bytes] = []
        self.events = SseEventBuffer()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if message["status"] >= 400:
                self.held_start = message  # rewritten once the whole body is here
                return
            self.streaming = _content_type(message) == b"text/event-stream"
            self.started = True
            await self.send_downstream(message)
            return
        if kind != "http.response.body":
            await self.send_downstream(message)
            return
        more = message.get("more_body", False)
        if self.held_start is not None:
            self.held_body.append(message.get("body", b""))
            if not more:
                await self._send_rewritten_error()
            return
        if self.streaming:
            await self._send_stream_chunk(message.get("body", b""), more)
            return
        self.finished = not more
        await self.send_downstream(message)

    async def _send_rewritten_error(self) -> None:
        start, raw = self.held_start, b"".join(self.held_body)
        self.held_start, self.held_body = None, []
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if is_acs_envelope(body):
            note_error_code(self.scope, str(body["error"]["code"]))
            self.started = self.finished = True
            await self.send_downstream(start)
            await self.send_downstream({"type": "http.response.body", "body": raw})
            return
        error = self._map(start["status"], foreign_message(body))
        for key, value in start.get("headers", ()):
            if key.lower() in _KEPT_HEADERS:
                error.headers.setdefault(key.lower().decode("latin-1"), value.decode("latin-1"))
        self.started = self.finished = True
        await send_error(self.scope, self.send_downstream, error)

    def _map(self, status: int, message: str) -> AcsError:
        if self.scope["path"] in ENGINE_PATHS and status not in (404, 405):
            return engine_error(status, message)
        return framework_error(status, message, self.scope["method"], self.scope["path"])

    async def _send_stream_chunk(self, chunk: bytes, more: bool) -> None:
        if self.stream_failed:
            if not more:  # the engine's own `[DONE]` and the like are dropped after an error
                await self._end_body()
            return
        out: list[bytes] = []
        for event in self.events.feed(chunk, more):
            error = self._stream_error(event)
            if error is not None:
                out.append(sse_error_frame(self.scope, error))
                self.stream_failed = True
                break
            out.append(event + b"\n\n")
        self.finished = not more
        await self.send_downstream(
            {"type": "http.response.body", "body": b"".join(out), "more_body": more}
        )

    def _stream_error(self, event: bytes) -> AcsError | None:
        """The error an SSE event carries (vLLM sends `data: {"error": ...}`), if any."""
        if b'"error"' not in event:
            return None
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            try:
                payload = json.loads(line[5:])
            except ValueError:
                return None
            if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
                if is_acs_envelope(payload):
                    return None
                status = payload["error"].get("code")
                status = status if isinstance(status, int) else 500
                return engine_error(status, foreign_message(payload))
        return None

    async def _end_body(self) -> None:
        if not self.finished:
            self.finished = True
            await self.send_downstream({"type": "http.response.body", "body": b""})

    async def fail(self, error: AcsError) -> None:
        """An exception escaped the app: answer it, or end the stream that is already open."""
        if not self.started:
            await send_error(self.scope, self.send_downstream, error)
            return
        if self.streaming and not self.stream_failed and not self.finished:
            self.stream_failed = True
            self.finished = True
            frame = sse_error_frame(self.scope, error)
            await self.send_downstream({"type": "http.response.body", "body": frame})
            return
        await self._end_body()


class ErrorEnvelopeMiddleware:
    def __init__(self, app: ASGIApp, prefix: str = "/v1/") -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        responder = _Responder(scope, send)
        try:
            await self.app(scope, receive, responder.send)
        except AcsError as error:  # raised after the answer began (e.g. a stream's lost lease)
            await responder.fail(error)
        except Exception as error:
            outage = outage_of(error)
            if outage is None:
                logger.exception("unhandled error in request %s", request_id(scope))
                await responder.fail(InternalError())
                return
            logger.warning(
                "request %s: the %s did not answer: %r", request_id(scope), _NAMES[outage], error
            )
            OUTAGES.labels(service=outage).inc()
            await responder.fail(_unavailable(outage))
