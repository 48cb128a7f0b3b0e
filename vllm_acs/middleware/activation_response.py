"""ActivationResponseMiddleware: puts the captured residual stream into a completion's answer and
proves a steer-only request was steered; a capture that comes back short is a 502, never a 200.

API server process, between Admission and Rewrite. vLLM's answer (non-stream) or its usage chunk
(stream) is held until the capture file the workers wrote has been read, off the event loop when
it is large; the file is released however the request ends, a client disconnect included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..activations.codec import encode_bits
from ..activations.payload import AcsPayload
from ..activations.store import (
    CaptureError,
    CaptureMissingError,
    capture_root,
    check_applied,
    read_capture,
    release,
    sweep,
)
from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from ..errors import AcsError, CaptureIncomplete, CaptureRowsMissing
from ..metrics import ACTIVATION_REQUESTS, CAPTURE_BYTES, CAPTURE_ROWS
from .asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from .error_envelope import sse_error_frame
from .sse import SseEventBuffer

logger = logging.getLogger(__name__)

# Captures above this many bytes are read and encoded in a worker thread.
_INLINE_BYTES = 256 * 1024
# Files a crashed or cancelled request left behind are swept this often, once this old.
SWEEP_EVERY_S = 600.0
SWEEP_OLDER_THAN_S = 6 * 3600.0
_DONE = b"data: [DONE]"
_SEP = b"\n\n"
_USAGE = b'"usage"'


class Capture:
    """One request's capture: reads the workers' rows (or checks they applied the payload)."""

    def __init__(self, payload: AcsPayload, hidden: int, root: Path) -> None:
        self.payload = payload
        self.hidden = hidden
        self.root = root

    def _collect(self, n_rows: int) -> dict[str, Any] | None:
        if not self.payload.captures:
            check_applied(self.payload.capture_id, n_rows=n_rows, root=self.root)
            return None
        bits = read_capture(
            self.payload.capture_id,
            n_layers=len(self.payload.capture_layers),
            hidden=self.hidden,
            n_rows=n_rows,
            root=self.root,
        )
        CAPTURE_ROWS.inc(n_rows)
        CAPTURE_BYTES.inc(bits.nbytes)
        return {"residual_stream": encode_bits(bits)}

    async def collect(self, usage: Any) -> dict[str, Any] | None:
        """`activations` for the answer (None for steer-only). Raises AcsError (502)."""
        if not isinstance(usage, dict) or not all(
            isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")
        ):
            raise CaptureIncomplete("The engine's answer has no usage: the capture cannot be read.")
        n_rows = max(0, usage["prompt_tokens"] + usage["completion_tokens"] - 1)
        size = 2 * len(self.payload.capture_layers) * n_rows * self.hidden
        try:
            if size <= _INLINE_BYTES:
                return self._collect(n_rows)
            return await asyncio.to_thread(self._collect, n_rows)
        except CaptureError as exc:
            logger.error("capture %s failed: %s", self.payload.capture_id, exc)
            if isinstance(exc, CaptureMissingError):
                raise CaptureRowsMissing(
                    "The engine never received this request's activation payload, so nothing "
                    "was captured or steered. Report the X-Request-Id."
                ) from None
            raise CaptureIncomplete(
                "The activation capture came back incomplete (fewer rows than the answer has "
                "tokens, or a failed hook); nothing partial is returned. Retry the request."
            ) from None

    def release(self) -> None:
        release(self.payload.capture_id, root=self.root)


def _usage_key(body: bytes) -> tuple[int, Any]:
    """Where the top-level `"usage"` key starts in vLLM's answer, and its value ((-1, None) when
    there is none). Read from the end, so a large answer (full-vocab prompt logprobs) is never
    parsed whole; inside JSON strings a quote is escaped, so only a key is followed by `:`."""
    at = len(body)
    while (at := body.rfind(_USAGE, 0, at)) >= 0:
        rest = body[at + len(_USAGE) :].lstrip()
        if rest.startswith(b":"):
            try:
                value, _ = json.JSONDecoder().raw_decode(rest[1:].decode("utf-8").lstrip())
            except ValueError:
                return -1, None
            return at, value
    return -1, None


def _with_activations(body: bytes, at: int, activations: dict[str, Any]) -> bytes:
    # Spliced in before `usage`, which usage metering reads from the last bytes of the answer.
    encoded = json.dumps(activations, separators=(",", ":")).encode()
    return body[:at] + b'"activations":' + encoded + b"," + body[at:]


def _upstream_headers(start: Message | None, error: AcsError) -> AcsError:
    for key, value in (start or {}).get("headers", ()):
        if (
            key.lower().startswith(b"x-acs-upstream-")
            and key.lower() != b"x-acs-upstream-error-kind"
        ):
            error.headers.setdefault(key.lower().decode("latin-1"), value.decode("latin-1"))
    return error


class _BodyResponder:
    """Non-stream: holds vLLM's 200 answer whole, then sends it with `activations` (or a 502)."""

    def __init__(self, scope: Scope, send: Send, capture: Capture) -> None:
        self.scope, self.send_downstream, self.capture = scope, send, capture
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.passthrough = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.passthrough = message["status"] != 200
            if self.passthrough:
                await self.send_downstream(message)
            else:
                self.start = message
            return
        if message["type"] != "http.response.body" or self.passthrough:
            await self.send_downstream(message)
            return
        self.chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            await self._finish(b"".join(self.chunks))

    async def _finish(self, body: bytes) -> None:
        at, usage = _usage_key(body)
        try:
            if at < 0:
                raise CaptureIncomplete("The engine's answer has no usage: the capture is unread.")
            activations = await self.capture.collect(usage)
        except AcsError as error:
            self.capture.release()
            await send_error(self.scope, self.send_downstream, _upstream_headers(self.start, error))
            return
        self.capture.release()
        if activations is not None:
            body = await asyncio.to_thread(_with_activations, body, at, activations)
        assert self.start is not None
        headers = [
            (k, v) for k, v in self.start.get("headers", ()) if k.lower() != b"content-length"
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send_downstream({**self.start, "headers": headers})
        await self.send_downstream({"type": "http.response.body", "body": body})


class _StreamResponder:
    """Stream: passes chunks on, holds the usage chunk, and puts the activations chunk (or an SSE
    error frame that ends the stream) in front of it and `data: [DONE]`."""

    def __init__(self, scope: Scope, send: Send, capture: Capture) -> None:
        self.scope, self.send_downstream, self.capture = scope, send, capture
        self.passthrough = False
        self.events = SseEventBuffer()
        self.head: dict[str, Any] = {}
        self.usage_event: bytes | None = None
        self.usage: Any = None
        self.closed = False  # read, failed, or the engine failed: nothing more is added
        self.failed = False  # our error frame went out: the rest of the stream is dropped

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.passthrough = message["status"] != 200
            await self.send_downstream(message)
            return
        if message["type"] != "http.response.body" or self.passthrough:
            await self.send_downstream(message)
            return
        more = message.get("more_body", False)
        out: list[bytes] = []
        for event in self.events.feed(message.get("body", b""), more):
            out.extend(await self._event(event.strip()))
        if not more and not self.closed:
            out.extend(await self._close(done=False))  # the engine ended without [DONE]
        await self.send_downstream({**message, "body": b"".join(out), "more_body": more})

    async def _event(self, event: bytes) -> list[bytes]:
        if self.failed:
            return []
        if self.closed:
            return [event + _SEP]
        if event == _DONE:
            return await self._close(done=True)
        chunk = _json_data(event)
        if isinstance(chunk.get("error"), dict):
            # The engine's own error: ErrorEnvelope rewrites it and ends the stream.
            self.closed = True
            self.capture.release()
            return [event + _SEP]
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if chunk.get("choices") == [] and chunk.get("usage") is not None:
            self.usage_event, self.usage = event + _SEP, chunk["usage"]
            return []
        return [event + _SEP]

    async def _close(self, *, done: bool) -> list[bytes]:
        self.closed = True
        try:
            activations = await self.capture.collect(self.usage)
        except AcsError as error:
            self.failed = True
            return [sse_error_frame(self.scope, error)]
        finally:
            self.capture.release()
        out: list[bytes] = []
        if activations is not None:
            # Key order and separators matter: response_usage.py spots this chunk by them.
            chunk = {
                **self.head,
                "object": "text_completion",
                "choices": [],
                "activations": activations,
            }
            # Megabytes: serialised, encoded and framed off the event loop.
            out.append(await asyncio.to_thread(_sse_frame, chunk))
        if self.usage_event is not None:
            out.append(self.usage_event)
        if done:
            out.append(_DONE + _SEP)
        return out


def _sse_frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + _SEP


def _json_data(event: bytes) -> dict[str, Any]:
    if not event.startswith(b"data:"):
        return {}
    try:
        chunk = json.loads(event[5:])
    except ValueError:
        return {}
    return chunk if isinstance(chunk, dict) else {}


class ActivationResponseMiddleware:
    def __init__(self, app: ASGIApp, capture_dir: Path | None = None) -> None:
        self.app = app
        self.root = capture_root(capture_dir)
        self._last_sweep = 0.0
        self._sweeps: set[asyncio.Task[int]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        validated = scope.get("state", {}).get(VALIDATED_COMPLETION_KEY)
        payload = validated.activations if isinstance(validated, ValidatedCompletion) else None
        if scope["type"] != "http" or payload is None:
            await self.app(scope, receive, send)
            return
        self._maybe_sweep()
        if payload.captures:
            ACTIVATION_REQUESTS.labels(kind="capture").inc()
        if payload.steering:
            ACTIVATION_REQUESTS.labels(kind="steering").inc()
        capture = Capture(payload, validated.model.hidden_size, self.root)
        kind = _StreamResponder if validated.stream else _BodyResponder
        responder = kind(scope, send, capture)
        try:
            await self.app(scope, receive, responder.send)
        finally:
            capture.release()

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_EVERY_S:
            return
        self._last_sweep = now
        task = asyncio.create_task(
            asyncio.to_thread(sweep, root=self.root, older_than_s=SWEEP_OLDER_THAN_S)
        )
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)
