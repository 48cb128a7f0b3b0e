"""RequestWindowMiddleware: a non-streamed completion answers inside the request window, and one
that takes long keeps its connection busy with whitespace so that no proxy cuts it as idle.

API server process, inside StrictValidation (it reads the ValidatedCompletion) and outside
UsageChunk and Admission: the stop at the window reaches them as a client disconnect, so vLLM
aborts the engine request and the hold settles. Streams and the node's own replays (jobs, Looms)
pass untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..auth.principal import REPLAY_SCOPE_KEY
from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from ..errors import AcsError, InternalError, UpstreamDeadline, error_body
from .asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    header,
    note_error_code,
    request_id,
    send_error,
)
from .completion_rewrite import completion_headers
from .upstream_errors import engine_error, foreign_message, is_acs_envelope

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
# Leading whitespace is valid JSON: clients buffer it before they parse (the spec's wire note).
KEEPALIVE = b" "
# `scope["state"]` key set once a request's window ended; Admission records its row as a 504.
WINDOW_ENDED_STATE_KEY = "acs_window_ended"
# How long a stopped request may take to abort and settle before its 504 goes out regardless.
STOP_GRACE_S = 10.0
_DISCONNECT: Message = {"type": "http.disconnect"}


class RequestWindowMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        window_s: float,
        keepalive_after_s: float,
        keepalive_every_s: float,
        sleep: Sleep = asyncio.sleep,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.app = app
        self.window_s = window_s or math.inf
        # A keepalive that would only start at or after the window never starts.
        self.keepalive_after_s = keepalive_after_s or math.inf
        if self.keepalive_after_s >= self.window_s:
            self.keepalive_after_s = math.inf
        if self.keepalive_after_s < math.inf and keepalive_every_s <= 0:
            raise ValueError("keepalive_every_s must be above 0 while the keepalive is on")
        self.keepalive_every_s = keepalive_every_s
        self.sleep = sleep
        self.stop_grace_s = stop_grace_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        validated = scope.get("state", {}).get(VALIDATED_COMPLETION_KEY)
        if (
            scope["type"] != "http"
            or not isinstance(validated, ValidatedCompletion)
            or validated.stream
            or REPLAY_SCOPE_KEY in scope  # a job's own lease and cancel bound it, not a proxy
            or (self.window_s == math.inf and self.keepalive_after_s == math.inf)
        ):
            await self.app(scope, receive, send)
            return
        await _Window(self, scope, validated, send).run(receive)


class _Window:
    """One request's window: what went out, and who may send (the inner app or the clock)."""

    def __init__(
        self, m: RequestWindowMiddleware, scope: Scope, validated: ValidatedCompletion, send: Send
    ) -> None:
        self.m = m
        self.scope = scope
        self.validated = validated
        self.send_downstream = send
        self.lock = asyncio.Lock()  # one sender at a time: the inner app or a keepalive
        self.answered = asyncio.Event()  # the inner answer started
        self.stopped = asyncio.Event()  # the window ended: the inner app sees a disconnect
        self.passthrough = False  # the answer started before any keepalive: sent untouched
        self.committed = False  # our 200 went out; all that follows is body
        self.finished = False  # the last body byte went out
        self.error_status: int | None = None  # an error answer that came after the commit
        self.error_chunks: list[bytes] = []
        self.pending_receive: asyncio.Future[Message] | None = None
        # Compressed here, flushed per chunk: GZipMiddleware passes an encoded answer untouched,
        # and some Starlette versions would hold back small chunks of a gzip stream.
        accepts = header(scope, b"accept-encoding") or ""
        self.gzip = (
            zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if "gzip" in accepts else None
        )

    async def run(self, receive: Receive) -> None:
        inner = asyncio.ensure_future(self.m.app(self.scope, self._receive(receive), self._send))
        try:
            if await self._watch(inner):
                await self._stop(inner)
                await self._answer(self._deadline_error())
                return
            try:
                await inner
            except Exception:
                if not self.committed:
                    raise  # ErrorEnvelope answers it as for any request
                logger.exception("unhandled error in request %s", request_id(self.scope))
                await self._answer(InternalError())
                return
            if self.committed and not self.finished:
                async with self.lock:
                    if self.error_status is not None:  # an error body cut short
                        await self._body(self._error_payload(), more=False)
                    elif not self.answered.is_set():
                        # The inner app ended without an answer: the client may be gone.
                        await self._send_error_body(InternalError())
                    else:
                        await self._body(b"", more=False)
        finally:
            if not inner.done():
                inner.cancel()
                await asyncio.wait({inner})
            if self.pending_receive is not None:
                self.pending_receive.cancel()

    async def _watch(self, inner: asyncio.Future[Any]) -> bool:
        """Sends the keepalive until the answer starts; True when the window ends first."""
        m, elapsed = self.m, 0.0
        next_keepalive = m.keepalive_after_s
        while True:
            at = min(next_keepalive, m.window_s)
            if at == math.inf:
                return False
            if await self._wait(inner, at - elapsed):
                return False
            elapsed = at
            async with self.lock:
                if self.answered.is_set():
                    return False
                if at >= m.window_s:
                    # Under the lock: from here on nothing of the inner app's reaches the client.
                    self.scope.setdefault("state", {})[WINDOW_ENDED_STATE_KEY] = True
                    self.stopped.set()
                    return True
                await self._keepalive()
            next_keepalive = at + m.keepalive_every_s

    async def _wait(self, inner: asyncio.Future[Any], delay: float) -> bool:
        """Waits `delay` seconds; True as soon as the inner app ended or its answer started."""
        sleeper = asyncio.ensure_future(self.m.sleep(max(delay, 0.0)))
        started = asyncio.ensure_future(self.answered.wait())
        try:
            await asyncio.wait({inner, sleeper, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            started.cancel()
        return inner.done() or self.answered.is_set()

    async def _stop(self, inner: asyncio.Future[Any]) -> None:
        """Lets the stopped request abort and settle (within a grace), then forgets its answer."""
        sleeper = asyncio.ensure_future(self.m.sleep(self.m.stop_grace_s))
        try:
            await asyncio.wait({inner, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
        if not inner.done():
            logger.warning(
                "request %s did not stop at its window; cancelled", request_id(self.scope)
            )
            inner.cancel()
            await asyncio.wait({inner})
        if not inner.cancelled() and inner.exception() is not None:
            logger.info(
                "request %s ended with %r after its window",
                request_id(self.scope),
                inner.exception(),
            )

    def _deadline_error(self) -> AcsError:
        return UpstreamDeadline(
            f"The request did not finish inside the {self.m.window_s:g} s request window and "
            "was stopped; lower max_tokens, or send stream: true.",
        )

    def _receive(self, receive: Receive) -> Receive:
        """The client's receive(), except that it reports a disconnect once the window ended."""

        async def receive_until_stopped() -> Message:
            if self.stopped.is_set():
                return _DISCONNECT
            if self.pending_receive is None:
                # Kept across calls: a caller cancelled mid-wait must not lose a message.
                self.pending_receive = asyncio.ensure_future(receive())
            stop = asyncio.ensure_future(self.stopped.wait())
            try:
                await asyncio.wait(
                    {self.pending_receive, stop}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stop.cancel()
            if self.pending_receive.done():
                message, self.pending_receive = self.pending_receive.result(), None
                return message
            return _DISCONNECT

        return receive_until_stopped

    async def _send(self, message: Message) -> None:
        """The inner app's send()."""
        async with self.lock:
            if self.stopped.is_set():
                return  # past the window: what the stopped request still says is dropped
            kind = message["type"]
            if kind == "http.response.start":
                self.answered.set()
                if not self.committed:
                    self.passthrough = True
                    await self.send_downstream(message)
                elif message["status"] >= 400:
                    self.error_status = int(message["status"])
                return  # after the commit its headers have no place: the 200 went out
            if self.passthrough:
                await self.send_downstream(message)
                return
            if kind != "http.response.body" or self.finished:
                return
            body, more = message.get("body", b""), message.get("more_body", False)
            if self.error_status is None:
                await self._body(body, more=more)
                return
            self.error_chunks.append(body)
            if not more:
                await self._body(self._error_payload(), more=False)

    def _error_payload(self) -> bytes:
        """An error answer that came after the commit, as the spec's envelope (ErrorEnvelope
        outside sees a 200 and cannot rewrite it)."""
        raw = b"".join(self.error_chunks)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if is_acs_envelope(body):
            note_error_code(self.scope, str(body["error"]["code"]))
            return raw
        assert self.error_status is not None
        error = engine_error(self.error_status, foreign_message(body))
        note_error_code(self.scope, error.code)
        return json.dumps(error_body(error, request_id(self.scope)), separators=(",", ":")).encode()

    async def _answer(self, error: AcsError) -> None:
        """`error` as the answer: its own status before the commit, else the body of the 200."""
        async with self.lock:
            if self.finished:
                return
            if self.committed:
                await self._send_error_body(error)
                return
            for name, value in completion_headers(self.validated):
                error.headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            self.finished = True
            await send_error(self.scope, self.send_downstream, error)

    async def _send_error_body(self, error: AcsError) -> None:
        note_error_code(self.scope, error.code)
        payload = json.dumps(error_body(error, request_id(self.scope)), separators=(",", ":"))
        await self._body(payload.encode(), more=False)

    async def _keepalive(self) -> None:
        if not self.committed:
            self.committed = True
            headers = [(b"content-type", b"application/json"), *completion_headers(self.validated)]
            if self.gzip is not None:
                headers += [(b"content-encoding", b"gzip"), (b"vary", b"Accept-Encoding")]
            await self.send_downstream(
                {"type": "http.response.start", "status": 200, "headers": headers}
            )
        await self._body(KEEPALIVE, more=True)

    async def _body(self, body: bytes, *, more: bool) -> None:
        if self.gzip is not None:
            flush = zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH
            body = self.gzip.compress(body) + self.gzip.flush(flush)
        self.finished = not more
        await self.send_downstream({"type": "http.response.body", "body": body, "more_body": more})
